"""Several settings measured within one server lifetime, in interleaved blocks.

A trial normally measures one configuration: its repetitions share the restart's own level,
so two configurations compared across restarts carry two restarts' noise. A setting that can
change on a running server (a power limit or a clock lock through NVML:
:mod:`orchestrator.system.runtime_settable`) is compared inside one lifetime instead: the
server is launched once, and each round measures one repetition at every level, the order
reversed every other round (A B, B A, A B ...: a linear drift within the lifetime adds the
same to both sides). The restart's level is common to all blocks of the lifetime and drops
out of any difference between them.

What the pairing does not cover, said wherever its numbers are used: an effect that differs
from one restart to the next (a setting whose effect depends on the lifetime's own state) is
seen only across lifetimes, which is why the strategy still measures more than one; and a
setting that acts only at launch (read once at start-up) would measure as no effect, which is
why only settings documented to act at run time are compared this way.

The levels are clock policies applied on top of the node as the launch left it; before each
level the previous level is undone (only what it changed, as after a trial), and after the
last block the node is put back as the launch found it, so the trial's own check of a clock
changed from outside sees no change of its own making. Every repetition is stored as usual;
the fingerprint's `live` entry says which level each one measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from orchestrator.bench.client import BenchError
from orchestrator.gpu.base import ClockPolicy, GpuControl
from orchestrator.records import Measurement

# One request after each switch, outside the measured repetitions: the first pass at a new
# power limit or clock runs while the GPU's governor settles.
SETTLE_REQUESTS = 1


def block_order(levels: int, rounds: int) -> list[int]:
    """The level of each block: every level once per round, the order reversed every other
    round (0 1, 1 0, 0 1 ...)."""
    out: list[int] = []
    for r in range(rounds):
        order = list(range(levels))
        out += order if r % 2 == 0 else order[::-1]
    return out


class LiveLevels:
    """Switch a node's GPUs between clock policies within one lifetime; always undone."""

    def __init__(self, gpu: GpuControl, on_clock: Callable[[object], None] | None = None):
        self.gpu = gpu
        self.on_clock = on_clock
        self.token: object = None
        self.current: str | None = None

    def set(self, policy: str) -> bool:
        """Put the node at `policy` (on top of the launch state); True if anything changed."""
        if policy == self.current:
            return False
        self.undo()
        parsed = ClockPolicy.parse(policy)
        self.token = None if parsed.is_default else self.gpu.apply(parsed)
        if self.on_clock is not None and self.token is not None:
            self.on_clock(self.token)  # persisted: a killed node still gets it restored
        self.current = policy
        return True

    def undo(self) -> None:
        if self.token is not None:
            self.gpu.restore(self.token)
            if self.on_clock is not None:
                self.on_clock(None)
        self.token = None
        self.current = None


def measure_levels(levels: Sequence[str], rounds: int, gpu: GpuControl,
                   measure: Callable[[], dict], settle: Callable[[], None],
                   classify: Callable[[BenchError, str], Exception],
                   on_clock: Callable[[object], None] | None = None
                   ) -> tuple[list[Measurement], dict]:
    """Measure each of `levels` `rounds` times in interleaved blocks of one repetition;
    returns the measurements and the fingerprint's `live` entry (`levels`, and `blocks`: the
    level index of each measurement). The node is put back as it was found, also when a
    measurement fails (the failure is raised after the restore)."""
    switch = LiveLevels(gpu, on_clock)
    order = block_order(len(levels), rounds)
    out: list[Measurement] = []
    snapshots: dict[int, dict] = {}
    try:
        for n, level in enumerate(order):
            if switch.set(levels[level]):
                if level not in snapshots:  # what each level's own record shows of the GPUs
                    snapshots[level] = gpu.snapshot()
                try:
                    settle()
                except BenchError as exc:
                    raise classify(exc, f"settling at {levels[level]}") from exc
            began = time.monotonic()
            try:
                metrics = measure()
            except BenchError as exc:
                raise classify(exc, f"block {n + 1} ({levels[level]})") from exc
            out.append(Measurement(n, metrics, time.monotonic() - began))
    finally:
        switch.undo()
    return out, {"levels": list(levels), "blocks": order[:len(out)], "rounds": rounds,
                 "snapshots": [snapshots.get(i, {}) for i in range(len(levels))],
                 "paired": "within one lifetime: the restart's level cancels from a difference"
                           " between levels"}
