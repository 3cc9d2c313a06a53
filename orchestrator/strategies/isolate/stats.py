"""Trial evidence keyed by subset of differences, and the contrasts the isolate strategy tests.

Values are kept on the *signed log scale* (``log(value)`` when the regression is an increase,
``-log(value)`` when it is a decrease), as in :mod:`orchestrator.strategies.bisect.evidence`: "bad" is
always "higher" and restart-level noise, being multiplicative, has one variance for every
configuration of a run. That variance is pooled over every subset measured so far, which is what
lets a comparison decide from two or three restarts per side.

Every question the strategy asks is a linear contrast of subset means (``effect of adding X to
good`` = mean(X) - mean(good); the interaction of a pair = mean(ij) - mean(i) - mean(j) +
mean(good)), answered with a Student-t posterior under a flat prior on the contrast: with the
pooled variance ``s^2`` on ``df`` degrees of freedom, ``(true - estimate) / se`` is t-distributed.
Routing decisions (which test to run next) use that flat-prior posterior; the claims an answer
makes (this difference hurts, nothing else matters) use the spike-and-slab posterior of
:class:`EffectPrior`, which is what the probabilities in an isolate verdict are.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from scipy.special import log_ndtr, ndtr, ndtri, stdtr, stdtrit

from orchestrator.stats.lifetimes import Cell, SplitPlot, components, kept
from orchestrator.strategies.base import Observation

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_Z975 = float(ndtri(0.975))


def _normal_logpdf(x: float, scale: float) -> float:
    return -0.5 * (x / scale) ** 2 - math.log(scale) - _LOG_SQRT_2PI

Subset = frozenset[int]

PRESENT = "present"
ABSENT = "absent"


@dataclass(frozen=True)
class Contrast:
    """A linear combination of subset means (signed log scale) with its t-posterior."""

    estimate: float
    se: float
    df: float

    def prob_above(self, threshold: float) -> float:
        """Posterior probability that the true contrast exceeds ``threshold``."""
        return self._cdf(self.estimate - threshold)

    def prob_below(self, threshold: float) -> float:
        """Posterior probability that the true contrast is below ``threshold``."""
        return self._cdf(threshold - self.estimate)

    def interval(self, confidence: float) -> tuple[float, float]:
        if self.df <= 0 or not math.isfinite(self.se):
            return -math.inf, math.inf
        half = float(stdtrit(self.df, 0.5 + confidence / 2.0)) * self.se
        return self.estimate - half, self.estimate + half

    def _cdf(self, margin: float) -> float:
        if self.se == 0.0:
            return 1.0 if margin > 0 else (0.0 if margin < 0 else 0.5)
        if self.df <= 0 or not math.isfinite(self.se):
            return 0.5
        return float(stdtr(self.df, margin / self.se))


@dataclass(frozen=True)
class EffectPrior:
    """Spike-and-slab prior of an effect: exactly zero with probability ``null``, otherwise
    half-normal with scale ``scale`` in the bad direction (signed log scale).

    Most differences between two configurations are harmless, exactly: the spike says so. It is
    also what keeps decisions honest when they are checked after every trial: the posterior of
    "no effect" does not erode under optional stopping the way a flat-prior probability of
    "effect > 0" does, so a run of lucky readings does not invent a cause.
    """

    null: float
    scale: float

    def __post_init__(self) -> None:
        if not 0.0 < self.null < 1.0 or not self.scale > 0.0:
            raise ValueError(f"bad effect prior {self}")


def _effective_se(contrast: Contrast) -> float:
    """The standard error widened so a normal likelihood has the t's 95% quantile (few df)."""
    if contrast.df >= 1e6:
        return contrast.se
    widen = float(stdtrit(contrast.df, 0.975)) / _Z975
    return contrast.se * widen


def posterior_present(contrast: Contrast, prior: EffectPrior) -> float:
    """Posterior probability that the effect is not zero (then positive, by the slab)."""
    if contrast.df <= 0 or not math.isfinite(contrast.se):
        return 1.0 - prior.null
    if contrast.se == 0.0:
        return 1.0 if contrast.estimate > 0 else 0.0
    x, s, tau = contrast.estimate, _effective_se(contrast), prior.scale
    spread = math.hypot(s, tau)
    log_null = math.log(prior.null) + _normal_logpdf(x, s)
    log_slab = (
        math.log1p(-prior.null) + math.log(2.0) + _normal_logpdf(x, spread)
        + float(log_ndtr(x * tau / (s * spread)))
    )
    return float(1.0 / (1.0 + math.exp(min(log_null - log_slab, 700.0))))


