"""Read one profiler trace into device time per kernel per forward mode (pure: bytes in, numbers out).

The format is the torch profiler's Chrome trace (`export_chrome_trace`), which is what SGLang's
`/start_profile` + `/stop_profile` write (`{profile_id}-TP-{rank}.trace.json.gz`) and what most
GPU benchmarks can be made to write. Only three kinds of event matter here:

- `kernel` (and `gpu_memcpy` / `gpu_memset`): device time, one event per kernel execution;
- `user_annotation`: host spans from `record_function`; SGLang names one per forward pass
  `step[VERIFY bs=..]`, `step[DRAFT bs=..]`, `step[EXTEND bs=.. toks=..]`, `step[DECODE bs=..]`;
- `gpu_user_annotation`: the same spans projected onto the device stream.

A kernel belongs to the forward pass whose step span contains it. Two ways to find it, because
neither always works: the kernel's `correlation` id names the host launch call
(`cudaLaunchKernel`, or one `cudaGraphLaunch` for a whole CUDA graph), whose start lies inside a
host step span; or, when the host side is missing (`activities=["GPU"]`), the device-side span
that contains the kernel's start on the same device. Kernels in no step span are counted under
the mode `other` (warm-up, sampling between passes).

Times are per pass: a mode's kernel time divided by that mode's number of step spans, so a trace
that caught 7 verify passes and one that caught 9 compare directly. A trace of any other
workload works too: torch's `ProfilerStep#N` spans are mode `step`, and a trace without any
step span is one pass of mode `all` (the whole profiled run, which must do the same work on both
sides).
"""

from __future__ import annotations

import bisect
import gzip
import json
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
STEP_RE = re.compile(r"^step\[(?P<stage>[A-Z_0-9]+)\b")
# SGLang's step-span stage -> the forward-mode names sleuth reports (the per-phase metric names).
STAGE_MODES = {
    "VERIFY": "target_verify", "TARGET_VERIFY": "target_verify",
    "DRAFT": "draft", "DRAFT_EXTEND": "draft", "DRAFT_EXTEND_V2": "draft",
    "DECODE": "decode",
    "EXTEND": "extend", "MIXED": "extend", "SPLIT_PREFILL": "extend", "DLLM_EXTEND": "extend",
}  # fmt: skip
OTHER_MODE = "other"
TORCH_STEP_RE = re.compile(r"^ProfilerStep#\d+$")
TORCH_STEP = "step"
WHOLE_MODE = "all"  # a trace without any step span: its kernels per profiled run


class TraceError(ValueError):
    """Not a Chrome trace the profiler writes (bad gzip, bad JSON, no `traceEvents`)."""


@dataclass(frozen=True)
class PassProfile:
    """One trace reduced: step spans per mode and device milliseconds per (mode, kernel)."""

    passes: Mapping[str, int]
    kernel_ms: Mapping[tuple[str, str], float]
    source: str = ""
    calls: Mapping[tuple[str, str], int] = field(default_factory=dict)

    def modes(self) -> list[str]:
        return sorted({m for m, _ in self.kernel_ms} | set(self.passes))

    def per_pass(self, mode: str) -> dict[str, float]:
        """Kernel -> device ms per pass of `mode` (total ms when the mode has no step spans)."""
        n = max(self.passes.get(mode, 0), 1)
        return {k: ms / n for (m, k), ms in self.kernel_ms.items() if m == mode}

    def pass_ms(self, mode: str) -> float:
        return sum(self.per_pass(mode).values())


def decode_trace(data: bytes) -> dict[str, Any]:
    """The trace document from a file's bytes, gzip-compressed or not."""
    try:
        if data[:2] == b"\x1f\x8b":
            data = gzip.decompress(data)
        doc = json.loads(data)
    except (OSError, EOFError, ValueError) as exc:
        raise TraceError(f"not a Chrome trace: {exc}") from exc
    if isinstance(doc, list):  # the bare-array form of the Chrome trace format
        doc = {"traceEvents": doc}
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        raise TraceError("not a Chrome trace: no traceEvents list")
    return doc


def step_mode(name: str) -> str | None:
    """The forward mode a step span stands for, or None for other spans (and IDLE passes).
    torch's own iteration marker (`ProfilerStep#N`, from `prof.step()`) is mode `step`."""
    m = STEP_RE.match(name)
    if not m:
        return TORCH_STEP if TORCH_STEP_RE.match(name) else None
    return STAGE_MODES.get(m.group("stage"))


