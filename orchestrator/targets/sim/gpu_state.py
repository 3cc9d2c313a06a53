"""The simulated node's GPU state: one JSON file shared by the sim server and the sim GPU backend.

The server reads it at start (and again whenever the file changes) to decide clocks, power
throttling, contention and NCCL version; a pynvml-shaped backend reads and writes the same file
to lock clocks, change power limits or plant a stray process. Keeping the schema in one module
means both sides agree on field names, and `save` is atomic so a reader never sees half a file.

Layout (JSON):
    {"driver_version": "590.48.01", "cuda_driver_version": 13010, "nccl_version": "2.27.3",
     "gpus": [{"index": 0, "name": ..., "uuid": ..., "memory_total_mib": ...,
               "sm_clock_max_mhz": ..., "sm_clock_locked_mhz": null, "mem_clock_mhz": ...,
               "mem_clock_locked_mhz": null, "applications_clock_sm_mhz": null,
               "power_limit_w": ..., "power_limit_default_w": ..., "power_limit_max_w": ...,
               "temperature_c": ..., "persistence_mode": true, "pcie_gen": 5,
               "pcie_gen_max": 5, "pcie_width": 16, "pcie_width_max": 16, "ecc_errors": 0,
               "processes": [{"pid": ..., "name": ..., "used_memory_mib": ...}]}]}

Keys this module does not know are kept in `extra` and written back unchanged, so a backend can
store more telemetry without this schema having to grow first. `cuda_driver_version` is an int
as NVML reports it (13010 = CUDA 13.1); a string such as "13.1" is accepted and converted.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

GPU_NAME = "NVIDIA RTX PRO 6000 Blackwell Server Edition"
DEFAULT_DRIVER_VERSION = "590.48.01"
DEFAULT_CUDA_DRIVER_VERSION = 13010
DEFAULT_NCCL_VERSION = "2.27.3"
DEFAULT_SM_CLOCK_MAX_MHZ = 2430
DEFAULT_MEM_CLOCK_MHZ = 14001
DEFAULT_POWER_LIMIT_W = 600
DEFAULT_MEMORY_TOTAL_MIB = 97887


class GpuStateError(ValueError):
    """The GPU state file is missing a field or holds a value of the wrong type."""


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    name: str
    used_memory_mib: int


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str = GPU_NAME
    uuid: str = ""
    memory_total_mib: int = DEFAULT_MEMORY_TOTAL_MIB
    sm_clock_max_mhz: int = DEFAULT_SM_CLOCK_MAX_MHZ
    sm_clock_locked_mhz: int | None = None
    mem_clock_mhz: int = DEFAULT_MEM_CLOCK_MHZ
    mem_clock_locked_mhz: int | None = None  # None: memory clocks not locked
    applications_clock_sm_mhz: int | None = None  # None: the default (the maximum SM clock)
    power_limit_w: float = DEFAULT_POWER_LIMIT_W
    power_limit_default_w: float = DEFAULT_POWER_LIMIT_W
    power_limit_max_w: float = DEFAULT_POWER_LIMIT_W
    temperature_c: float = 35
    persistence_mode: bool = True
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    ecc_errors: int = 0
    processes: tuple[GpuProcess, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)


@dataclass(frozen=True)
class GpuState:
    gpus: tuple[GpuInfo, ...]
    driver_version: str = DEFAULT_DRIVER_VERSION
    cuda_driver_version: int = DEFAULT_CUDA_DRIVER_VERSION
    nccl_version: str = DEFAULT_NCCL_VERSION
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def gpu(self, index: int) -> GpuInfo:
        for g in self.gpus:
            if g.index == index:
                return g
        raise KeyError(index)

    def with_gpu(self, index: int, **changes: Any) -> GpuState:
        """A copy with one GPU's fields replaced (e.g. `sm_clock_locked_mhz=1458`)."""
        if index not in {g.index for g in self.gpus}:
            raise KeyError(index)
        gpus = tuple(replace(g, **changes) if g.index == index else g for g in self.gpus)
        return replace(self, gpus=gpus)

    def with_all_gpus(self, **changes: Any) -> GpuState:
        return replace(self, gpus=tuple(replace(g, **changes) for g in self.gpus))