def posterior_below(contrast: Contrast, prior: EffectPrior, threshold: float) -> float:
    """Posterior probability that the effect is below ``threshold`` (> 0): zero, or small."""
    present = posterior_present(contrast, prior)
    if contrast.df <= 0 or not math.isfinite(contrast.se):
        below_slab = 2.0 * float(ndtr(threshold / prior.scale)) - 1.0
    elif contrast.se == 0.0:
        below_slab = 1.0 if contrast.estimate < threshold else 0.0
    else:
        x, s, tau = contrast.estimate, _effective_se(contrast), prior.scale
        mean = x * tau**2 / (s**2 + tau**2)
        sd = s * tau / math.hypot(s, tau)
        # Truncated normal on (0, inf): P(effect < threshold) = 1 - S(b) / S(a).
        log_s_a = float(log_ndtr(mean / sd))
        log_s_b = float(log_ndtr((mean - threshold) / sd))
        below_slab = -math.expm1(log_s_b - log_s_a)
    return (1.0 - present) + present * below_slab


def decide(contrast: Contrast | None, tolerance: float, level: float, prior: EffectPrior
           ) -> str | None:
    """Three-way sequential decision on an effect: present, absent, or None (unresolved).

    Present: the effect is not zero with posterior probability ``level``. Absent: it is below
    the smallest effect worth naming (``tolerance``) with probability ``level``. When both hold
    (a real but small effect, once the data are plentiful) the estimate decides against
    ``tolerance / 2``.
    """
    if contrast is None:
        return None
    present = posterior_present(contrast, prior) >= level
    absent = posterior_below(contrast, prior, tolerance) >= level
    if present and absent:
        return PRESENT if contrast.estimate >= tolerance / 2.0 else ABSENT
    if present:
        return PRESENT
    if absent:
        return ABSENT
    return None


def claim_probability(contrast: Contrast | None, claim: str, tolerance: float,
                      prior: EffectPrior) -> float:
    """Posterior probability of a claim: the effect is real (present) or below tolerance."""
    if contrast is None:
        return 0.0
    if claim == PRESENT:
        return posterior_present(contrast, prior)
    return posterior_below(contrast, prior, tolerance)