class _Spans:
    """Non-overlapping-enough intervals per lane, looked up by the innermost one holding a time."""

    def __init__(self) -> None:
        self._by_lane: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
        self._starts: dict[Any, list[float]] = {}

    def add(self, lane: Any, ts: float, dur: float, mode: str) -> None:
        self._by_lane[lane].append((ts, ts + dur, mode))

    def freeze(self) -> None:
        for lane, spans in self._by_lane.items():
            spans.sort()
            self._starts[lane] = [s for s, _, _ in spans]

    def find(self, lanes: Iterable[Any], t: float) -> str | None:
        for lane in lanes:
            spans = self._by_lane.get(lane)
            if not spans:
                continue
            i = bisect.bisect_right(self._starts[lane], t) - 1
            # step spans do not nest inside each other, so the latest start before t decides
            if i >= 0 and spans[i][0] <= t <= spans[i][1]:
                return spans[i][2]
        return None

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_lane.values())


def _num(ev: Mapping[str, Any], key: str) -> float | None:
    v = ev.get(key)
    return float(v) if isinstance(v, int | float) else None


def pass_profile(doc: Mapping[str, Any], source: str = "") -> PassProfile:
    """Aggregate a decoded trace: device ms per (mode, kernel name) and step spans per mode."""
    host, device = _Spans(), _Spans()
    passes: dict[str, int] = defaultdict(int)
    device_passes: dict[str, int] = defaultdict(int)
    launches: dict[Any, tuple[Any, float]] = {}
    kernels: list[Mapping[str, Any]] = []
    for ev in doc.get("traceEvents", []):
        if not isinstance(ev, Mapping) or ev.get("ph") != "X":
            continue
        cat, ts, dur = ev.get("cat"), _num(ev, "ts"), _num(ev, "dur")
        if ts is None or dur is None:
            continue
        args = ev.get("args") if isinstance(ev.get("args"), Mapping) else {}
        if cat in DEVICE_CATEGORIES:
            kernels.append(ev)
        elif cat in ("user_annotation", "gpu_user_annotation"):
            mode = step_mode(str(ev.get("name", "")))
            if mode is None:
                continue
            lane = (ev.get("pid"), ev.get("tid"))
            if cat == "user_annotation":
                host.add(lane, ts, dur, mode)
                passes[mode] += 1
            else:
                device.add(ev.get("pid"), ts, dur, mode)
                device_passes[mode] += 1
        elif cat in ("cuda_runtime", "cuda_driver") and "correlation" in args:
            launches[args["correlation"]] = ((ev.get("pid"), ev.get("tid")), ts)
    host.freeze()
    device.freeze()
    kernel_ms: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    for ev in kernels:
        args = ev.get("args") if isinstance(ev.get("args"), Mapping) else {}
        mode = None
        launch = launches.get(args.get("correlation"))
        if launch is not None:
            mode = host.find([launch[0]], launch[1])
        if mode is None:
            mode = device.find([ev.get("pid")], float(ev["ts"]))
        if not (len(host) or len(device)):
            mode = WHOLE_MODE  # any workload's trace: one "pass" is the whole profiled run
        key = (mode or OTHER_MODE, str(ev.get("name", "")))
        kernel_ms[key] += float(ev["dur"]) / 1000.0  # microseconds -> ms
        calls[key] += 1
    counts = passes if len(host) else device_passes
    if not (len(host) or len(device)) and kernels:
        counts = {WHOLE_MODE: 1}
    return PassProfile(dict(counts), dict(kernel_ms), source, dict(calls))


def read_profile(data: bytes, source: str = "") -> PassProfile:
    """`decode_trace` then `pass_profile`: one trace file's bytes to its per-pass profile."""
    return pass_profile(decode_trace(data), source)


def merge_profiles(parts: Iterable[PassProfile], source: str = "") -> PassProfile:
    """One restart's traces (SGLang's per-stage files `-EXTEND` / `-DECODE`) as one profile."""
    passes: dict[str, int] = defaultdict(int)
    kernel_ms: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    for p in parts:
        for m, n in p.passes.items():
            passes[m] += n
        for k, ms in p.kernel_ms.items():
            kernel_ms[k] += ms
        for k, n in p.calls.items():
            calls[k] += n
    return PassProfile(dict(passes), dict(kernel_ms), source, dict(calls))
