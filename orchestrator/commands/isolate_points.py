"""Isolate's points (subsets of the differences) and the candidates that launch them.

The isolate strategy speaks of subsets; the controller and the store speak of candidates. A
resumed run reads candidates back from its store and must find their subsets again, so the
mapping goes both ways, and it refuses two subsets that would launch one candidate.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping

from orchestrator.errors import SleuthError
from orchestrator.gpu.base import format_parts
from orchestrator.records import Candidate
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.system.differences import (
    KINDS,
    Change,
    apply,
    candidate_of,
    level_of,
    normalize,
)


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


class LiveIsolatePoints(IsolatePoints):
    """Isolate's points when some differences change on a running server
    (:mod:`orchestrator.system.runtime_settable`): a trial launches a subset's restart-level
    differences once, with the live ones left as the node is, and measures every combination
    of the live differences' levels in interleaved blocks within that lifetime
    (:mod:`orchestrator.runner.lifetime`). ``launch`` gives the trial of a point: the
    candidate to launch and the clock policy of each level; each level's block row is the
    candidate of its point (:mod:`orchestrator.run.blocks`)."""

    def __init__(self, strategy: IsolateStrategy, good: Mapping, changes: list[Change],
                 resolve: Callable[[str], str]):
        super().__init__(strategy, good, changes, resolve)
        self.live = sorted(strategy.live)
        self._launch_of: dict[str, frozenset[int]] = {}

    def launch(self, point: int) -> tuple[Candidate, tuple[str, ...]]:
        subset = self.strategy.subset(point)
        group = subset - frozenset(self.live)
        spec = copy.deepcopy(normalize(self.good))
        for i in sorted(group):
            KINDS[self.changes[i].factor].set(spec, self.changes[i].key, self.changes[i].bad)
        for i in self.live:  # launched as the node is; set within the lifetime
            spec["clock"].pop(self.changes[i].key, None)
        cand = candidate_of(spec, self.resolve)
        seen = self._launch_of.setdefault(cand.key, group)
        if seen != group:
            raise SleuthError("two restart-level configurations of this isolate launch the same"
                              f" candidate ({cand.label}): a difference is not applied to it")
        return cand, tuple(self._level(mask) for mask in range(2 ** len(self.live)))

    def _level(self, mask: int) -> str:
        parts = {}
        for j, i in enumerate(self.live):
            c = self.changes[i]
            level = c.bad if mask >> j & 1 else c.good
            if level is not None:
                parts[c.key] = str(level)
        return format_parts(parts)