class SubsetEvidence:
    """Trial results per subset (failures, suspect trials, signed log values).

    ``live``: the differences measured within server lifetimes (several subsets per
    lifetime, :mod:`orchestrator.stats.lifetimes`); an observation that carries
    its ``lifetime`` is one of those, and contrasts then follow the split-plot model. Without
    any such observation every contrast is the plain pooled one."""

    def __init__(self, sign: float, live: frozenset[int] = frozenset()) -> None:
        self.sign = sign
        self.live = frozenset(live)
        self.failures: Counter[Subset] = Counter()
        self.trials: Counter[Subset] = Counter()  # every trial, suspect and failed included
        self.n_trials = 0  # server lifetimes (restarts), each counted once
        self._pooled: tuple[int, tuple[float, int]] | None = None
        self.version = 0
        self.cells: dict[int, dict[Subset, Cell]] = {}  # lifetime -> its subsets' values
        self._lifetimes_seen: set[int] = set()
        self._split: tuple[int, SplitPlot | None] | None = None
        self._kept: tuple[int, tuple[dict, dict]] | None = None

    def add(self, subset: Subset, observation: Observation) -> bool:
        """Record one trial; True when it added a measured value."""
        lifetime = getattr(observation, "lifetime", None)
        if lifetime is None or lifetime not in self._lifetimes_seen:
            self.n_trials += 1
            if lifetime is not None:
                self._lifetimes_seen.add(lifetime)
        self.trials[subset] += 1
        if observation.value is None:
            self.failures[subset] += 1
            return False
        if observation.suspect:
            return False
        value = float(observation.value)
        if not math.isfinite(value) or value <= 0.0:
            raise ValueError(f"trial value {value!r}: the metric must be positive and finite")
        signed = self.sign * math.log(value)
        key = lifetime if lifetime is not None else -(self.version + 1)
        self.cells.setdefault(key, {})[subset] = Cell(
            signed, observation.spread, int(observation.repetitions or 0))
        self.version += 1
        return True

    def group(self, subset: Subset) -> Subset:
        """The restart-level configuration of a subset (its differences that need a restart)."""
        return subset - self.live

    def split_plot(self) -> SplitPlot | None:
        """The split-plot fit, once some lifetime measured more than one subset."""
        if self._split is not None and self._split[0] == self.version:
            return self._split[1]
        fit = None
        if self.live and any(len(c) > 1 for c in self.cells.values()):
            cells, values = self._screened()
            fit = SplitPlot(cells, components(cells, values))
        self._split = (self.version, fit)
        return fit

    def _screened(self) -> tuple[dict[int, dict[Subset, Cell]], dict[Subset, list[float]]]:
        """The cells and values without outlier lifetimes (a launch 3x slow throughout:
        :func:`~orchestrator.stats.lifetimes.outlier_lifetimes`); they still count as spent.
        Without live differences each restart is a lifetime of one cell, judged against the
        other restarts of its subset, as the bisect judges a commit's restarts."""
        if self._kept is not None and self._kept[0] == self.version:
            return self._kept[1]
        self._kept = (self.version, kept(self.cells))
        return self._kept[1]

    @property
    def values(self) -> dict[Subset, list[float]]:
        """Each subset's kept values (signed log): outlier restarts left out."""
        return self._screened()[1]

    def count(self, subset: Subset) -> int:
        """Kept values of `subset` (an outlier restart is spent, not evidence)."""
        return len(self.values.get(subset, ()))

    def attempts(self, subset: Subset) -> int:
        """Trials that produced a value or failed (suspect trials are not attempts)."""
        return self.count(subset) + self.failures[subset]

    def untestable(self, subset: Subset, max_failures: int) -> bool:
        """Failed ``max_failures`` times and never measured (e.g. a patch that does not apply)."""
        return self.failures[subset] >= max_failures and self.count(subset) == 0

    def mean(self, subset: Subset) -> float:
        split = self.split_plot()
        if split is not None and subset in split.index:
            return split.means()[subset]
        values = self.values[subset]
        return math.fsum(values) / len(values)

    def pooled(self) -> tuple[float, int]:
        """Within-subset sum of squares and degrees of freedom over every subset."""
        if self._pooled is not None and self._pooled[0] == self.version:
            return self._pooled[1]
        ss, df = 0.0, 0
        for values in self.values.values():
            if len(values) > 1:
                mean = math.fsum(values) / len(values)
                ss += math.fsum((v - mean) ** 2 for v in values)
                df += len(values) - 1
        self._pooled = (self.version, (ss, df))
        return ss, df

    def sigma(self) -> float:
        ss, df = self.pooled()
        return math.sqrt(ss / df) if df > 0 else math.nan

    def difference(self, before: Subset, after: Subset) -> Contrast | None:
        """``mean(after) - mean(before)`` with the run's pooled restart variance: the pooled
        t-interval of :func:`orchestrator.stats.effect.log_difference` with every other subset's
        replicates as extra degrees of freedom."""
        if before == after:
            return Contrast(0.0, 0.0, math.inf) if self.count(before) else None
        return self.contrast({after: 1.0, before: -1.0})

    def contrast(self, weights: Mapping[Subset, float]) -> Contrast | None:
        """``sum(weight * mean(subset))`` with the pooled variance (None: a subset unmeasured)."""
        weights = {s: w for s, w in weights.items() if w != 0.0}
        if any(self.count(s) == 0 for s in weights):
            return None
        split = self.split_plot()
        if split is not None:
            found = split.contrast(weights)
            return None if found is None else Contrast(*found)
        estimate = math.fsum(w * self.mean(s) for s, w in weights.items())
        ss, df = self.pooled()
        if df == 0:
            return Contrast(estimate, math.inf, 0)
        scale = math.fsum(w * w / self.count(s) for s, w in weights.items())
        return Contrast(estimate, math.sqrt(ss / df * scale), float(df))

    def most_informative(
        self, contrasts: Sequence[Mapping[Subset, float]], planned: Counter
    ) -> list[Subset]:
        """Subsets of some contrasts ordered by how much one more trial would tell.

        The score of a subset is the largest relative variance reduction it brings to any of the
        contrasts, ``(w^2/n - w^2/(n+1)) / sum(w_t^2/n_t)``, counting trials already in flight
        (``planned``) as done. So a comparison alternates its sides, a side with many trials
        (the good configuration) is left alone, and of two comparisons the vaguer one is fed.
        """
        scores: dict[Subset, float] = {}
        for weights in contrasts:
            counts = {s: self.count(s) + planned[s] for s, w in weights.items() if w != 0.0}
            if any(n == 0 for n in counts.values()):
                for subset, n in counts.items():
                    if n == 0:
                        scores[subset] = math.inf
                continue
            variance = math.fsum(weights[s] ** 2 / n for s, n in counts.items())
            for subset, n in counts.items():
                gain = weights[subset] ** 2 * (1.0 / n - 1.0 / (n + 1)) / variance
                scores[subset] = max(scores.get(subset, 0.0), gain)
        return sorted(scores, key=lambda s: (-scores[s], sorted(s)))

    def to_pct(self, signed_log: float) -> float:
        return 100.0 * math.expm1(self.sign * signed_log)

    def ci_pct(self, lo: float, hi: float) -> tuple[float, float]:
        ends = sorted((self.to_pct(lo), self.to_pct(hi)))
        return ends[0], ends[1]
