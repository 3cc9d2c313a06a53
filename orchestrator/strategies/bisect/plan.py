"""Bookkeeping of the bisect strategy's state, shared by its phase modules.

Mutable state the strategy rebuilds by replaying observations, not records: the records a run
keeps are the observations themselves and the verdict.

A run is one reproduction of the endpoints' change, then a sequence of *stages*: stage 0
looks for the culprit of the change being chased, every later stage for one more step
(either way) that the culprits found so far leave unexplained. A stage ends with a culprit
(``found``), with the evidence that nothing more is there (``closed``), or with a change it
could not pin on one commit within its allowance (``spread``).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.stats.effect import LogDifference
from orchestrator.strategies.base import Culprit


@dataclass(frozen=True)
class Reproduction:
    """The moment the endpoints' change reproduced. Endpoint trials after it are fresh
    evidence, free of the reproduce check's selection (it stopped on a large estimate)."""

    counts: tuple[int, int]  # kept trials at the good and the bad endpoint then
    diff: float  # the signed-log change estimated then
    at_trial: int  # trials spent in all then
    ci: tuple[float, float] = (0.0, 0.0)  # its interval then (signed log)


@dataclass
class Stage:
    """One search for one culprit. Mutable bookkeeping, not a record."""

    index: int
    opened_at: int  # trials spent when it opened
    outcome: str | None = None  # found | closed | spread
    culprit: Culprit | None = None
    sign: float = 1.0  # direction of the step found (signed log), +1 = the bad direction
    note: str = ""
    # The (culprit, parents) under head-to-head verification and the trial count when it
    # started: trials from then on are interleaved in time, so drift hits both sides alike.
    verify_pair: tuple[int, ...] | None = None
    verify_since: int = 0
    # The trial count when the head-to-head first met every condition to name the culprit:
    # naming waits for fresh trials after it that leave the posterior above the confidence.
    held_since: int | None = None

    @property
    def active(self) -> bool:
        return self.outcome is None


@dataclass(frozen=True)
class Remainder:
    """The change between two anchors that the named culprits between them do not explain."""

    lo: int
    hi: int
    diff: LogDifference
    p_value: float

    @property
    def flagged(self) -> bool:
        """Its interval (the one it was computed with) excludes zero."""
        return self.diff.lo > 0.0 or self.diff.hi < 0.0
