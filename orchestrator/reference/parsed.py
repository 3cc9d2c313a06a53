"""An old log read as server lifetimes: each `server_args=` line starts one.

A lifetime is what sleuth calls a trial: one server process from start to stop. Its samples
(decode-log windows, the user's pattern lines) are not independent of each other, as a trial's
repetitions are not; the restart is the unit. So a log of one server run is a reference of one
restart, and a log spanning three restarts with the same configuration is three.

Lines before the first `server_args=` (a start rotated away) form a lifetime whose
configuration is unknown. NCCL lines carry no timestamp; they belong to the lifetime they
stand in. A line without a timestamp of its own takes the last one seen.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from orchestrator.bench.sglang_log import parse_decode, parse_prefill
from orchestrator.errors import UserError
from orchestrator.reference import files as logfiles
from orchestrator.reference import lines as L

# Names of the samples a decode line gives (the same names a trial's own log gives them,
# `orchestrator/bench/sglang_log.py: log_metrics`).
DECODE_METRICS = {"accept_len": "log_accept_len", "gen_throughput": "log_gen_throughput"}


@dataclass(frozen=True)
class Sample:
    """One reading: a decode-log window or a pattern line, its metrics and when."""

    stamp: float | None
    metrics: dict[str, float]
    source: str  # "decode" | "pattern"


@dataclass(frozen=True)
class Lifetime:
    """One server run in the log."""

    index: int
    server_args: dict | None  # None: its start is not in the log
    args_form: str | None  # "dict" (0.5.23) | "repr" (ServerArgs(...))
    where: str  # file:line of its start (or of its first line)
    started: float | None
    first: float | None
    last: float | None
    nccl_version: str | None = None
    nccl_env: dict[str, str] = field(default_factory=dict)
    nccl_info: bool = False  # NCCL printed INFO lines (NCCL_DEBUG=INFO) in this lifetime
    nccl_conflicts: tuple[str, ...] = ()
    hosts: tuple[str, ...] = ()
    samples: tuple[Sample, ...] = ()
    running_req: tuple[int, ...] = ()
    gc_pauses: tuple[float, ...] = ()
    prefill: tuple[int, int, int] = (0, 0, 0)  # prefill lines, new tokens, cached tokens

    def values(self, metric: str) -> list[float]:
        return [s.metrics[metric] for s in self.samples if metric in s.metrics]

    def level(self, metric: str) -> float | None:
        """The lifetime's level of `metric`: the median of its samples. The log's windows
        were never meant as repetitions (traffic changes, the first windows follow a cold
        start); the median is what a person reads off it as "19 ms, consistently"."""
        vals = self.values(metric)
        return statistics.median(vals) if vals else None

    @property
    def metrics(self) -> list[str]:
        names: dict[str, None] = {}
        for s in self.samples:
            names.update(dict.fromkeys(s.metrics))
        return list(names)


@dataclass(frozen=True)
class ParsedLog:
    """Every lifetime of the log, and what could not be read."""

    files: tuple[str, ...]
    lifetimes: tuple[Lifetime, ...]
    lines: int
    problems: tuple[str, ...] = ()
    pattern: str = ""

    @property
    def readable(self) -> bool:
        return any(lt.server_args is not None or lt.samples or lt.nccl_info or lt.prefill[0]
                   for lt in self.lifetimes)


class _Builder:
    """Collects one lifetime's parts while the lines go by."""

    def __init__(self, index: int, args: tuple[str, dict] | None, where: str,
                 stamp: float | None):
        self.index, self.args, self.where, self.started = index, args, where, stamp
        self.first = self.last = stamp
        self.nccl_version: str | None = None
        self.nccl_env: dict[str, str] = {}
        self.conflicts: list[str] = []
        self.hosts: dict[str, None] = {}
        self.nccl_info = False
        self.samples: list[Sample] = []
        self.running: list[int] = []
        self.gc: list[float] = []
        self.prefill = [0, 0, 0]
        self.seen = args is not None

    def stamp(self, stamp: float | None) -> None:
        if stamp is None:
            return
        self.first = stamp if self.first is None else self.first
        self.last = stamp

    def nccl(self, info: L.NcclInfo) -> None:
        self.nccl_info = self.seen = True
        self.hosts[info.host] = None
        if info.version is not None:
            if self.nccl_version not in (None, info.version):
                self.conflicts.append(f"NCCL version {self.nccl_version} and {info.version}")
            self.nccl_version = info.version
        if info.var is not None and info.value is not None:
            old = self.nccl_env.get(info.var)
            if old is not None and old != info.value:
                self.conflicts.append(f"{info.var}={old} and {info.value} (on different ranks)")
            self.nccl_env[info.var] = info.value

    def build(self) -> Lifetime:
        form, args = self.args if self.args is not None else (None, None)
        return Lifetime(self.index, args, form, self.where, self.started, self.first, self.last,
                        self.nccl_version, dict(self.nccl_env), self.nccl_info,
                        tuple(dict.fromkeys(self.conflicts)), tuple(self.hosts),
                        tuple(self.samples), tuple(self.running), tuple(self.gc),
                        (self.prefill[0], self.prefill[1], self.prefill[2]))


