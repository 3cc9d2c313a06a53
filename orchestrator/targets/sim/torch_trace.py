"""The simulated node's torch profiler: `/start_profile` and `/stop_profile` as SGLang 0.5.23 has them.

SGLang (`scheduler_components/profiler_manager.py`) starts a torch profiler on the scheduler,
and on stop writes `{profile_prefix-}{profile_id}-TP-{rank}.trace.json.gz` to `output_dir`
(default `SGLANG_TORCH_PROFILER_DIR`, else /tmp) with `export_chrome_trace`. With `num_steps`
(and no stage split) it stops by itself after that many forward batches, and a later
`/stop_profile` fails because nothing runs. This class does the same for the sim's passes, with
the kernels of `kernels.pass_kernels` and SGLang's step spans (`step[VERIFY bs=..]`, ...), so a
trace from the sim reads exactly like one from the real server (tests/fixtures/sglang_0_5_23/
profile_surface.json). Differences, kept on purpose: one trace file (rank 0; the sim is one
process and all its ranks would be identical), and no stage-split capture (`profile_by_stage`
is refused with a clear message rather than half-imitated).

Noise, so the statistics downstream are tested on something realistic: each pass's kernels
carry that pass's noise factor (the scheduler's, restart level included), times a per-restart
factor per kernel family (NCCL rings and clocks settle differently at each start; all-reduce
varies most) and a small per-kernel jitter. These draws come from a generator of their own, so
profiling never changes the seeded metric stream of a server.
"""

from __future__ import annotations

import gzip
import json
import os
import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.targets.sim import model
from orchestrator.targets.sim.kernels import pass_kernels
from orchestrator.targets.sim.noise import lognormal_factor

DEVICE_PID, STREAM = 0, 7
MAX_PASSES = 4000  # a forgotten /stop_profile must not grow the server without bound
FAMILY_RESTART_CV = {"attention": 0.01, "gemm": 0.01, "allreduce": 0.04, "other": 0.02}
KERNEL_JITTER_CV = 0.01
ACTIVITIES = ("CPU", "GPU", "MEM", "RPD", "CUDA_PROFILER")
REQUEST_FIELDS = ("output_dir", "start_step", "num_steps", "activities", "profile_by_stage",
                  "with_stack", "record_shapes", "profile_id", "merge_profiles",
                  "profile_prefix", "profile_stages", "detailed_annotations")  # fmt: skip


class ProfileRequestError(RuntimeError):
    """What SGLang's tokenizer manager raises on a failed profile request (HTTP 500)."""


def _family(name: str) -> str:
    from orchestrator.evidence.families import family  # the documented patterns, one copy

    return family(name)


def _families() -> tuple[str, ...]:
    from orchestrator.evidence.families import FAMILIES

    return FAMILIES


