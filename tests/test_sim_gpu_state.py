"""The GPU state file shared by the sim server and the sim GPU backend."""

from __future__ import annotations

import json

import pytest

from orchestrator.targets.sim import gpu_state
from orchestrator.targets.sim.gpu_state import GpuProcess, GpuStateError

GPU_KEYS = {
    "index", "name", "uuid", "memory_total_mib", "sm_clock_max_mhz", "sm_clock_locked_mhz",
    "mem_clock_mhz", "mem_clock_locked_mhz", "applications_clock_sm_mhz", "power_limit_w", "power_limit_default_w", "power_limit_max_w",
    "temperature_c", "persistence_mode", "pcie_gen", "pcie_gen_max", "pcie_width",
    "pcie_width_max", "ecc_errors", "processes",
}  # fmt: skip


def test_default_state_has_the_documented_layout(tmp_path):
    path = tmp_path / "gpu.json"
    gpu_state.save(path, gpu_state.default_state())
    doc = json.loads(path.read_text())
    assert doc["driver_version"] == "590.48.01"
    assert doc["cuda_driver_version"] == 13010
    assert doc["nccl_version"] == "2.27.3"
    assert len(doc["gpus"]) == 8
    for i, gpu in enumerate(doc["gpus"]):
        assert set(gpu) == GPU_KEYS
        assert gpu["index"] == i
        assert gpu["name"] == "NVIDIA RTX PRO 6000 Blackwell Server Edition"
        assert gpu["uuid"].startswith("GPU-") and len(gpu["uuid"]) == 40
        assert gpu["sm_clock_locked_mhz"] is None and gpu["processes"] == []
    assert len({g["uuid"] for g in doc["gpus"]}) == 8
    assert len(gpu_state.default_state(2).gpus) == 2


def test_round_trip_keeps_changes_and_unknown_keys(tmp_path):
    path = tmp_path / "state" / "gpu.json"
    state = gpu_state.default_state().with_gpu(
        3, sm_clock_locked_mhz=1458, processes=(GpuProcess(77, "python3", 2048),)
    )
    gpu_state.save(path, state)
    doc = json.loads(path.read_text())
    doc["telemetry_tick"] = 12
    doc["gpus"][0]["utilization_gpu"] = 97
    path.write_text(json.dumps(doc))
    loaded = gpu_state.load(path)
    assert loaded == state
    assert loaded.gpu(3).sm_clock_locked_mhz == 1458
    assert loaded.gpu(3).processes == (GpuProcess(77, "python3", 2048),)
    gpu_state.save(path, loaded)
    again = json.loads(path.read_text())
    assert again["telemetry_tick"] == 12 and again["gpus"][0]["utilization_gpu"] == 97
    assert [p.name for p in path.parent.iterdir()] == ["gpu.json"]  # no temp file left behind


def test_cuda_driver_version_accepts_strings():
    doc = gpu_state.to_dict(gpu_state.default_state(1))
    doc["cuda_driver_version"] = "13.1"
    assert gpu_state.from_dict(doc).cuda_driver_version == 13010
    doc["cuda_driver_version"] = "12.8"
    assert gpu_state.from_dict(doc).cuda_driver_version == 12080


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.update(gpus=[]),
        lambda d: d["gpus"][0].update(sm_clock_max_mhz="fast"),
        lambda d: d["gpus"][0].update(persistence_mode="yes"),
        lambda d: d["gpus"][0].pop("index"),
        lambda d: d["gpus"][0].update(processes=[{"pid": 1}]),
        lambda d: d.update(cuda_driver_version="latest"),
    ],
)
def test_bad_state_is_rejected(mutate):
    doc = gpu_state.to_dict(gpu_state.default_state(1))
    mutate(doc)
    with pytest.raises(GpuStateError):
        gpu_state.from_dict(doc)


def test_load_reports_malformed_json(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text("{not json")
    with pytest.raises(GpuStateError):
        gpu_state.load(path)
