"""What a trial's steps check, and how a failure is told apart (`runner/trial.py` runs them).

A failure maps to a distinct `Outcome` with its evidence (exit code, last log lines): a server
that died before it was ready, crashed, hung, or was killed from outside (`exits.py`: then the
trial is `interrupted` and runs again, it was not the candidate's doing); a full disk, told by
its errno or by git's and SQLite's words for it; a clock or power setting out of the GPUs'
range, or changed during the trial by someone else; a variable the server did not get.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Mapping
from pathlib import Path

from orchestrator.bench.client import BenchError
from orchestrator.gpu.base import ClockPolicy
from orchestrator.records import UNSET, Outcome
from orchestrator.runner.exits import killed_from_outside, oom_kills
from orchestrator.system.redact import scrub, secret_values
from orchestrator.targets.base import Target
from orchestrator.util.process import ServerProcess, group_members, read_environ
from orchestrator.util.safe_text import printable

LOG_TAIL_BYTES = 16_384

# A trial that ran out of disk has a detail starting with this (and ends `interrupted`, unless
# it measured everything and only a last file could not be written); the controller stops the
# run (resumable) instead of retrying or counting the candidate untestable.
NO_SPACE = "no space left on device"
# A failed trial whose disk has less free space than this is taken to have failed for lack of
# it (a server that could not write its log dies in many ways).
LOW_SPACE_BYTES = 2 << 20


class TrialFailure(Exception):
    """A step's verdict on the trial (`outcome`, with its evidence in `detail`): raised by the
    step that found it, caught once by `run_trial`, which records it instead of measurements."""

    def __init__(self, outcome: Outcome, detail: str):
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def log_tail(path: Path, n_bytes: int = LOG_TAIL_BYTES) -> str:
    """The end of a server log, without terminal control sequences (it is shown to people)."""
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - n_bytes))
        return printable(f.read().decode(errors="replace"))


def last_lines(path: Path, n: int = 3) -> str:
    lines = [ln.strip() for ln in log_tail(path, 4096).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def is_no_space(exc: BaseException) -> bool:
    """An error that means the disk (or quota) is full: ENOSPC/EDQUOT anywhere in its chain,
    or git's / SQLite's words for it (they report it in text, not as an errno)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(seen)
        if ("No space left on device" in text or "Disk quota exceeded" in text
                or "database or disk is full" in text):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def clock_problem(policy: ClockPolicy, snapshot: Mapping) -> str:
    """Why a node's GPUs cannot take `policy` (one line), or "" when they can (or when the
    snapshot does not say: NVML fields it does not support are left out)."""
    for g in snapshot.get("gpus", []) or []:
        top = g.get("sm_clock_max_mhz")
        if policy.locked_mhz is not None and top and policy.locked_mhz > top:
            return (f"clock=locked:{policy.locked_mhz} is beyond GPU {g.get('index')}'s maximum"
                    f" SM clock of {top} MHz")
        power_max = g.get("power_limit_max_w")
        if policy.power_w is not None and power_max and policy.power_w > power_max:
            return (f"clock=power:{policy.power_w} is above GPU {g.get('index')}'s maximum power"
                    f" limit of {power_max:g} W")
    return ""


# Per-GPU readings that only change when someone sets them.
_CLOCK_SETTINGS = ("sm_clock_locked_mhz", "applications_clock_sm_mhz", "power_limit_w")


def clock_changes(before: Mapping, after: Mapping) -> list[str]:
    """Clock/power settings that differ between two snapshots of the same trial."""
    was = {g.get("index"): g for g in before.get("gpus", []) or []}
    out = []
    for g in after.get("gpus", []) or []:
        old = was.get(g.get("index"))
        if old is None:
            continue
        for key in _CLOCK_SETTINGS:
            if key in g and key in old and g[key] != old[key]:
                out.append(f"GPU {g.get('index')} {key} {old[key]} -> {g[key]}")
    return out


