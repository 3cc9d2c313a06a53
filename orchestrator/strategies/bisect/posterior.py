"""Posterior over the first bad commit from a continuous metric.

Model (per searched range ``lo..hi``). Hypothesis ``c`` ("commit c is the first bad one",
``lo < c <= hi``) says every trial at a point ``p < c`` is ``mu + e`` and every trial at
``p >= c`` is ``mu + delta + e``, with ``e ~ N(0, sigma^2)`` on the signed log scale: restart noise
on latencies is multiplicative, so one sigma fits both levels. "No change" says every trial is
``mu + e``. The good level, the step and sigma are unknown and integrated out: flat prior on
``mu``, ``p(sigma) ~ 1/sigma``, and a half-normal step ``delta ~ N+(0, g sigma^2)`` in the bad
direction. With ``S_xx = n_L n_R / N`` and ``S_xy = S_xx (mean_R - mean_L)`` (n_L/n_R trials left
and right of ``c``, N in all, ``S_yy`` the total sum of squares):

    log p(data | c)    = -1/2 log(1 + g S_xx) - (N-1)/2 log Q(c) + log 2 P(delta > 0 | c, data)
    Q(c)               = S_yy - S_xy^2 / (S_xx + 1/g)
    log p(data | none) = -(N-1)/2 log S_yy                       (same constants)

A proper step prior is what makes "no change" comparable with "a step at c" (the range of a
second culprit may hold none); the half keeps noise dips from posing as culprits; integrating
sigma out gives Student-t tails, so one unlucky trial moves the posterior less than a plug-in
normal would. It is the Bayesian single change-point posterior: all hypotheses at once from
cumulative sums, O(n + N) per update, vectorised. The benchmark checks that it is calibrated.

Untestable points are simply absent from the data: hypotheses ``c`` and ``c + 1`` cannot be told
apart when point ``c`` is untestable, so they form one *block*; the answer is then a range.

Where to measure next, given this posterior, is :mod:`orchestrator.strategies.bisect.placement`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

import numpy as np
from scipy.special import log_ndtr as _log_ndtr
from scipy.stats import t as _student_t


@dataclass(frozen=True)
class PriorSums:
    """Cumulative prior mass and prior ``p log p`` over hypotheses, for grouping them into
    cells (:func:`placement._cells`) without a pass over every hypothesis."""

    cum_p: np.ndarray
    cum_plogp: np.ndarray
    log_scale: float

    @classmethod
    def of(cls, log_prior_steps: np.ndarray) -> PriorSums:
        scale = float(log_prior_steps.max())
        prior = np.exp(log_prior_steps - scale)
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(prior > 0, prior * np.log(prior), 0.0)
        return cls(
            np.concatenate(([0.0], np.cumsum(prior))),
            np.concatenate(([0.0], np.cumsum(plogp))),
            scale,
        )


@dataclass(frozen=True)
class RangePrior:
    """The prior of a range's hypotheses, normalised with "no change" (:func:`range_log_prior`).
    It does not change between trials: one per range, its cumulative sums made once."""

    log_steps: np.ndarray  # log prior of hypotheses 1..size-1
    log_null: float

    @cached_property
    def sums(self) -> PriorSums:
        return PriorSums.of(self.log_steps)


@dataclass(frozen=True)
class RangeData:
    """Sufficient statistics of one range, centred at ``centre`` for numerical stability."""

    counts: np.ndarray  # trials per point (float)
    sums: np.ndarray  # sum of centred values per point
    squares: float  # sum of squared centred values
    g: float  # prior variance of the step in sigma^2 units
    log_prior_steps: np.ndarray  # log prior of hypotheses 1..size-1 (normalised with the null)
    log_prior_null: float
    prior: RangePrior | None = None  # where they came from, when the caller keeps it

    def prior_sums(self) -> PriorSums:
        if self.prior is not None and self.prior.log_steps is self.log_prior_steps:
            return self.prior.sums
        return PriorSums.of(self.log_prior_steps)


@dataclass(frozen=True)
class RangePosterior:
    """Posterior over the first bad point within ``lo..hi`` (index ``j`` is point ``lo + j``).

    ``mass[0]`` is always zero: the good endpoint cannot be the first bad point. ``null_mass`` is
    the probability that nothing in the range changed the metric. ``block_of[j]`` numbers the
    indistinguishable groups of hypotheses (see module docstring).
    """

    lo: int
    hi: int
    mass: np.ndarray
    null_mass: float
    block_of: np.ndarray
    data: RangeData | None = None

    def block_masses(self) -> np.ndarray:
        return np.bincount(self.block_of[1:], weights=self.mass[1:])

    def best_block(self) -> tuple[int, int, float]:
        """``(first_hyp, last_hyp, mass)`` of the most probable block, as absolute points."""
        masses = self.block_masses()
        best = int(np.argmax(masses))
        members = np.flatnonzero(self.block_of[1:] == best) + 1
        return self.lo + int(members[0]), self.lo + int(members[-1]), float(masses[best])

    def cdf(self) -> np.ndarray:
        """``cdf[j] = P(first bad <= lo + j)``: the chance that point ``lo + j`` reads bad.

        Under "no change" every point reads like the good endpoint, so ``cdf[-1]`` is
        ``1 - null_mass``. Computed once per posterior (read-only: callers share it).
        """
        cdf = self.__dict__.get("_cdf")
        if cdf is None:
            cdf = np.cumsum(self.mass)
            cdf.flags.writeable = False
            object.__setattr__(self, "_cdf", cdf)
        return cdf


def log_weights(
    n_left: np.ndarray,
    s_left: np.ndarray,
    total_n: np.ndarray | float,
    total_s: np.ndarray | float,
    total_q: np.ndarray | float,
    data: RangeData,
    exact_direction: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Unnormalised log posterior of each step hypothesis and of "no change".

    Broadcasts over leading axes (one row per imagined extra trial in the look-ahead).
    """
    n_right = total_n - n_left
    s_right = total_s - s_left
    syy = np.maximum(total_q - total_s**2 / total_n, 1e-300)
    sxx = n_left * n_right / total_n
    sxy = sxx * (s_right / n_right - s_left / n_left)
    shrink = sxx + 1.0 / data.g
    resid = np.maximum(syy - sxy**2 / shrink, 1e-12 * syy)
    dof = np.maximum(total_n - 1.0, 1.0)
    z = (sxy / shrink) / np.sqrt(resid / (dof * shrink))
    positive = _student_t.logcdf(z, dof) if exact_direction else _log_ndtr(z)
    log_steps = -0.5 * np.log1p(data.g * sxx) - 0.5 * dof * np.log(resid) + math.log(2.0)
    log_steps = log_steps + positive + data.log_prior_steps
    log_null = -0.5 * dof * np.log(syy) + data.log_prior_null
    return log_steps, log_null