class SimProfiler:
    def __init__(self, seed: int, env: Mapping[str, str], host_pid: int | None = None):
        self.rng = random.Random(seed ^ 0x7072_6F66)
        self.family_factor = {f: lognormal_factor(self.rng, cv)
                              for f, cv in FAMILY_RESTART_CV.items()}  # fmt: skip
        # the families the sim's names never fall in share `other`'s factor (no extra draws:
        # a seeded profile stays what it was)
        self.family_factor.update({f: self.family_factor["other"] for f in _families()
                                   if f not in self.family_factor})
        self.default_dir = env.get("SGLANG_TORCH_PROFILER_DIR", "/tmp")
        self.host_pid = host_pid if host_pid is not None else os.getpid()
        self.lock = threading.Lock()
        self.active = False
        self._req: dict[str, Any] = {}
        self._events: list[dict[str, Any]] = []
        self._batches = 0
        self._passes = 0
        self._corr = 1000
        self.written: list[str] = []

    # -- HTTP side -----------------------------------------------------------------------------
    def start(self, body: Mapping[str, Any]) -> None:
        unknown = sorted(set(body) - set(REQUEST_FIELDS) - {"req_type", "rid"})
        if unknown:
            raise ProfileRequestError(f"unexpected profile request field(s): {', '.join(unknown)}")
        if body.get("profile_by_stage") or body.get("start_step"):
            raise ProfileRequestError("the simulated node profiles from now on only "
                                      "(profile_by_stage and start_step are not imitated)")
        activities = body.get("activities") or ["CPU", "GPU"]
        if not isinstance(activities, list) or any(a not in ACTIVITIES for a in activities):
            raise ProfileRequestError(f"activities must be a list of {', '.join(ACTIVITIES)}")
        with self.lock:
            if self.active:
                raise ProfileRequestError(
                    "Profiling is already in progress. Call /stop_profile first.")
            self._req = {
                "output_dir": body.get("output_dir") or self.default_dir,
                "num_steps": body.get("num_steps"),
                "activities": activities,
                "profile_id": body.get("profile_id") or str(time.time()),
                "profile_prefix": body.get("profile_prefix") or "",
            }
            self._events, self._batches, self._passes = [], 0, 0
            self.active = True

    def stop(self) -> str:
        with self.lock:
            if not self.active:
                raise ProfileRequestError("Profiling is not in progress. Call /start_profile first.")
            return self._finish()

    # -- scheduler side ------------------------------------------------------------------------
    def batch(self, start_s: float, passes: list[tuple[str, str, int, int, bool, float]],
              costs: model.PassCostModel) -> None:
        """One scheduler batch: (stage, phase, batch size, tokens, graph, noise factor) per pass,
        run back to back from modeled time `start_s`."""
        with self.lock:
            if not self.active:
                return
            t_us = start_s * 1e6
            for stage, phase, bs, tokens, graph, factor in passes:
                if self._passes >= MAX_PASSES:
                    break
                t_us = self._pass(t_us, stage, phase, bs, tokens, graph, factor, costs)
                self._passes += 1
            self._batches += 1
            steps = self._req.get("num_steps")
            if steps and self._batches >= int(steps):
                self._finish()

    def _pass(self, t_us: float, stage: str, phase: str, bs: int, tokens: int, graph: bool,
              factor: float, costs: model.PassCostModel) -> float:
        kernels, gap = pass_kernels(costs, phase, tokens, graph)
        name = f"step[{stage} bs={bs} toks={tokens}]" if stage == "EXTEND" else f"step[{stage} bs={bs}]"
        acts = self._req["activities"]
        gap_us = gap * factor * 1000.0 / (len(kernels) + 1)
        host_lane = {"pid": self.host_pid, "tid": self.host_pid}
        dev_lane = {"pid": DEVICE_PID, "tid": STREAM}
        k_us = t_us + gap_us
        device, host = [], []
        graph_corr = None
        if graph:
            self._corr += 1
            graph_corr = self._corr
            host.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", **host_lane,
                         "ts": round(t_us + 1.0, 3), "dur": 8.0,
                         "args": {"correlation": graph_corr}})
        for kname, ms in kernels:
            dur = ms * factor * self.family_factor[_family(kname)]
            dur *= lognormal_factor(self.rng, KERNEL_JITTER_CV)
            if graph_corr is None:
                self._corr += 1
                host.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                             **host_lane, "ts": round(max(t_us, k_us - 5.0), 3), "dur": 4.0,
                             "args": {"correlation": self._corr}})
            device.append({"ph": "X", "cat": "kernel", "name": kname, **dev_lane,
                           "ts": round(k_us, 3), "dur": round(dur * 1000.0, 3),
                           "args": {"device": DEVICE_PID, "stream": STREAM,
                                    "correlation": graph_corr or self._corr}})
            k_us += dur * 1000.0 + gap_us
        end = k_us
        span = {"ph": "X", "name": name, "ts": round(t_us, 3), "dur": round(end - t_us, 3)}
        if "CPU" in acts:
            self._events.append({**span, "cat": "user_annotation", **host_lane})
            self._events.extend(host)
        if "GPU" in acts:
            self._events.append({**span, "cat": "gpu_user_annotation", **dev_lane})
            self._events.extend(device)
        return end

    def _finish(self) -> str:
        req = self._req
        out = Path(req["output_dir"]).expanduser()
        prefix = req["profile_prefix"] + "-" if req["profile_prefix"] else ""
        path = out / f"{prefix}{req['profile_id']}-TP-0.trace.json.gz"
        doc = {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "simulated GPU"}],
               "traceEvents": self._events, "traceName": str(path), "displayTimeUnit": "ms"}
        try:
            out.mkdir(parents=True, exist_ok=True)
            path.write_bytes(gzip.compress(json.dumps(doc).encode(), compresslevel=5))
        finally:
            self.active = False
            self._events = []
        self.written.append(str(path))
        return str(path)
