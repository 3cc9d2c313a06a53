"""The device check's stand-in server step: restarts of experiments/gpu_standin.py on the GPU,
each a whole trial of sleuth's trial runner measured through its SGLang adapter.

The adapter (`targets.sglang.SglangTarget`) is used as it is, with one change: its server
module (`python -m sglang.launch_server`) is the stand-in script. So the launch argv carries
SGLang's flags, readiness is `/health_generate`, each repetition flushes the cache, sends the
seeded request set through the built-in streaming client, and reads `/metrics` deltas and the
decode-log lines (`bench.server_measure`), and the trial takes NVML telemetry and a
fingerprint like any real one. The stand-in has no speculative decoding and no CUDA graphs,
so what it can show is the plain path: TTFT (prefill / extend), ITL and TPOT, decode_ms per
decode pass from the per-phase counters, output throughput.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from experiments.gpu_steps import Step
from orchestrator.records import Candidate, Outcome
from orchestrator.runner.trial import TrialSpec, run_trial
from orchestrator.targets.base import NodeContext
from orchestrator.targets.sglang import SglangTarget

STANDIN = Path(__file__).resolve().parent / "gpu_standin.py"
RESTARTS = 2
BENCH = {"requests": 8, "concurrency": 4, "input_len": 256, "output_len": 64, "seed": 0,
         "request_timeout_s": 60.0}
REPORTED = ("output_throughput", "ttft_ms_p50", "itl_ms_p50", "tpot_ms_p50", "decode_ms",
            "cuda_graph_share")


class StandinTarget(SglangTarget):
    """SGLang's adapter, launching the stand-in instead of `sglang.launch_server`."""

    def module_argv(self) -> list[str]:
        return [self.python, str(STANDIN)]


class Scratch:
    """The trial runner's workspace surface over one empty directory: the stand-in is not a
    repository's code, and this step must not need git."""

    def __init__(self, path: Path):
        self.path = path

    @contextlib.contextmanager
    def lease(self, sha: str, patches=()) -> Iterator[Path]:
        self.path.mkdir(parents=True, exist_ok=True)
        yield self.path

    def worktree_diff_hash(self, path) -> str | None:
        return None


def _max_utilization(trial_dir: Path) -> float | None:
    """The busiest GPU sample of a trial (`telemetry.json`, written by the trial runner)."""
    try:
        samples = json.loads((trial_dir / "telemetry.json").read_text()).get("samples") or []
    except (OSError, ValueError):
        return None
    values = [s.get("utilization_pct") for s in samples if s.get("utilization_pct") is not None]
    return max(values) if values else None


def target_conf(torch_python: str, gpu: int) -> dict:
    return {"name": "sglang", "python": torch_python, "model_path": "standin/random-tiny",
            "sglang_version": "0.5.23", "check_flags": False, "decode_log_interval": 8,
            "env": {"CUDA_VISIBLE_DEVICES": str(gpu)}, "extra_args": ["--standin-layers", "8"],
            "pythonpath": []}  # the stand-in is no repository's code: nothing of it on the path


def run(torch_python: str, gpu: int, work: Path, restarts: int = RESTARTS,
        conf: dict | None = None, out_dir: Path | None = None) -> Step:
    t0 = time.monotonic()
    state = work / "standin-node"
    target = StandinTarget(conf or target_conf(torch_python, gpu), BENCH,
                           NodeContext("standin", state))
    scratch = Scratch(work / "standin-cwd")
    trials = []
    for i in range(restarts):
        spec = TrialSpec(trial_id=i + 1, candidate=Candidate.make("standin", [], {}, "default"),
                         repo=str(scratch.path), cache_dir=str(work / "cache"),
                         trial_dir=str(work / "standin-trials" / str(i + 1)),
                         ready_timeout_s=180.0, repetitions=3, warmup_requests=2)
        result, _ = run_trial(spec, target, node="standin", workspace=lambda _s: scratch)
        reps = [m.metrics for m in result.measurements]
        telemetry = dict((result.fingerprint or {}).get("telemetry") or {})
        telemetry["utilization_pct_max"] = _max_utilization(Path(spec.trial_dir))
        trials.append({"outcome": result.outcome.value, "detail": result.detail,
                       "suspect": result.suspect_reason, "seconds": result.ended_at - result.started_at,
                       "metrics": {k: [r.get(k) for r in reps] for k in REPORTED},
                       "telemetry": telemetry, "log_tail": result.log_tail[-1500:]
                       if result.outcome is not Outcome.OK else ""})
        if result.outcome is not Outcome.OK:
            break
    took = time.monotonic() - t0
    if out_dir is not None:  # server logs, telemetry, measurement sources of each restart
        shutil.copytree(work / "standin-trials", out_dir / "standin", dirs_exist_ok=True)
    ok_trials = [t for t in trials if t["outcome"] == "ok"]
    if len(ok_trials) < restarts:
        bad = trials[-1]
        return Step("standin server", "FAIL", f"restart {len(trials)}: {bad['outcome']}:"
                    f" {bad['detail'][:300]}", took, {"trials": trials})
    missing = [k for k in ("output_throughput", "ttft_ms_p50", "itl_ms_p50", "decode_ms")
               if any(v is None for t in ok_trials for v in t["metrics"][k])]
    first = ok_trials[0]["metrics"]
    util = [t["telemetry"]["utilization_pct_max"] for t in ok_trials]
    detail = ", ".join(f"{k} {first[k][0]:.3g}" for k in REPORTED if first[k][0] is not None)
    return Step("standin server", "FAIL" if missing else "ok",
                f"{restarts} restarts ok; restart 1: {detail}; GPU utilization max {util}"
                + (f"; missing {missing}" if missing else ""), took, {"trials": trials})
