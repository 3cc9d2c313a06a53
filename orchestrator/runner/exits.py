"""Whose doing a server's death was: the candidate's, or the machine's.

A server that exits by itself before it is ready (an import error, a bad flag, a CUDA error)
or that crashes mid-benchmark says something about the candidate: `launch_failed` or
`crashed`, retried and then untestable. A server killed from outside (a user's `kill`, a job
scheduler, systemd stopping the session) says nothing about it, and must neither use up a
retry nor make it untestable: the trial is `interrupted` and the evaluation runs again.

What tells them apart is the exit status. A server never sends itself SIGTERM, SIGINT or
SIGHUP; a crash is SIGSEGV, SIGABRT, SIGBUS or an exit code. SIGKILL is ambiguous: the
kernel's out-of-memory killer uses it too, and running out of memory may well be the
candidate's doing. The kernel counts its OOM kills (`oom_kill` in /proc/vmstat, Linux 4.13+):
a SIGKILL with no new OOM kill since the launch came from outside; where the counter cannot
be read, a SIGKILL keeps the candidate's outcome (never confidently wrong).
"""

from __future__ import annotations

import signal
from pathlib import Path

VMSTAT = Path("/proc/vmstat")

# Signals only something outside the server sends it.
OUTSIDE_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP})


def oom_kills(vmstat: Path = VMSTAT) -> int | None:
    """The kernel's count of OOM kills since boot, or None where it cannot be read."""
    try:
        for line in vmstat.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == "oom_kill":
                return int(value)
    except (OSError, ValueError):
        return None
    return None


def killed_from_outside(code: int | None, oom_at_launch: int | None,
                        oom_now: int | None) -> str | None:
    """The signal's name when exit status `code` (Popen's: -N for signal N) means the server
    was killed from outside; None when it exited or crashed by itself (or cannot be told)."""
    if code is None or code >= 0:
        return None
    try:
        sig = signal.Signals(-code)
    except ValueError:
        return None
    if sig in OUTSIDE_SIGNALS:
        return sig.name
    if sig is signal.SIGKILL and oom_at_launch is not None and oom_now is not None \
            and oom_now == oom_at_launch:
        return sig.name
    return None