def gpu_uuid(index: int) -> str:
    """A stable, realistic-looking UUID per GPU index (NVML prints them with a GPU- prefix)."""
    h = hashlib.sha1(f"sleuth-sim-gpu-{index}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def default_state(n_gpus: int = 8) -> GpuState:
    """A healthy 8x RTX PRO 6000 Blackwell PCIe node at stock clocks and power limits."""
    gpus = tuple(
        GpuInfo(index=i, uuid=gpu_uuid(i), temperature_c=34 + i % 3) for i in range(n_gpus)
    )
    return GpuState(gpus=gpus)


def parse_cuda_driver_version(value: object) -> int:
    """NVML's int form (13010); "13.1" -> 13010, "12.8" -> 12080."""
    if isinstance(value, bool):
        raise GpuStateError(f"cuda_driver_version must be an int, got {value!r}")
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        parts = text.split(".")
        if len(parts) == 2 and all(p.isdigit() for p in parts):
            return int(parts[0]) * 1000 + int(parts[1]) * 10
    raise GpuStateError(f"cuda_driver_version must be an int such as 13010, got {value!r}")


_GPU_FIELDS = {f.name: f for f in fields(GpuInfo) if f.name not in ("processes", "extra")}
_INT_FIELDS = {
    "index", "memory_total_mib", "sm_clock_max_mhz", "mem_clock_mhz", "pcie_gen", "pcie_gen_max",
    "pcie_width", "pcie_width_max", "ecc_errors",
}  # fmt: skip
_OPTIONAL_INT_FIELDS = {"sm_clock_locked_mhz", "mem_clock_locked_mhz", "applications_clock_sm_mhz"}
_FLOAT_FIELDS = {"power_limit_w", "power_limit_default_w", "power_limit_max_w", "temperature_c"}


def _typed(key: str, value: object) -> object:
    if key in _INT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise GpuStateError(f"gpu field {key!r} must be an integer, got {value!r}")
        return int(value)
    if key in _FLOAT_FIELDS:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise GpuStateError(f"gpu field {key!r} must be a number, got {value!r}")
        return value
    if key in _OPTIONAL_INT_FIELDS:
        if value is None:
            return None
        return _typed("sm_clock_max_mhz", value)
    if key == "persistence_mode":
        if not isinstance(value, bool):
            raise GpuStateError(f"gpu field 'persistence_mode' must be true/false, got {value!r}")
        return value
    if not isinstance(value, str):
        raise GpuStateError(f"gpu field {key!r} must be a string, got {value!r}")
    return value


def _gpu_from_dict(doc: Mapping[str, Any]) -> GpuInfo:
    if not isinstance(doc, Mapping) or "index" not in doc:
        raise GpuStateError(f"each gpu needs an 'index': {doc!r}")
    kwargs: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _GPU_FIELDS:
            kwargs[key] = _typed(key, value)
        elif key != "processes":
            extra[key] = value
    procs = []
    for p in doc.get("processes") or []:
        try:
            procs.append(
                GpuProcess(int(p["pid"]), str(p.get("name", "")), int(p["used_memory_mib"]))
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GpuStateError(f"bad process entry {p!r}: {exc}") from exc
    kwargs.setdefault("uuid", gpu_uuid(int(kwargs["index"])))
    return GpuInfo(**kwargs, processes=tuple(procs), extra=extra)


def from_dict(doc: Mapping[str, Any]) -> GpuState:
    if not isinstance(doc, Mapping):
        raise GpuStateError("GPU state must be a JSON object")
    gpus = doc.get("gpus")
    if not isinstance(gpus, list) or not gpus:
        raise GpuStateError("GPU state needs a non-empty 'gpus' list")
    known = {"gpus", "driver_version", "cuda_driver_version", "nccl_version"}
    return GpuState(
        gpus=tuple(_gpu_from_dict(g) for g in gpus),
        driver_version=str(doc.get("driver_version", DEFAULT_DRIVER_VERSION)),
        cuda_driver_version=parse_cuda_driver_version(
            doc.get("cuda_driver_version", DEFAULT_CUDA_DRIVER_VERSION)
        ),
        nccl_version=str(doc.get("nccl_version", DEFAULT_NCCL_VERSION)),
        extra={k: v for k, v in doc.items() if k not in known},
    )


def to_dict(state: GpuState) -> dict[str, Any]:
    gpus = []
    for g in state.gpus:
        d: dict[str, Any] = {name: getattr(g, name) for name in _GPU_FIELDS}
        d["processes"] = [
            {"pid": p.pid, "name": p.name, "used_memory_mib": p.used_memory_mib}
            for p in g.processes
        ]
        d.update(g.extra)
        gpus.append(d)
    return {
        "driver_version": state.driver_version,
        "cuda_driver_version": state.cuda_driver_version,
        "nccl_version": state.nccl_version,
        **state.extra,
        "gpus": gpus,
    }


def load(path: str | os.PathLike[str]) -> GpuState:
    """Read a state file. Raises GpuStateError (bad content) or OSError (unreadable)."""
    text = Path(path).read_text()
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise GpuStateError(f"{path}: not valid JSON: {exc}") from exc
    return from_dict(doc)


def save(path: str | os.PathLike[str], state: GpuState) -> None:
    """Write atomically (temp file in the same directory, then rename over the target)."""
    from orchestrator.util.files import write_atomic  # the server's start-up path never saves

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(target, json.dumps(to_dict(state), indent=2) + "\n")