@dataclass(frozen=True)
class PointStats:
    """Per-point trial counts, sums and sums of squares of signed log values (one range)."""

    counts: np.ndarray
    sums: np.ndarray
    squares: np.ndarray


def range_log_prior(log_prior: np.ndarray, null_prior: float) -> RangePrior:
    """The prior of a range's hypotheses (``log_prior``, entry 0 ignored) normalised to
    ``1 - null_prior``. It does not change between trials, so a caller that builds many
    :class:`RangeData` over one range computes it once."""
    prior = np.exp(log_prior[1:] - log_prior[1:].max())
    prior /= prior.sum()
    with np.errstate(divide="ignore"):
        steps = np.log(prior * (1.0 - null_prior))
    return RangePrior(steps, math.log(null_prior) if null_prior > 0 else -math.inf)


def range_data(stats: PointStats, prior: RangePrior, step_scale: float) -> RangeData:
    """The sufficient statistics of a range (see :func:`range_posterior`) without evaluating
    its posterior: what the look-ahead and the forecast need."""
    if stats.counts[0] == 0 or stats.counts[-1] == 0:
        raise ValueError("both endpoints of a range need a measured value")
    total = float(stats.counts.sum())
    centre = float(stats.sums.sum()) / total
    return RangeData(
        counts=stats.counts.astype(float),
        sums=stats.sums - stats.counts * centre,
        squares=max(float(stats.squares.sum()) - total * centre**2, 0.0),
        g=max(step_scale, 1e-3) ** 2,
        log_prior_steps=prior.log_steps,
        log_prior_null=prior.log_null,
        prior=prior,
    )


def range_posterior(
    lo: int,
    hi: int,
    stats: PointStats,
    untestable: np.ndarray,
    log_prior: np.ndarray,
    step_scale: float,
    null_prior: float = 0.0,
) -> RangePosterior:
    """Posterior over "first bad point is ``c``" for ``c`` in ``lo+1 .. hi``, and "no change".

    ``stats``: the trials at points ``lo..hi`` (signed log values, bad = higher; shift them near
    zero for precision). ``untestable[j]``: point ``lo + j`` cannot be measured. ``log_prior[j]``: log prior weight of
    hypothesis ``lo + j`` (entry 0 ignored). ``step_scale``: prior scale of the step in units of
    sigma; the step gets a half-normal prior in the bad direction (a proper prior is what makes
    "no change" comparable with "a step at c"; the half keeps noise dips from posing as culprits).
    ``null_prior``: prior probability that the range holds no change. Both endpoints must hold
    at least one value.
    """
    size = hi - lo + 1
    if size < 2 or stats.counts.size != size:
        raise ValueError("a range needs two points and statistics for each of them")
    data = range_data(stats, range_log_prior(log_prior, null_prior), step_scale)
    # Hypothesis j: points 0..j-1 good, j..size-1 bad (j = 1..size-1).
    log_steps, log_null = log_weights(
        np.cumsum(data.counts)[:-1],
        np.cumsum(data.sums)[:-1],
        float(data.counts.sum()),
        0.0,
        data.squares,
        data,
        exact_direction=True,
    )
    log_post = np.concatenate(([-np.inf], log_steps, [float(log_null)]))
    log_post -= log_post.max()
    weights = np.exp(log_post)
    weights /= weights.sum()

    testable_interior = np.ones(size, dtype=bool)
    testable_interior[1 : size - 1] = ~untestable[1 : size - 1]
    block_of = np.zeros(size, dtype=np.int64)
    # Hypotheses j and j+1 share a block exactly when point j is untestable.
    block_of[1:] = np.concatenate(([0], np.cumsum(testable_interior[1 : size - 1])))
    return RangePosterior(lo, hi, weights[:size], float(weights[size]), block_of, data)
