"""Injected faults (`--sim-fault SPEC`, comma-separated), for reliability tests of the runner.

exit_at_start        exit 1 while loading, with an error in the log
crash_after:N        die (SIGABRT) once N client requests have completed; streams break
never_ready          stay 503 forever
hang_mid_stream[:N]  request number N (0-based, default 0) stops mid-stream: the scheduler
                     freezes, connections stay open, the process stays alive
degrade:PCT          each completed request makes the following ones PCT% slower
refuse_bind          exit 1 with uvicorn's "address already in use" error
hold_from:N:PATH     requests from number N on (0-based, warm-up included) wait to be admitted
                     while the file PATH exists: a test's barrier that keeps a trial mid-run
hold_loading:PATH    the loading phase waits while the file PATH exists (503 meanwhile): a
                     test's barrier that keeps a server loading until the test is done with it

State inside a long-running server (a model, not a measurement of any real leak): both are
gone after a restart, which is how a fresh restart of the same command tells them apart from
the configuration, the system and the code.

state:PCT[:MAX]      every 1000 client requests served make every forward pass PCT% slower,
                     up to MAX% (default 100): throughput that degrades with requests served
                     (llama.cpp issue 22360, "slows over time, a restart restores it"). The
                     server keeps 64 KiB per request served (its resident memory grows), and
                     with `--gc-warning-threshold-secs` logs SGLang's long-GC warning
burst:QUEUE:PCT      once QUEUE requests wait at the same time (an overload burst), every later
                     forward pass is PCT% slower (SGLang issue 30596: gen-2 GC pauses after a
                     transient overload, 33-41% lower throughput until `/freeze_gc`); with
                     `--gc-warning-threshold-secs` each decode-log window logs SGLang's long-GC
                     warning; `POST /freeze_gc` ends it, as in SGLang
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_NAMES = (
    "exit_at_start", "crash_after", "never_ready", "hang_mid_stream", "degrade", "refuse_bind",
    "hold_from", "hold_loading", "state", "burst",
)  # fmt: skip


class FaultSpecError(ValueError):
    pass


@dataclass(frozen=True)
class FaultPlan:
    exit_at_start: bool = False
    crash_after: int | None = None
    never_ready: bool = False
    hang_at_request: int | None = None
    degrade_pct: float = 0.0
    refuse_bind: bool = False
    hold_from: int | None = None
    hold_path: str | None = None
    hold_loading: str | None = None
    state_pct_per_k: float = 0.0
    state_max_pct: float = 100.0
    burst_queue: int | None = None
    burst_pct: float = 0.0

    def degrade_factor(self, completed_requests: int) -> float:
        return (1.0 + self.degrade_pct / 100.0) ** completed_requests

    def state_factor(self, completed_requests: int, burst_hit: bool) -> float:
        """How much slower every pass is from the server's accumulated state (1.0 fresh)."""
        served = min(self.state_max_pct, self.state_pct_per_k * completed_requests / 1000.0)
        burst = self.burst_pct if burst_hit else 0.0
        return (1.0 + served / 100.0) * (1.0 + burst / 100.0)


def _count(name: str, arg: str) -> int:
    try:
        value = int(arg)
    except ValueError:
        raise FaultSpecError(f"fault {name!r} needs an integer count, got {arg!r}") from None
    if value < 0:
        raise FaultSpecError(f"fault {name!r} needs a count >= 0, got {value}")
    return value


def _pct(name: str, arg: str) -> float:
    try:
        value = float(arg)
    except ValueError:
        raise FaultSpecError(f"fault {name!r} needs a percentage, got {arg!r}") from None
    if not 0.0 <= value < 10_000.0:
        raise FaultSpecError(f"fault {name!r} needs a percentage in [0, 10000), got {value}")
    return value


def parse_faults(spec: str | None) -> FaultPlan:
    """`"degrade:5,crash_after:10"` -> FaultPlan. Raises FaultSpecError on anything unknown."""
    fields: dict = {}
    for item in (s.strip() for s in (spec or "").split(",")):
        if not item:
            continue
        name, _, arg = item.partition(":")
        name = name.strip()
        if name == "exit_at_start" and not arg:
            fields["exit_at_start"] = True
        elif name == "never_ready" and not arg:
            fields["never_ready"] = True
        elif name == "refuse_bind" and not arg:
            fields["refuse_bind"] = True
        elif name == "crash_after" and arg:
            fields["crash_after"] = _count(name, arg)
        elif name == "hang_mid_stream":
            fields["hang_at_request"] = _count(name, arg) if arg else 0
        elif name == "hold_from" and ":" in arg:
            count, _, path = arg.partition(":")
            fields["hold_from"] = _count(name, count)
            fields["hold_path"] = path
        elif name == "hold_loading" and arg:
            fields["hold_loading"] = arg
        elif name == "state" and arg:
            pct, _, cap = arg.partition(":")
            fields["state_pct_per_k"] = _pct(name, pct)
            if cap:
                fields["state_max_pct"] = _pct(name, cap)
        elif name == "burst" and ":" in arg:
            queue, _, pct = arg.partition(":")
            fields["burst_queue"] = max(1, _count(name, queue))
            fields["burst_pct"] = _pct(name, pct)
        elif name == "degrade" and arg:
            try:
                fields["degrade_pct"] = float(arg)
            except ValueError:
                raise FaultSpecError(f"fault 'degrade' needs a percentage, got {arg!r}") from None
        else:
            raise FaultSpecError(
                f"unknown fault {item!r} (known: exit_at_start, crash_after:N, never_ready, "
                "hang_mid_stream[:N], degrade:PCT, refuse_bind, hold_from:N:PATH, "
                "hold_loading:PATH, state:PCT[:MAX], burst:QUEUE:PCT)"
            )
    return FaultPlan(**fields)
