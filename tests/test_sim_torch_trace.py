"""The sim server's `/start_profile` and `/stop_profile`: a real server process on loopback,
checked against the surfaces saved from SGLang 0.5.23 (tests/fixtures/sglang_0_5_23/
profile_surface.json) and read back with the same reader a real trace goes through."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from orchestrator.evidence.families import family
from orchestrator.evidence.trace import read_profile
from tests.sim_client import run_sim

SURFACE = json.loads((Path(__file__).parent / "fixtures" / "sglang_0_5_23" /
                      "profile_surface.json").read_text())
ARGS = ["--tp-size", "8", "--sim-time-scale", "0.02", "--sim-load-seconds", "1",
        "--sim-noise-restart-cv", "0.02", "--sim-noise-request-cv", "0.01",
        "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
        "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]  # fmt: skip
REQUEST = {"input_ids": list(range(50, 114)),
           "sampling_params": {"max_new_tokens": 48, "ignore_eos": True}}  # fmt: skip


def _post(sim, path: str, body: dict | None = None) -> tuple[int, str]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(sim.base_url + path, data=data, method="POST",
                                 headers={"content-type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_profile_endpoints_write_a_trace_like_sglang(tmp_path):
    out = tmp_path / "traces"
    env = {**os.environ, "SGLANG_TORCH_PROFILER_DIR": str(tmp_path / "default")}
    routes = SURFACE["routes"]
    with run_sim(ARGS, cwd=tmp_path, log_path=tmp_path / "s.log", env=env) as sim:
        assert _post(sim, "/stop_profile")[0] == 500  # nothing runs
        body = {"output_dir": str(out), "activities": ["CPU", "GPU"], "profile_id": "p1",
                "with_stack": False, "record_shapes": False}
        assert _post(sim, "/start_profile", body) == (200, routes["/start_profile"]["response"]["content"])
        code, text = _post(sim, "/start_profile", body)
        assert code == 500 and "already in progress" in text
        sim.post_json("/generate", REQUEST)
        assert _post(sim, "/stop_profile") == (200, routes["/stop_profile"]["response"]["content"])
        # the default directory comes from SGLANG_TORCH_PROFILER_DIR; num_steps stops by itself
        assert _post(sim, "/start_profile", {"num_steps": 3, "profile_prefix": "pre"})[0] == 200
        sim.post_json("/generate", REQUEST)
        assert _post(sim, "/stop_profile")[0] == 500
        assert _post(sim, "/start_profile", {"no_such_field": 1})[0] == 500
    files = sorted(p.name for p in out.iterdir())
    assert files == ["p1-TP-0.trace.json.gz"]  # SGLang's name: {profile_id}-TP-{rank}.trace.json.gz
    default = [p.name for p in (tmp_path / "default").iterdir()]
    assert len(default) == 1 and default[0].startswith("pre-") and default[0].endswith("-TP-0.trace.json.gz")
    prof = read_profile((out / "p1-TP-0.trace.json.gz").read_bytes())
    assert prof.passes["extend"] == 1 and prof.passes["target_verify"] >= 10
    assert prof.passes["draft"] == 1 + 3 * prof.passes["target_verify"]  # prefill + 2 steps + extend
    verify = prof.per_pass("target_verify")
    fams = {family(k) for k in verify}
    assert fams == {"attention", "gemm", "allreduce", "norm", "other"}
    # the kernels are the model's verify pass (19 ms at the default state, a few ms of it host gap)
    assert 12.0 < prof.pass_ms("target_verify") < 19.5
    short = read_profile(next((tmp_path / "default").iterdir()).read_bytes())
    assert sum(short.passes.values()) <= 3 * 4  # three batches at most: a prefill or a cycle


@pytest.mark.parametrize("activities", [["GPU"], ["CPU"]])
def test_activities_choose_what_the_trace_holds(tmp_path, activities):
    with run_sim(ARGS, cwd=tmp_path, log_path=tmp_path / "s.log") as sim:
        assert _post(sim, "/start_profile", {"output_dir": str(tmp_path), "profile_id": "a",
                                             "activities": activities})[0] == 200
        sim.post_json("/generate", REQUEST)
        assert _post(sim, "/stop_profile")[0] == 200
    prof = read_profile((tmp_path / "a-TP-0.trace.json.gz").read_bytes())
    assert bool(prof.kernel_ms) == ("GPU" in activities)
