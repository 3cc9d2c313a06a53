"""Isolate's points (subsets of the differences) and the candidates that launch them.

The isolate strategy speaks of subsets; the controller and the store speak of candidates. A
resumed run reads candidates back from its store and must find their subsets again, so the
mapping goes both ways, and it refuses two subsets that would launch one candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from orchestrator.errors import SleuthError
from orchestrator.records import Candidate
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.system.differences import Change, apply, level_of


class IsolatePoints:
    """Strategy points (subsets of changes) <-> candidates, both ways (resume needs both)."""

    def __init__(self, strategy: IsolateStrategy, good: Mapping, changes: list[Change],
                 resolve: Callable[[str], str]):
        self.strategy, self.good, self.changes, self.resolve = strategy, good, changes, resolve
        self._subset_of_key: dict[str, frozenset[int]] = {}

    def candidate(self, point: int) -> Candidate:
        """The candidate of a point. Two subsets must never launch one candidate: its trials
        would count for one of them only, and the other would be asked for again and again."""
        subset = self.strategy.subset(point)
        cand = apply(self.good, self.changes, subset, self.resolve)
        seen = self._subset_of_key.setdefault(cand.key, subset)
        if seen != subset:
            raise SleuthError(
                "two configurations of this isolate launch the same candidate "
                f"({self.strategy.describe_subset(seen)} and "
                f"{self.strategy.describe_subset(subset)}: {cand.label}): a difference is not"
                " applied to the candidate")
        return cand

    def subset_of(self, cand: Candidate) -> frozenset[int]:
        return frozenset(i for i, c in enumerate(self.changes)
                         if level_of(c, cand, self.resolve))

    def point(self, cand: Candidate) -> int | None:
        subset = self.subset_of(cand)
        if self.candidate(self.strategy.point_of(subset)).key != cand.key:
            return None  # not a candidate of this experiment
        return self.strategy.point_of(subset)
