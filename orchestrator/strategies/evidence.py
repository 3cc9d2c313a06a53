"""Per-point bookkeeping of trial results for the bisection strategy.

Values are kept on the *signed log scale*: ``log(value)`` when the regression is an increase
(latency), ``-log(value)`` when it is a decrease (throughput), so "bad" is always "higher" and one
restart-level sigma fits every point (multiplicative noise). They are shifted by the first value
seen so that sums of squares stay precise; differences and variances do not care.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from orchestrator.stats.effect import LogDifference, log_difference
from orchestrator.strategies.base import Observation
from orchestrator.strategies.posterior import PointStats


class Evidence:
    """Everything learned so far, indexed by point; fed one observation at a time."""

    def __init__(self, n: int, sign: float) -> None:
        self.n = n
        self.sign = sign
        self.values: list[list[float]] = [[] for _ in range(n)]
        self.counts = np.zeros(n)
        self.sums = np.zeros(n)
        self.squares = np.zeros(n)
        self.failures = np.zeros(n, dtype=np.int64)
        self.n_trials = 0
        self.n_suspect = 0
        self.version = 0  # bumped on every change that can move a posterior
        self._shift: float | None = None

    def signed_log(self, value: float) -> float:
        """A raw trial value on the shifted signed log scale used everywhere here."""
        raw = self.sign * math.log(value)
        if self._shift is None:
            self._shift = raw
        return raw - self._shift

    def add(self, observation: Observation) -> None:
        point = observation.point
        if not 0 <= point < self.n:
            raise ValueError(f"observation point {point} outside 0..{self.n - 1}")
        self.n_trials += 1
        if observation.value is None:
            self.failures[point] += 1
            self.version += 1
            return
        if observation.suspect:
            self.n_suspect += 1
            return
        value = float(observation.value)
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(
                f"trial value {value!r} at point {point}: the metric must be positive and finite"
            )
        shifted = self.signed_log(value)
        self.values[point].append(shifted)
        self.counts[point] += 1
        self.sums[point] += shifted
        self.squares[point] += shifted * shifted
        self.version += 1

    def count(self, point: int) -> int:
        return len(self.values[point])

    def untestable(self, point: int) -> bool:
        """Failed to run and never measured: skipped like ``git bisect skip``."""
        return bool(self.failures[point] > 0 and self.counts[point] == 0)

    def untestable_mask(self, lo: int, hi: int) -> np.ndarray:
        return (self.failures[lo : hi + 1] > 0) & (self.counts[lo : hi + 1] == 0)

    def stats(self, lo: int, hi: int) -> PointStats:
        return PointStats(
            self.counts[lo : hi + 1].copy(),
            self.sums[lo : hi + 1].copy(),
            self.squares[lo : hi + 1].copy(),
        )

    def pooled_within(self, exclude: Sequence[int] = ()) -> tuple[float, int]:
        """Within-point sum of squares and degrees of freedom over all points but ``exclude``.

        Replicates at one point differ only by restart-level noise, whatever the number of
        culprits, so this variance estimate stays honest when the change-point model does not.
        """
        replicated = self.counts >= 2
        for point in exclude:
            replicated[point] = False
        counts = self.counts[replicated]
        ss = self.squares[replicated] - self.sums[replicated] ** 2 / counts
        return float(np.maximum(ss, 0.0).sum()), int((counts - 1).sum())

    def compare(self, before: int, after: int, confidence: float) -> LogDifference | None:
        """Signed log difference ``after - before`` with a pooled-variance interval."""
        if not self.values[before] or not self.values[after]:
            return None
        extra_ss, extra_df = self.pooled_within(exclude=(before, after))
        return log_difference(
            self.values[before], self.values[after], confidence, extra_ss, extra_df
        )

    def sigma(self) -> float:
        ss, df = self.pooled_within()
        return math.sqrt(ss / df) if df > 0 else math.nan

    def to_pct(self, signed_log: float) -> float:
        """A signed log difference as a percentage change of the raw metric."""
        return 100.0 * math.expm1(self.sign * signed_log)

    def ci_pct(self, lo: float, hi: float) -> tuple[float, float]:
        ends = sorted((self.to_pct(lo), self.to_pct(hi)))
        return ends[0], ends[1]
