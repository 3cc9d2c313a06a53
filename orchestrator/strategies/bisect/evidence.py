"""Everything the bisection has measured, trial by trial, and what it makes of it.

Values are kept on the *signed log scale*: ``log(value)`` when the regression is an increase
(latency), ``-log(value)`` when it is a decrease (throughput), so "bad" is always "higher" and one
restart-level sigma fits every point (multiplicative noise). They are shifted by the first value
seen so that sums of squares stay precise; differences and variances do not care.

Each trial keeps its order, its system epoch and its time block, and a status: kept, an
outlier, or a pending surprise (:mod:`.outliers`); only kept trials enter a likelihood,
and the others stay listed. Comparisons between points go through one level fit that is robust
to drift and to system changes (:mod:`.levels`); with clean data it is the plain
pooled-variance t-interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.stats.effect import LogDifference, log_difference, weighted_log_difference
from orchestrator.strategies.base import Observation
from orchestrator.strategies.bisect.levels import LevelFit, fit_levels
from orchestrator.strategies.bisect.outliers import KEPT, OUTLIER, PENDING, flag_trials
from orchestrator.strategies.bisect.posterior import PointStats

BLOCK_TRIALS = 6  # trials per drift block (a load step of 30 trials spans five)


@dataclass(frozen=True)
class FlaggedTrial:
    """A measured trial left out of the likelihood, and why."""

    index: int  # position among the strategy's observations
    trial_id: int | None
    point: int
    status: str  # "outlier" | "pending"
    ratio: float  # its reading over its commit's (or the nearest) level, raw metric units


class Evidence:
    """Everything learned so far, indexed by trial; fed one observation at a time."""

    def __init__(self, n: int, sign: float, outlier_k: float = 4.5) -> None:
        self.n = n
        self.sign = sign
        self.outlier_k = outlier_k
        self.failures = np.zeros(n, dtype=np.int64)
        self.n_trials = 0
        self.version = 0  # bumped on every change that can move a posterior
        self._shift: float | None = None
        self._points: list[int] = []
        self._values: list[float] = []
        self._epochs: list[int] = []
        self._orders: list[int] = []
        self._ids: list[int | None] = []
        self._reps: list[int] = []
        self._spreads: list[float | None] = []
        self._cache: dict[str, object] = {}
        self._cache_version = -1

    # ------------------------------------------------------------------------------ input

    @property
    def shift(self) -> float | None:
        return self._shift

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
        order = self.n_trials
        self.n_trials += 1
        if observation.value is None:
            self.failures[point] += 1
            self.version += 1
            return
        if observation.suspect:
            return
        value = float(observation.value)
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(
                f"trial value {value!r} at point {point}: the metric must be positive and finite"
            )
        self._points.append(point)
        self._values.append(self.signed_log(value))
        self._epochs.append(int(getattr(observation, "epoch", 0) or 0))
        self._orders.append(order)
        self._ids.append(observation.trial_id)
        self._reps.append(int(getattr(observation, "repetitions", 0) or 0))
        self._spreads.append(getattr(observation, "spread", None))
        self.version += 1

    # ------------------------------------------------------------------------- derived

    def _cached(self, key: str, build):
        if self._cache_version != self.version:
            self._cache = {}
            self._cache_version = self.version
        if key not in self._cache:
            self._cache[key] = build()
        return self._cache[key]

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        def build():
            return (np.asarray(self._points, dtype=np.int64),
                    np.asarray(self._values, dtype=float),
                    np.asarray(self._epochs, dtype=np.int64),
                    np.asarray(self._orders, dtype=np.int64))
        return self._cached("arrays", build)

    def status(self) -> np.ndarray:
        """Per measured trial: KEPT, OUTLIER or PENDING."""
        def build():
            points, values, _, _ = self._arrays()
            status, _ = flag_trials(points, values, self.outlier_k)
            return status
        return self._cached("status", build)

    def kept(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Points, values, time blocks and epochs of the kept trials."""
        def build():
            points, values, epochs, orders = self._arrays()
            keep = self.status() == KEPT
            blocks = epochs * 1_000_000 + orders // BLOCK_TRIALS
            return points[keep], values[keep], blocks[keep], epochs[keep]
        return self._cached("kept", build)

    def point_stats(self) -> PointStats:
        def build():
            points, values, _, _ = self.kept()
            return PointStats(
                np.bincount(points, minlength=self.n).astype(float),
                np.bincount(points, weights=values, minlength=self.n),
                np.bincount(points, weights=values**2, minlength=self.n),
            )
        return self._cached("stats", build)

    def levels(self) -> LevelFit | None:
        def build():
            points, values, blocks, epochs = self.kept()
            weights = self.kept_weights()
            if weights is None:
                return self._plain_levels()
            return fit_levels(points, values, blocks, epochs, weights=weights)
        return self._cached("levels", build)

    def _plain_levels(self) -> LevelFit | None:
        def build():
            points, values, blocks, epochs = self.kept()
            return fit_levels(points, values, blocks, epochs)
        return self._cached("plain_levels", build)

    def kept_weights(self) -> np.ndarray | None:
        """Relative precision of each kept trial, or None when all weigh alike (one repetition
        count for every trial, or counts not known: the plain model, exactly).

        A trial averaging ``n`` repetitions has variance ``sigma_r^2 + sigma_e^2 / n``. The
        repetition component is the pooled sample variance of the trials' repetitions; the
        restart component is what the unweighted level fit's noise leaves beyond it. Weights
        are relative to a trial of the latest count (the one the next trials run), so the
        model's sigma stays the noise of the next trial."""
        def build():
            reps = np.asarray(self._reps, dtype=np.int64)[self.status() == KEPT]
            known = reps[reps > 0]
            if known.size == 0 or np.all(known == known[0]):
                return None
            num = den = 0.0
            for n, spread in zip(self._reps, self._spreads, strict=True):
                if n >= 2 and spread is not None and math.isfinite(spread):
                    num += (n - 1) * spread
                    den += n - 1
            plain = self._plain_levels()
            if den <= 0 or plain is None or not math.isfinite(plain.sigma2):
                return None
            var_e = num / den
            var_r = max(plain.sigma2 - var_e * float(np.mean(1.0 / known)),
                        0.05 * plain.sigma2, 1e-12)
            n_ref = next((n for n in reversed(self._reps) if n > 0), int(known[0]))
            n_eff = np.where(reps > 0, reps, n_ref).astype(float)
            return (var_r + var_e / n_ref) / (var_r + var_e / n_eff)
        return self._cached("weights", build)

    # ----------------------------------------------------------------------------- queries

    @property
    def counts(self) -> np.ndarray:
        return self.point_stats().counts

    def count(self, point: int) -> int:
        return int(self.point_stats().counts[point])

    def values_at(self, point: int) -> list[float]:
        """Kept values at a point, in trial order."""
        points, values, _, _ = self.kept()
        return values[points == point].tolist()

    def values_since(self, point: int, order: int) -> list[float]:
        """Kept values at a point from trials at or after observation ``order``."""
        points, values, _, _ = self.kept()
        return values[(points == point) & (self.kept_orders() >= order)].tolist()

    def weighted_since(self, point: int, order: int, until: int | None = None
                       ) -> tuple[float, float] | None:
        """``(mean, sum of weights)`` of the kept values at a point from trials at or after
        observation ``order`` (and before ``until``), each weighed by its relative precision
        (:meth:`kept_weights`; all 1 when every trial ran one repetition count), so that the
        mean's variance is the model's ``sigma^2 / sum of weights``. None if there are none."""
        points, values, _, _ = self.kept()
        orders = self.kept_orders()
        at = (points == point) & (orders >= order)
        if until is not None:
            at &= orders < until
        if not at.any():
            return None
        precision = self.kept_weights()
        w = np.ones(int(at.sum())) if precision is None else precision[at]
        return float((w * values[at]).sum() / w.sum()), float(w.sum())

    def kept_orders(self) -> np.ndarray:
        def build():
            _, _, _, orders = self._arrays()
            return orders[self.status() == KEPT]
        return self._cached("kept_orders", build)

    def epoch_count(self, point: int, epoch: int) -> int:
        points, _, _, epochs = self.kept()
        return int(((points == point) & (epochs == epoch)).sum())

    @property
    def latest_epoch(self) -> int:
        return max(self._epochs) if self._epochs else 0

    @property
    def epochs_seen(self) -> list[int]:
        return sorted(set(self._epochs))

    def first_trial_of_epoch(self, epoch: int) -> int | None:
        """The first measured trial of an epoch: its trial id, else its position."""
        for order, e, trial_id in zip(self._orders, self._epochs, self._ids, strict=True):
            if e == epoch:
                return trial_id if trial_id is not None else order
        return None

    def untestable(self, point: int) -> bool:
        """Failed to run and never measured: skipped like ``git bisect skip``."""
        return bool(self.failures[point] > 0 and point not in set(self._points))

    def untestable_mask(self, lo: int = 0, hi: int | None = None) -> np.ndarray:
        """Per point of ``lo..hi``: untestable (read-only; made once per change of evidence)."""
        def build():
            measured = np.bincount(np.asarray(self._points, dtype=np.int64),
                                   minlength=self.n) > 0
            mask = (self.failures > 0) & ~measured
            mask.flags.writeable = False
            return mask
        mask = self._cached("untestable", build)
        return mask if lo == 0 and hi is None else mask[lo : (self.n - 1 if hi is None else hi) + 1]

    def stats(self, lo: int, hi: int) -> PointStats:
        s = self.point_stats()
        return PointStats(s.counts[lo : hi + 1].copy(), s.sums[lo : hi + 1].copy(),
                          s.squares[lo : hi + 1].copy())

    def pending_points(self) -> list[int]:
        points, _, _, _ = self._arrays()
        return sorted(set(points[self.status() == PENDING].tolist()))

    def left_out_at(self, point: int) -> list[float]:
        """Values of a point's trials left out (outlier or pending), in trial order."""
        points, values, _, _ = self._arrays()
        return values[(points == point) & (self.status() != KEPT)].tolist()

    def flagged(self) -> list[FlaggedTrial]:
        """Every measured trial left out as an outlier or a pending surprise."""
        points, values, _, orders = self._arrays()
        status = self.status()
        kept = status == KEPT
        out = []
        for i in np.flatnonzero(~kept):
            point = int(points[i])
            same = kept & (points == point)
            level = float(np.median(values[same])) if same.any() else float(
                np.median(values[kept])) if kept.any() else float(values[i])
            ratio = math.exp(self.sign * (float(values[i]) - level))
            name = "outlier" if status[i] == OUTLIER else "pending"
            out.append(FlaggedTrial(int(orders[i]), self._ids[i], point, name, ratio))
        return out

    def sigma(self) -> float:
        fit = self.levels()
        if fit is not None and math.isfinite(fit.sigma):
            return fit.sigma
        return math.nan

    def drift_weight(self) -> float:
        fit = self.levels()
        return fit.drift_weight if fit is not None else 0.0

    def r_weights(self) -> tuple[tuple[float, float], ...]:
        """The drift grid's weights for the change-point posterior: no drift unless the level
        fit finds drift more likely than not (clean data then keep the plain posterior)."""
        fit = self.levels()
        if fit is None or fit.drift_weight <= 0.5:
            return ((0.0, 1.0),)
        return fit.r_weights

    def compare(self, before: int, after: int, confidence: float) -> LogDifference | None:
        """Signed log difference ``after - before`` with an interval from the level fit; a
        point measured once is compared through its reading and the fit's noise."""
        return self.contrast({after: 1.0, before: -1.0}, confidence)

    def contrast(self, weights: dict[int, float], confidence: float) -> LogDifference | None:
        if any(self.count(p) == 0 for p in weights):
            return None
        fit = self.levels()
        if fit is not None:
            exact = fit.contrast(weights, confidence)
            if exact is not None:
                return exact
        # Some point is measured once (or nothing is replicated): plain means, fitted noise.
        points, values, _, _ = self.kept()
        precision = self.kept_weights()
        est = 0.0
        var_units = 0.0
        for point, w in weights.items():
            at = points == point
            vals = values[at]
            if precision is None:
                est += w * float(vals.mean())
                var_units += w * w / vals.size
            else:
                prec = precision[at]
                est += w * float((prec * vals).sum() / prec.sum())
                var_units += w * w / float(prec.sum())
        sigma2 = fit.sigma2 if fit is not None else math.nan
        df = fit.df if fit is not None else 0
        if not math.isfinite(sigma2) or df <= 0:
            return LogDifference(est, -math.inf, math.inf, math.inf, 0)
        from scipy.stats import t as student_t

        se = math.sqrt(sigma2 * var_units)
        half = float(student_t.ppf(0.5 + confidence / 2.0, df)) * se
        return LogDifference(est, est - half, est + half, se, df)

    def pooled_difference(self, before: Sequence[float], after: Sequence[float],
                          confidence: float, w_before: Sequence[float] | None = None,
                          w_after: Sequence[float] | None = None) -> LogDifference:
        """Two sets of values compared with the run's pooled restart noise; with weights
        (relative precisions, :meth:`kept_weights`), a trial of more repetitions weighs more."""
        fit = self.levels()
        extra = (fit.sigma2 * fit.df, fit.df) if fit is not None and fit.df > 0 else (0.0, 0)
        if w_before is None or w_after is None:
            return log_difference(before, after, confidence, *extra)
        return weighted_log_difference(before, after, w_before, w_after, confidence, *extra)

    def epoch_difference(self, before: int, after: int, epoch: int,
                         confidence: float) -> LogDifference:
        """``after - before`` from their trials in ``epoch`` alone (the system as it is now),
        each trial weighed by its precision when repetition counts differ."""
        points, values, _, epochs = self.kept()
        weights = self.kept_weights()
        at_b = (points == before) & (epochs == epoch)
        at_a = (points == after) & (epochs == epoch)
        if weights is None:
            return self.pooled_difference(values[at_b].tolist(), values[at_a].tolist(),
                                          confidence)
        return self.pooled_difference(values[at_b].tolist(), values[at_a].tolist(), confidence,
                                      weights[at_b].tolist(), weights[at_a].tolist())

    def to_pct(self, signed_log: float) -> float:
        """A signed log difference as a percentage change of the raw metric."""
        return 100.0 * math.expm1(self.sign * signed_log)

    def ci_pct(self, lo: float, hi: float) -> tuple[float, float]:
        ends = sorted((self.to_pct(lo), self.to_pct(hi)))
        return ends[0], ends[1]
