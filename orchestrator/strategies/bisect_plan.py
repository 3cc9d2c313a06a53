"""Bookkeeping of the bisect strategy's searched ranges, shared by its phase modules.

Mutable state the strategy rebuilds by replaying observations, not records: the records a run
keeps are the observations themselves and the verdict.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from orchestrator.strategies.base import Culprit


@dataclass(frozen=True)
class Reproduction:
    """The moment a range reproduced. Endpoint trials after it are fresh evidence, free of the
    reproduce check's selection (it stopped on a large estimate)."""

    counts: tuple[int, int]  # trials at the good and the bad endpoint then
    diff: float  # the signed-log change estimated then
    at_trial: int  # trials spent in all then


@dataclass
class Segment:
    """One range being searched for (at most) one culprit. Mutable bookkeeping, not a record."""

    lo: int
    hi: int
    target: float | None = None  # unexplained signed-log change a sub-range may hold
    reproduction: Reproduction | None = None
    outcome: str | None = None  # found | no_change | not_reproducible | reversed | inconclusive
    culprit: Culprit | None = None
    note: str = ""
    opened_at: int = 0  # trials spent before this range was opened
    fresh_pair: tuple[int, int] | None = None  # the (parent, culprit) under verification
    fresh: dict[int, list[float]] = field(default_factory=dict)  # its verify-phase trials

    @property
    def active(self) -> bool:
        return self.outcome is None

    @property
    def reproduced(self) -> bool:
        return self.reproduction is not None