def parse_lines(lines: Iterable[tuple[str, str, int]], pattern: L.UserPattern | None = None
                ) -> tuple[list[Lifetime], int, list[str]]:
    """Lifetimes from `(raw line, file name, year)` tuples in order; also the number of lines
    and the problems met (a `server_args=` line that cannot be read)."""
    done: list[Lifetime] = []
    current: _Builder | None = None
    problems: list[str] = []
    last_stamp: float | None = None
    count = 0
    numbers: dict[str, int] = {}
    for raw, name, year in lines:
        count += 1
        numbers[name] = n = numbers.get(name, 0) + 1
        where = f"{name}:{n}"
        info = L.nccl_info(raw)
        if info is not None:
            current = current or _Builder(len(done), None, where, None)
            current.nccl(info)
            continue
        pre = L.split_prefix(raw, year)
        if pre.stamp is not None:
            last_stamp = pre.stamp
        stamp = pre.stamp if pre.stamp is not None else last_stamp
        message = pre.message
        try:
            args = L.server_args(message)
        except L.LogLineError as exc:
            problems.append(f"{where}: {exc}")
            args = None
        if args is not None:
            if current is not None and current.seen:
                done.append(current.build())
            current = _Builder(len(done), args, where, stamp)
            continue
        current = current or _Builder(len(done), None, where, stamp)
        current.stamp(pre.stamp)
        d = parse_decode(message)
        if d is not None:
            metrics = {DECODE_METRICS[k]: float(v) for k in DECODE_METRICS
                       if (v := getattr(d, k)) is not None and math.isfinite(v)}
            if d.cuda_graph is not None:
                metrics["cuda_graph_share"] = 1.0 if d.cuda_graph else 0.0
            if d.running_req is not None:
                current.running.append(d.running_req)
            if metrics:
                current.samples.append(Sample(stamp, metrics, "decode"))
            current.seen = True
            continue
        p = parse_prefill(message)
        if p is not None:  # the prompts then: how many, and how much the prefix cache hit
            current.prefill[0] += 1
            current.prefill[1] += p.new_tokens or 0
            current.prefill[2] += p.cached_tokens or 0
            current.seen = True
            continue
        gc = L.gc_pause(message)
        if gc is not None:
            current.gc.append(gc[1])
            current.seen = True
        if pattern is not None:
            found = pattern.samples(message)
            if found:
                current.samples.append(Sample(stamp, found, "pattern"))
                current.seen = True
    if current is not None and current.seen:
        done.append(current.build())
    return done, count, problems


def parse_files(spec: str, pattern: str = "") -> ParsedLog:
    """Read the log `spec` names (see :mod:`orchestrator.reference.files`). Bad input (no file,
    a pattern that is not a regex, no line sleuth can read) is a UserError, one line."""
    try:
        user = L.UserPattern(pattern) if pattern else None
    except ValueError as exc:
        raise UserError(str(exc)) from None
    ordered = logfiles.ordered(spec)

    def stream():
        for f in ordered:
            for raw in logfiles.read_lines(f.path):
                yield raw, f.path.name, f.year

    lifetimes, count, problems = parse_lines(stream(), user)
    log = ParsedLog(tuple(str(f.path) for f in ordered), tuple(lifetimes), count,
                    tuple(problems), pattern)
    if not log.readable:
        names = ", ".join(f.path.name for f in ordered[:3]) + (" ..." if len(ordered) > 3 else "")
        why = f" ({problems[0]})" if problems else ""
        raise UserError(f"log:{spec}: no line sleuth can read in {count} lines of {names}"
                        f" (no server_args=, Decode or Prefill batch, NCCL INFO"
                        f"{' or log.pattern' if user else ''} line){why}")
    return log


def spread(values: Sequence[float]) -> dict[str, float] | None:
    """Median, 10th and 90th percentiles and the count of a lifetime's samples."""
    if not values:
        return None
    ordered = sorted(values)

    def pick(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]

    return {"n": len(ordered), "median": statistics.median(ordered), "p10": pick(0.1),
            "p90": pick(0.9)}
