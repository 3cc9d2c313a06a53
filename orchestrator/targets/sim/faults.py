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
"""

from __future__ import annotations

from dataclasses import dataclass

FAULT_NAMES = (
    "exit_at_start", "crash_after", "never_ready", "hang_mid_stream", "degrade", "refuse_bind",
    "hold_from", "hold_loading",
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

    def degrade_factor(self, completed_requests: int) -> float:
        return (1.0 + self.degrade_pct / 100.0) ** completed_requests


def _count(name: str, arg: str) -> int:
    try:
        value = int(arg)
    except ValueError:
        raise FaultSpecError(f"fault {name!r} needs an integer count, got {arg!r}") from None
    if value < 0:
        raise FaultSpecError(f"fault {name!r} needs a count >= 0, got {value}")
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
        elif name == "degrade" and arg:
            try:
                fields["degrade_pct"] = float(arg)
            except ValueError:
                raise FaultSpecError(f"fault 'degrade' needs a percentage, got {arg!r}") from None
        else:
            raise FaultSpecError(
                f"unknown fault {item!r} (known: exit_at_start, crash_after:N, never_ready, "
                "hang_mid_stream[:N], degrade:PCT, refuse_bind, hold_from:N:PATH, "
                "hold_loading:PATH)"
            )
    return FaultPlan(**fields)
