"""Small traces in the torch profiler's Chrome/Kineto format, for the kernel-evidence tests.

Two kinds:

- `KinetoTrace`: hand-made traces with the events a CUDA (or ROCm) profile has: host step
  spans (`user_annotation`), operators (`cpu_op`), launch calls (`cuda_runtime`, with the
  `correlation` id the device event carries) and device events (`kernel`, `gpu_memcpy`,
  `gpu_memset` on pid 0). Any thread of the process can launch, as autograd's device threads
  and the NCCL / c10d thread do in training traces.
- `relabel`: a real CPU torch trace (tests/fixtures/traces/torch_cpu, made by
  experiments/make_torch_traces.py) with a device event added for each leaf compute operator
  (same start and duration, named after the operator, as devices that name their kernels after
  ATen ops do), launched from the operator's thread, and the backward's operators moved to a
  second thread of the process (where autograd's device thread runs them on a GPU).
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

TORCH_CPU = Path(__file__).parent / "fixtures" / "traces" / "torch_cpu"
PID, MAIN, DEVICE_PID, STREAM = 4242, 4242, 0, 7
BACKWARD_TID = 9999  # the relabelled traces' autograd thread


class KinetoTrace:
    """Build a trace event by event; `write` stores it gzip-compressed as the profiler does."""

    def __init__(self, pid: int = PID, launch: str = "cudaLaunchKernel") -> None:
        self.pid, self.launch_name = pid, launch
        self.events: list[dict[str, Any]] = []
        self._corr = 1

    def step(self, name: str, ts: float, dur: float, tid: int = MAIN) -> KinetoTrace:
        self.events.append({"ph": "X", "cat": "user_annotation", "name": name, "pid": self.pid,
                            "tid": tid, "ts": ts, "dur": dur, "args": {}})
        return self

    def op(self, name: str, ts: float, dur: float, tid: int = MAIN) -> KinetoTrace:
        self.events.append({"ph": "X", "cat": "cpu_op", "name": name, "pid": self.pid,
                            "tid": tid, "ts": ts, "dur": dur, "args": {}})
        return self

    def kernel(self, name: str, launch_ts: float, dur_us: float, tid: int = MAIN,
               cat: str = "kernel", stream: int = STREAM) -> KinetoTrace:
        """A launch at `launch_ts` on thread `tid`, its device event 5 us later."""
        corr = self._corr
        self._corr += 1
        self.events.append({"ph": "X", "cat": "cuda_runtime", "name": self.launch_name,
                            "pid": self.pid, "tid": tid, "ts": launch_ts, "dur": 3,
                            "args": {"correlation": corr}})
        self.events.append({"ph": "X", "cat": cat, "name": name, "pid": DEVICE_PID,
                            "tid": stream, "ts": launch_ts + 5, "dur": dur_us,
                            "args": {"correlation": corr, "device": 0, "stream": stream}})
        return self

    def doc(self) -> dict[str, Any]:
        return {"schemaVersion": 1, "deviceProperties": [], "traceEvents": self.events}

    def write(self, path: Path) -> Path:
        path.write_bytes(gzip.compress(json.dumps(self.doc()).encode(), mtime=0))
        return path


# Operators that only describe a tensor (views, allocation, dtype queries): no device work.
_METADATA_OP = re.compile(
    r"^aten::(?:view|_unsafe_view|as_strided|empty\w*|t|transpose|reshape|expand|detach|"
    r"resolve_conj|resolve_neg|result_type|alias|unsqueeze|squeeze|permute|select|slice|"
    r"to|_to_copy|lift_fresh|zeros|ones_like|empty_like|zero_)$|^detach$")


def torch_cpu(side: str, i: int) -> dict[str, Any]:
    """One of the real CPU torch traces (`fast` or `slow`, restart `i`), decoded."""
    return json.loads(gzip.decompress((TORCH_CPU / f"{side}-{i}.trace.json.gz").read_bytes()))


def relabel(doc: dict[str, Any]) -> dict[str, Any]:
    """The trace with a device event per leaf compute operator and the backward's operators on
    a second thread (see the module docstring)."""
    events = [dict(e) for e in doc["traceEvents"]]
    ops = [e for e in events if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    backward = [(e["ts"], e["ts"] + e["dur"]) for e in ops
                if str(e["name"]).startswith("autograd::engine::evaluate_function")]
    for e in ops:
        if any(s <= e["ts"] <= end for s, end in backward):
            e["tid"] = BACKWARD_TID
    compute = [e for e in ops if not _METADATA_OP.match(str(e["name"]))
               and not str(e["name"]).startswith("autograd::")]
    corr = 10_000
    out = list(events)
    for e in compute:
        start, end = e["ts"], e["ts"] + e["dur"]
        nested = any(o is not e and o["tid"] == e["tid"] and start <= o["ts"]
                     and o["ts"] + o["dur"] <= end for o in compute)
        if nested:
            continue
        corr += 1
        out.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                    "pid": e["pid"], "tid": e["tid"], "ts": start, "dur": 0.5,
                    "args": {"correlation": corr}})
        out.append({"ph": "X", "cat": "kernel", "name": e["name"], "pid": DEVICE_PID,
                    "tid": STREAM, "ts": start, "dur": e["dur"],
                    "args": {"correlation": corr, "device": 0, "stream": STREAM}})
    return {**doc, "traceEvents": out}


def write_doc(doc: dict[str, Any], path: Path) -> Path:
    path.write_bytes(gzip.compress(json.dumps(doc).encode(), mtime=0))
    return path