def env_mismatches(proc: ServerProcess, wanted: Mapping[str, str]) -> list[str]:
    """Requested variables that are missing or different in any process of the server group."""
    problems = []
    for pid in [proc.pid, *[p for p in group_members(proc.pgid) if p != proc.pid]]:
        try:
            env = read_environ(pid)
        except OSError:
            continue  # exited meanwhile; the next step notices if it mattered
        for key, value in wanted.items():
            got = env.get(key)
            if value == UNSET:
                if got is not None:
                    problems.append(f"{key} requested unset but {got!r} in pid {pid}")
            elif got != value:
                shown = "missing" if got is None else f"{got!r}"
                problems.append(f"{key}={value!r} requested but {shown} in pid {pid}")
    return problems


def scrub_log(log_path: Path, argv: list[str], env: dict[str, str]) -> None:
    """The server is gone: take out of its log the credentials it was handed (a server prints
    its arguments, `api_key='...'`), before the log's tail is kept in the store."""
    secrets = secret_values(argv, env)
    if not secrets or not log_path.exists():
        return
    try:
        text = log_path.read_text(errors="replace")
        clean = scrub(text, secrets)
        if clean != text:
            log_path.write_text(clean)
    except OSError:
        pass


def server_environ(proc: ServerProcess) -> dict[str, str] | None:
    """The server's own environment, read once it is ready (a launcher that execs it has
    done so by then); None when it cannot be read (another user's process)."""
    try:
        return read_environ(proc.pid)
    except OSError:
        return None


# Readiness is polled every READY_POLL_S for the first READY_FAST_S (a fast server, the sim, a
# small model: half a poll interval is added to every trial on average, 10 ms at 20 ms where
# the sim is ready 0.2-0.3 s after its launch), then less and less often, up to once a second
# (a large model loading for minutes does not need 50 probes a second; a probe of a server
# that is still loading is a refused connection or an immediate 503).
READY_POLL_S = 0.02
READY_FAST_S = 10.0
READY_MAX_POLL_S = 1.0


def ready_delay(waited_s: float) -> float:
    """Seconds until the next readiness probe, `waited_s` after the launch."""
    if waited_s < READY_FAST_S:
        return READY_POLL_S
    return min(READY_MAX_POLL_S, READY_POLL_S * 1.5 ** ((waited_s - READY_FAST_S) / 2.0 + 1))


def died(proc: ServerProcess, oom_at_launch: int | None, outcome: Outcome, when: str,
          evidence: str = "") -> TrialFailure:
    """The candidate's failure (`outcome`), unless the server was killed from outside (see
    `exits.py`): then the trial is `interrupted` and runs again."""
    code = proc.poll()
    sig = killed_from_outside(code, oom_at_launch, oom_kills())
    if sig is not None:
        return TrialFailure(Outcome.INTERRUPTED, f"the server was killed from outside ({sig})"
                            f" {when}; not the candidate's doing, it runs again")
    return TrialFailure(outcome, f"server exited with code {code} {when}"
                        + (f": {evidence}" if evidence else ""))


def wait_ready(target: Target, proc: ServerProcess, timeout_s: float,
                oom_at_launch: int | None = None) -> None:
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise died(proc, oom_at_launch, Outcome.LAUNCH_FAILED, "before it was ready",
                        last_lines(proc.log_path))
        if target.is_ready(proc.base_url):
            return
        if time.monotonic() > deadline:
            raise TrialFailure(
                Outcome.NOT_READY, f"server alive but not ready after {timeout_s:g}s"
            )
        time.sleep(ready_delay(time.monotonic() - started))


def classify_bench_error(exc: BenchError, proc: ServerProcess | None, what: str,
                          oom_at_launch: int | None = None) -> TrialFailure:
    if proc is None:  # a benchmark command without a server: nothing else can have died
        if exc.kind == "hung":
            return TrialFailure(Outcome.HUNG, f"benchmark stalled during {what}: {exc}")
        return TrialFailure(Outcome.BENCH_FAILED, f"{what} failed: {exc}")
    # Give a dying server a moment to be reaped, so a crash is not misread as a hang.
    for _ in range(20):
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    code = proc.poll()
    if code is not None:
        return died(proc, oom_at_launch, Outcome.CRASHED, f"during {what}",
                     last_lines(proc.log_path))
    if exc.kind == "hung":
        return TrialFailure(Outcome.HUNG, f"server alive but stalled during {what}: {exc}")
    return TrialFailure(Outcome.BENCH_FAILED, f"{what} failed with the server alive: {exc}")
