"""Read one profiler trace into device time per kernel per forward mode (pure: bytes in, numbers out).

The format is the torch profiler's Chrome trace (`export_chrome_trace`), which is what SGLang's
`/start_profile` + `/stop_profile` write (`{profile_id}-TP-{rank}.trace.json.gz`) and what most
GPU benchmarks can be made to write. Only three kinds of event matter here:

- `kernel` (and `gpu_memcpy` / `gpu_memset`): device time, one event per kernel execution;
- `user_annotation`: host spans from `record_function`; SGLang names one per forward pass
  `step[VERIFY bs=..]`, `step[DRAFT bs=..]`, `step[EXTEND bs=.. toks=..]`, `step[DECODE bs=..]`;
- `gpu_user_annotation`: the same spans projected onto the device stream.

A kernel belongs to the forward pass whose step span was open when it was launched. Three ways
to find it, in this order, because no one always works:

1. the kernel's `correlation` id names the host launch call (`cudaLaunchKernel`, one
   `cudaGraphLaunch` for a whole CUDA graph, `hipLaunchKernel` on ROCm), and a step span of
   the launching thread holds the call's start;
2. else a step span of another thread *of the same process* holds it: a training step's
   backward kernels are launched by autograd's device threads, its collectives by the c10d /
   NCCL thread, while `ProfilerStep#N` is open on the main thread. A span of another process
   never counts (two ranks in one trace are two processes). When spans of several threads hold
   the launch, the latest-started one (the innermost) wins;
3. else, when the trace has no host side for the kernel (`activities=["GPU"]`), the device-side
   span (`gpu_user_annotation`) holding the kernel's start on the same device.

Device time launched outside any step span is the mode `other` (warm-up, work between steps,
host threads that run outside them): it is counted, never dropped, and its share of the
trace's device time is reported (`PassProfile.outside_share`).

Times are per pass: a mode's kernel time divided by that mode's number of step spans, so a trace
that caught 7 verify passes and one that caught 9 compare directly; `other` is divided by the
trace's step spans of every mode (its device time per step). A trace of any other workload
works too: torch's `ProfilerStep#N` spans are mode `step`, and a trace without any step span is
one pass of mode `all` (the whole profiled run, which must do the same work on both sides).

What the trace holds is said, never guessed around: a trace with no profiled event at all (a
profiler exported after its schedule's last active step, an empty `traceEvents`) is refused as
an empty profile (`TraceError`); a trace with host events but no device event (no CUPTI in the
container, `activities=[CPU]`) reads as a profile with no device time (`PassProfile.device_ms`
is 0), which the diff reports as such instead of "nothing moved".

Kernels launched inside one of torch's attention operators (SDPA's math path: `bmm`, softmax,
`bmm`) are kept apart (`PassProfile.attention_ms`) so that the diff files them as attention
(orchestrator/evidence/families.py says why only those operators count).
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

from orchestrator.evidence.families import attention_op

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
    """Not a Chrome trace the profiler writes (bad gzip, bad JSON, no `traceEvents`), or one
    that holds no profiled event (an empty profile)."""


@dataclass(frozen=True)
class PassProfile:
    """One trace reduced: step spans per mode and device milliseconds per (mode, kernel).

    `attention_ms`: the part of `kernel_ms` launched inside one of torch's attention operators
    (filed as attention whatever the kernel's name); `host_events`: the trace's host events
    (operators, spans, runtime calls), which tell a CPU-only profile from an empty one."""

    passes: Mapping[str, int]
    kernel_ms: Mapping[tuple[str, str], float]
    source: str = ""
    calls: Mapping[tuple[str, str], int] = field(default_factory=dict)
    attention_ms: Mapping[tuple[str, str], float] = field(default_factory=dict)
    host_events: int = 0

    def modes(self) -> list[str]:
        return sorted({m for m, _ in self.kernel_ms} | set(self.passes))

    def divisor(self, mode: str) -> int:
        """What a mode's device time is divided by: its step spans; for `other`, the step spans
        of every mode (device time outside the steps, per step); at least 1."""
        if mode == OTHER_MODE:
            return max(sum(self.passes.values()), 1)
        return max(self.passes.get(mode, 0), 1)

    def per_pass(self, mode: str) -> dict[str, float]:
        """Kernel -> device ms per pass of `mode` (total ms when the mode has no step spans)."""
        n = self.divisor(mode)
        return {k: ms / n for (m, k), ms in self.kernel_ms.items() if m == mode}

    def per_pass_families(self, mode: str, family_of) -> dict[tuple[str, str], float]:
        """(family, kernel) -> device ms per pass of `mode`: `family_of(kernel)`, except the
        part launched inside an attention operator, which is attention."""
        n = self.divisor(mode)
        out: dict[tuple[str, str], float] = defaultdict(float)
        for (m, k), ms in self.kernel_ms.items():
            if m != mode:
                continue
            inside = min(self.attention_ms.get((m, k), 0.0), ms)
            if inside > 0:
                out[("attention", k)] += inside / n
            if ms - inside > 0 or not inside:
                out[(family_of(k), k)] += (ms - inside) / n
        return dict(out)

    def pass_ms(self, mode: str) -> float:
        return sum(self.per_pass(mode).values())

    @property
    def device_ms(self) -> float:
        """All device time the trace holds (kernels, memcpy, memset), in ms."""
        return sum(self.kernel_ms.values())

    def outside_share(self) -> float:
        """The share of the trace's device time launched outside any step span (mode
        `other`); 0 for a trace without device time."""
        total = self.device_ms
        other = sum(ms for (m, _), ms in self.kernel_ms.items() if m == OTHER_MODE)
        return other / total if total > 0 else 0.0


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
    """Intervals per lane (a thread, or a device), looked up by the innermost one holding a time."""

    def __init__(self) -> None:
        self._by_lane: dict[Any, list[tuple[float, float, str]]] = defaultdict(list)
        self._starts: dict[Any, list[float]] = {}
        self._lanes_of: dict[Any, list[Any]] = defaultdict(list)  # process -> its lanes

    def add(self, lane: Any, ts: float, dur: float, mode: str) -> None:
        self._by_lane[lane].append((ts, ts + dur, mode))

    def freeze(self) -> None:
        for lane, spans in self._by_lane.items():
            spans.sort()
            self._starts[lane] = [s for s, _, _ in spans]
            if isinstance(lane, tuple):
                self._lanes_of[lane[0]].append(lane)

    def _holding(self, lane: Any, t: float) -> tuple[float, str] | None:
        spans = self._by_lane.get(lane)
        if not spans:
            return None
        i = bisect.bisect_right(self._starts[lane], t) - 1
        # step spans do not nest inside each other, so the latest start before t decides
        if i >= 0 and spans[i][0] <= t <= spans[i][1]:
            return spans[i][0], spans[i][2]
        return None

    def find(self, lanes: Iterable[Any], t: float) -> str | None:
        for lane in lanes:
            held = self._holding(lane, t)
            if held is not None:
                return held[1]
        return None

    def find_in_process(self, lane: tuple[Any, Any], t: float) -> str | None:
        """The span of `lane`'s own thread holding `t`, else the latest-started span of another
        thread of the same process holding it."""
        own = self._holding(lane, t)
        if own is not None:
            return own[1]
        held = [h for other in self._lanes_of.get(lane[0], ()) if other != lane
                and (h := self._holding(other, t)) is not None]
        return max(held)[1] if held else None

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_lane.values())


class _Union:
    """Per lane, the union of some intervals (nested or not), for "is t inside any of them"."""

    def __init__(self) -> None:
        self._raw: dict[Any, list[tuple[float, float]]] = defaultdict(list)
        self._merged: dict[Any, tuple[list[float], list[float]]] = {}

    def add(self, lane: Any, ts: float, dur: float) -> None:
        self._raw[lane].append((ts, ts + dur))

    def freeze(self) -> None:
        for lane, spans in self._raw.items():
            starts: list[float] = []
            ends: list[float] = []
            for s, e in sorted(spans):
                if ends and s <= ends[-1]:
                    ends[-1] = max(ends[-1], e)
                else:
                    starts.append(s)
                    ends.append(e)
            self._merged[lane] = (starts, ends)

    def holds(self, lane: Any, t: float) -> bool:
        merged = self._merged.get(lane)
        if not merged:
            return False
        i = bisect.bisect_right(merged[0], t) - 1
        return i >= 0 and t <= merged[1][i]


def _num(ev: Mapping[str, Any], key: str) -> float | None:
    v = ev.get(key)
    return float(v) if isinstance(v, int | float) else None


def _is_runtime(cat: Any) -> bool:
    """A host runtime call that launches device work: CUDA's (`cuda_runtime`, `cuda_driver`),
    and the same categories other backends' profilers write (`hipLaunchKernel` arrives as
    `cuda_runtime` on ROCm; `*_runtime` for MTIA, XPU, PrivateUse1)."""
    return isinstance(cat, str) and (cat.endswith("_runtime") or cat.endswith("_driver"))


def pass_profile(doc: Mapping[str, Any], source: str = "") -> PassProfile:
    """Aggregate a decoded trace: device ms per (mode, kernel name) and step spans per mode."""
    host, device = _Spans(), _Spans()
    attention = _Union()
    passes: dict[str, int] = defaultdict(int)
    device_passes: dict[str, int] = defaultdict(int)
    launches: dict[Any, tuple[Any, float]] = {}
    kernels: list[Mapping[str, Any]] = []
    host_events = 0
    for ev in doc.get("traceEvents", []):
        if not isinstance(ev, Mapping) or ev.get("ph") != "X":
            continue
        cat, ts, dur = ev.get("cat"), _num(ev, "ts"), _num(ev, "dur")
        if ts is None or dur is None:
            continue
        args = ev.get("args") if isinstance(ev.get("args"), Mapping) else {}
        lane = (ev.get("pid"), ev.get("tid"))
        if cat in DEVICE_CATEGORIES:
            kernels.append(ev)
            continue
        if cat != "Trace":  # the profiler's own window span, present even in an empty export
            host_events += 1
        if cat in ("user_annotation", "gpu_user_annotation"):
            mode = step_mode(str(ev.get("name", "")))
            if mode is None:
                continue
            if cat == "user_annotation":
                host.add(lane, ts, dur, mode)
                passes[mode] += 1
            else:
                device.add(ev.get("pid"), ts, dur, mode)
                device_passes[mode] += 1
        elif cat == "cpu_op" and attention_op(str(ev.get("name", ""))):
            attention.add(lane, ts, dur)
        elif _is_runtime(cat) and "correlation" in args:
            launches[args["correlation"]] = (lane, ts)
    if not kernels and not host_events:
        raise TraceError("the trace holds no profiled event (an empty profile: the profiler"
                         " recorded nothing, e.g. exported after its schedule's last active"
                         " step)")
    host.freeze()
    device.freeze()
    attention.freeze()
    kernel_ms: dict[tuple[str, str], float] = defaultdict(float)
    inside_ms: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    whole = not (len(host) or len(device))
    for ev in kernels:
        args = ev.get("args") if isinstance(ev.get("args"), Mapping) else {}
        mode = None
        launch = launches.get(args.get("correlation"))
        if launch is not None:
            mode = host.find_in_process(launch[0], launch[1])
        if mode is None:
            mode = device.find([ev.get("pid")], float(ev["ts"]))
        if whole:
            mode = WHOLE_MODE  # any workload's trace: one "pass" is the whole profiled run
        key = (mode or OTHER_MODE, str(ev.get("name", "")))
        ms = float(ev["dur"]) / 1000.0  # microseconds -> ms
        kernel_ms[key] += ms
        calls[key] += 1
        if launch is not None and attention.holds(launch[0], launch[1]):
            inside_ms[key] += ms
    counts = passes if len(host) else device_passes
    if whole and kernels:
        counts = {WHOLE_MODE: 1}
    return PassProfile(dict(counts), dict(kernel_ms), source, dict(calls), dict(inside_ms),
                       host_events)


def read_profile(data: bytes, source: str = "") -> PassProfile:
    """`decode_trace` then `pass_profile`: one trace file's bytes to its per-pass profile."""
    return pass_profile(decode_trace(data), source)


def merge_profiles(parts: Iterable[PassProfile], source: str = "") -> PassProfile:
    """One restart's traces (SGLang's per-stage files `-EXTEND` / `-DECODE`) as one profile."""
    passes: dict[str, int] = defaultdict(int)
    kernel_ms: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    inside: dict[tuple[str, str], float] = defaultdict(float)
    host_events = 0
    for p in parts:
        for m, n in p.passes.items():
            passes[m] += n
        for k, ms in p.kernel_ms.items():
            kernel_ms[k] += ms
        for k, n in p.calls.items():
            calls[k] += n
        for k, ms in p.attention_ms.items():
            inside[k] += ms
        host_events += p.host_events
    return PassProfile(dict(passes), dict(kernel_ms), source, dict(calls), dict(inside),
                       host_events)
