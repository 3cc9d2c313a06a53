"""The sim server's load time, counted from the moment its process was launched.

A real SGLang launch spends its first seconds importing torch and sglang, and that time is
part of what an operator sees as "the server took N s to load". The sim's modeled load time
(`--sim-load-seconds` x time scale) stands for that whole span, so the wall time the process
has already spent before its loading phase begins (the interpreter's start, its imports, the
flags, the profile, the bind; and, on a node with a launcher wrapper, the wrapper's own
interpreter, which execs the server in its place and keeps its pid) is taken off the modeled
sleeps. Without this, every simulated restart paid its Python start on top of the model, and
the model's load time was a floor rather than the time it says.

The app takes the credit off the last phases only (KV cache, CUDA graph capture: 35% of the
load), not off distributed init and weight loading: a launch that fails while loading its
weights (an injected `exit_at_start`, a bad NCCL setting) fails at the same moment after launch
as before, with the same 503 window before it; only the moment it is ready moves.

The launch moment is the kernel's start time of this pid (`/proc/self/stat`, in clock ticks
since boot, against CLOCK_BOOTTIME). A process that was exec'd long after its pid was born (a
shell's `exec python -m ...` typed by hand) would look old: at most `MAX_CREDIT_S` of wall time
is credited, and nothing where the start time cannot be read (not Linux).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

MAX_CREDIT_S = 2.0


def seconds_since_launch() -> float:
    """Wall seconds since this process's pid was started; 0.0 where that cannot be read."""
    try:
        with open("/proc/self/stat") as f:
            fields = f.read().rpartition(")")[2].split()  # the command name may hold spaces
        started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started)
    except (OSError, ValueError, IndexError, AttributeError):
        return 0.0


class LoadClock:
    """Sleeps the loading phase's modeled durations, less the wall time already credited."""

    def __init__(self, time_scale: float, credit_s: float,
                 sleep: Callable[[float], None] = time.sleep):
        self.time_scale = time_scale
        self.credit_s = min(max(0.0, credit_s), MAX_CREDIT_S)
        self._sleep = sleep

    @classmethod
    def from_launch(cls, time_scale: float) -> LoadClock:
        return cls(time_scale, seconds_since_launch())

    def sleep_modeled(self, seconds: float, *, credited: bool = True) -> None:
        """Sleep `seconds` of modeled time; `credited=False` sleeps it in full, keeping the
        credit for a later phase."""
        if seconds <= 0:
            return
        wall = seconds * self.time_scale
        used = min(self.credit_s, wall) if credited else 0.0
        self.credit_s -= used
        if wall - used > 0:
            self._sleep(wall - used)
