"""The two levels of benchmark noise: repetitions inside one restart, and restarts.

A trial is one server lifetime; its repetitions share the restart's state (the NCCL ring it
got, where the weights landed, the clocks it settled at), so they scatter less than restarts
do. With ``sigma_e^2`` the scatter of one repetition around its restart's level and
``sigma_r^2`` the scatter of restart levels around the commit's, the mean of ``n``
repetitions has variance

    sigma_r^2 + sigma_e^2 / n

and which term dominates decides whether more repetitions or more restarts are the cheaper
way to learn (:mod:`orchestrator.stats.repetition_plan`).

The estimator is the nested one-way analysis of variance (restarts nested in commits), by
moments, with unequal repetition counts allowed: a commit's true level is a nuisance, so only
restarts of the same commit say anything about ``sigma_r``. Everything is on the scale the
values are given in (the signed log scale, where a sigma is a coefficient of variation).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.stats.dist import chi2_ppf


@dataclass(frozen=True)
class Component:
    """One variance component: its estimate, a two-sided interval and degrees of freedom (for
    restarts: the restart contrasts that carried information, whatever the interval's own)."""

    var: float
    lo: float
    hi: float
    df: float
    raw: float = math.nan  # the moment estimate before clamping at zero (unbiased)

    @property
    def sd(self) -> float:
        return math.sqrt(max(self.var, 0.0))


@dataclass(frozen=True)
class VarianceComponents:
    """``repetition``: one repetition around its restart's level; ``restart``: one restart's
    level around its commit's. ``restarts`` counts the restarts that carried information."""

    repetition: Component
    restart: Component
    restarts: int
    repetitions: int
    confidence: float

    def ratio(self) -> tuple[float, float, float]:
        """``sigma_e^2 / sigma_r^2``: estimate and interval (``inf`` when restarts may not
        scatter at all)."""
        def div(a: float, b: float) -> float:
            return a / b if b > 0 else math.inf
        return (div(self.repetition.var, self.restart.var),
                div(self.repetition.lo, self.restart.hi),
                div(self.repetition.hi, self.restart.lo))


@dataclass(frozen=True)
class NoiseStats:
    """The sufficient statistics of the nested analysis: sums of squares and their degrees of
    freedom within restarts and between restarts of one commit, and the repetitions' share of
    the latter (``inv_n``: ``sum_c (1 - 1/T_c) sum_t 1/n_t``). Two sets of data add by adding
    these, which is how a run's own restarts update a prior from the node's earlier runs."""

    ss_within: float = 0.0
    df_within: float = 0.0
    ss_between: float = 0.0
    df_between: float = 0.0
    inv_n: float = 0.0
    restarts: int = 0
    repetitions: int = 0

    def __add__(self, other: NoiseStats) -> NoiseStats:
        return NoiseStats(self.ss_within + other.ss_within, self.df_within + other.df_within,
                          self.ss_between + other.ss_between,
                          self.df_between + other.df_between, self.inv_n + other.inv_n,
                          self.restarts + other.restarts, self.repetitions + other.repetitions)

    def discounted(self, max_within: float, max_between: float) -> NoiseStats:
        """The same estimates, weighing at most ``max_within``/``max_between`` degrees of
        freedom: a prior from earlier runs starts the design without outvoting this run (the
        node may have changed since), and the run's own restarts soon weigh as much."""
        fw = min(1.0, max_within / self.df_within) if self.df_within > 0 else 1.0
        fb = min(1.0, max_between / self.df_between) if self.df_between > 0 else 1.0
        return NoiseStats(self.ss_within * fw, self.df_within * fw, self.ss_between * fb,
                          self.df_between * fb, self.inv_n * fb, self.restarts,
                          self.repetitions)


def noise_stats(commits: Sequence[Sequence[Sequence[float]]]) -> NoiseStats:
    """The sums of squares of ``commits[c][t][i]``: repetition ``i`` of restart ``t`` of
    commit ``c`` (see :func:`variance_components`)."""
    ss_within = ss_between = inv_n_term = 0.0
    df_within = df_between = 0
    restarts = repetitions = 0
    for restarts_of_commit in commits:
        means, inv_n = [], []
        for reps in restarts_of_commit:
            vals = [float(v) for v in reps if math.isfinite(float(v))]
            if not vals:
                continue
            mean = sum(vals) / len(vals)
            ss_within += sum((v - mean) ** 2 for v in vals)
            df_within += len(vals) - 1
            repetitions += len(vals)
            means.append(mean)
            inv_n.append(1.0 / len(vals))
        if len(means) >= 2:
            centre = sum(means) / len(means)
            ss_between += sum((m - centre) ** 2 for m in means)
            df_between += len(means) - 1
            inv_n_term += (1.0 - 1.0 / len(means)) * sum(inv_n)
            restarts += len(means)
    return NoiseStats(ss_within, float(df_within), ss_between, float(df_between), inv_n_term,
                      restarts, repetitions)


def variance_components(commits: Sequence[Sequence[Sequence[float]]],
                        confidence: float = 0.9,
                        prior: NoiseStats | None = None) -> VarianceComponents | None:
    """Estimate both components from ``commits[c][t][i]``: repetition ``i`` of restart ``t``
    of commit ``c``, pooled with ``prior`` (earlier data's :class:`NoiseStats`) when given.
    None when the data hold no within-restart degree of freedom at all.

    Within restarts the pooled sample variance is exact (``chi^2`` interval). Between
    restarts, with unweighted restart means ``m_t`` of commit ``c`` (``T_c`` restarts):

        E[sum_t (m_t - mean_c)^2] = (T_c - 1) sigma_r^2 + sigma_e^2 (1 - 1/T_c) sum_t 1/n_t

    so ``sigma_r^2`` is the pooled excess over what the repetitions alone explain (clamped at
    zero), with a Satterthwaite ``chi^2`` interval, and bounds from the restart sum of squares
    with the repetition term taken as known when the estimate is near zero."""
    stats = noise_stats(commits)
    if prior is not None:
        stats = stats + prior
    return components_from_stats(stats, confidence)


def components_from_stats(stats: NoiseStats,
                          confidence: float = 0.9) -> VarianceComponents | None:
    """The two components and their intervals from the sums of squares."""
    if not 0.0 < confidence < 1.0:
        raise ValueError("confidence must be in (0, 1)")
    df_within, df_between = stats.df_within, stats.df_between
    if df_within <= 0:
        return None
    alpha = 1.0 - confidence
    var_e = stats.ss_within / df_within
    rep = Component(var_e, df_within * var_e / chi2_ppf(1 - alpha / 2, df_within),
                    df_within * var_e / chi2_ppf(alpha / 2, df_within), float(df_within), var_e)
    if df_between <= 0:
        restart = Component(math.nan, 0.0, math.inf, 0.0)
    else:
        a = stats.ss_between / df_between  # mean square of the restart means
        b = stats.inv_n * var_e / df_between  # what the repetitions alone put into it
        est = a - b
        dof = est**2 / (a**2 / df_between + b**2 / df_within) if est > 0 else 0.0
        lo_known = df_between * a / chi2_ppf(1 - alpha / 2, df_between) - b
        hi_known = df_between * a / chi2_ppf(alpha / 2, df_between) - b
        if dof >= 1.0:
            lo = dof * est / chi2_ppf(1 - alpha / 2, dof)
            hi = dof * est / chi2_ppf(alpha / 2, dof)
        else:
            lo, hi = lo_known, hi_known
        restart = Component(max(est, 0.0), max(min(lo, lo_known), 0.0),
                            max(hi, hi_known, 0.0), float(df_between), est)
    return VarianceComponents(rep, restart, stats.restarts, stats.repetitions, confidence)
