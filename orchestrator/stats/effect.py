"""Effect sizes with confidence intervals over trial-level values.

The unit of evidence is the trial (one server restart): repetitions inside a trial share the
restart's state (clocks, memory layout, NCCL ring choice) and are not independent, so every
function here takes one value per trial (a trial's value is its repetitions' mean).

Two interval methods, chosen for few samples (3-10 restarts per side is typical):

* :func:`effect` — ratio of arithmetic means by Fieller's theorem with Welch-Satterthwaite degrees
  of freedom. Fieller inverts the exact t-test of ``mean_after - R * mean_before = 0``, so it
  accounts for the noise in the denominator (a delta-method interval does not, and undercovers
  with n=3) and needs no equal-variance assumption; a bootstrap has poor coverage at n=3.
* :func:`log_effect` — ratio of geometric means from a pooled-variance t-interval on log values.
  Restart-level noise on latency metrics is multiplicative, so on the log scale it has one
  variance for every candidate of a run; pooling that variance across candidates (the
  ``extra_ss``/``extra_df`` arguments) gives a usable interval from two or three trials per side.
  The bisection strategy uses this one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.stats.dist import t_ppf, t_sf

_UNBOUNDED = (-math.inf, math.inf)


@dataclass(frozen=True)
class Effect:
    """Relative change from ``before`` to ``after`` with its interval (all in percent)."""

    pct: float
    ci: tuple[float, float]
    p_value: float
    n_before: int
    n_after: int
    confidence: float
    method: str


def _mean_var(values: Sequence[float]) -> tuple[float, float, int]:
    count = len(values)
    mean = math.fsum(values) / count
    if count < 2:
        return mean, math.nan, count
    var = math.fsum((v - mean) ** 2 for v in values) / (count - 1)
    return mean, var, count


def _check(before: Sequence[float], after: Sequence[float], confidence: float) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if len(before) == 0 or len(after) == 0:
        raise ValueError("effect needs at least one value on each side")


def effect(before: Sequence[float], after: Sequence[float], confidence: float = 0.95) -> Effect:
    """Relative change of the arithmetic means, ``100 * (mean(after) / mean(before) - 1)``.

    Interval: Fieller's theorem with Welch-Satterthwaite degrees of freedom evaluated at the
    estimated ratio. p-value: Welch's t-test of equal means (the Fieller test at ratio 1). With
    fewer than two values on a side there is no variance estimate and the interval is unbounded.
    """
    _check(before, after, confidence)
    mean_b, var_b, n_b = _mean_var(before)
    mean_a, var_a, n_a = _mean_var(after)
    if mean_b == 0.0:
        raise ValueError("the 'before' mean is zero: a relative change is undefined")
    pct = 100.0 * (mean_a / mean_b - 1.0)
    if n_b < 2 or n_a < 2:
        return Effect(pct, _UNBOUNDED, math.nan, n_b, n_a, confidence, "fieller-welch")
    se2_b, se2_a = var_b / n_b, var_a / n_a
    if se2_a + se2_b == 0.0:
        same = mean_a == mean_b
        return Effect(pct, (pct, pct), 1.0 if same else 0.0, n_b, n_a, confidence, "fieller-welch")

    df_test = (se2_a + se2_b) ** 2 / (se2_a**2 / (n_a - 1) + se2_b**2 / (n_b - 1))
    t_stat = (mean_a - mean_b) / math.sqrt(se2_a + se2_b)
    p_value = 2.0 * t_sf(abs(t_stat), df_test)

    ratio = mean_a / mean_b
    lin_var = se2_a + ratio**2 * se2_b
    denom = se2_a**2 / (n_a - 1) + ratio**4 * se2_b**2 / (n_b - 1)
    df_ratio = lin_var**2 / denom if denom > 0 else math.inf
    t_crit = t_ppf(0.5 + confidence / 2.0, df_ratio)
    # Fieller: the set of R with (mean_a - R mean_b)^2 <= t^2 (se2_a + R^2 se2_b).
    quad_a = mean_b**2 - t_crit**2 * se2_b
    quad_b = -2.0 * mean_a * mean_b
    quad_c = mean_a**2 - t_crit**2 * se2_a
    if quad_a <= 0.0:
        # The denominator mean is not distinguishable from zero: no bounded interval exists.
        return Effect(pct, _UNBOUNDED, p_value, n_b, n_a, confidence, "fieller-welch")
    root = math.sqrt(max(quad_b**2 - 4.0 * quad_a * quad_c, 0.0))
    r_lo = (-quad_b - root) / (2.0 * quad_a)
    r_hi = (-quad_b + root) / (2.0 * quad_a)
    ci = (100.0 * (r_lo - 1.0), 100.0 * (r_hi - 1.0))
    return Effect(pct, ci, p_value, n_b, n_a, confidence, "fieller-welch")


@dataclass(frozen=True)
class LogDifference:
    """Difference of log means with its pooled-variance t-interval (internal currency)."""

    diff: float
    lo: float
    hi: float
    se: float
    df: float

    def to_effect(self, n_before: int, n_after: int, confidence: float) -> Effect:
        p_value = math.nan
        if self.se > 0.0 and self.df > 0:
            p_value = 2.0 * t_sf(abs(self.diff) / self.se, self.df)
        elif self.se == 0.0:
            p_value = 1.0 if self.diff == 0.0 else 0.0
        return Effect(
            pct=100.0 * math.expm1(self.diff),
            ci=(100.0 * math.expm1(self.lo), 100.0 * math.expm1(self.hi)),
            p_value=p_value,
            n_before=n_before,
            n_after=n_after,
            confidence=confidence,
            method="pooled-log-t",
        )


def log_difference(
    before: Sequence[float],
    after: Sequence[float],
    confidence: float = 0.95,
    extra_ss: float = 0.0,
    extra_df: int = 0,
) -> LogDifference:
    """``mean(after) - mean(before)`` of values already on the log scale, pooled variance.

    ``extra_ss``/``extra_df``: within-candidate sum of squares and degrees of freedom from other
    candidates measured in the same run, added to the pool (same restart-level noise).
    """
    _check_sides(before, after, confidence, "log_difference")
    mean_b, var_b, n_b = _mean_var(before)
    mean_a, var_a, n_a = _mean_var(after)
    ss = extra_ss + (var_b * (n_b - 1) if n_b > 1 else 0.0) + (var_a * (n_a - 1) if n_a > 1 else 0.0)
    df = extra_df + max(n_b - 1, 0) + max(n_a - 1, 0)
    return _pooled_interval(mean_a - mean_b, ss, df, 1.0 / n_a + 1.0 / n_b, confidence)


def _check_sides(before: Sequence[float], after: Sequence[float], confidence: float,
                 name: str) -> None:
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if len(before) == 0 or len(after) == 0:
        raise ValueError(f"{name} needs at least one value on each side")


def _pooled_interval(diff: float, ss: float, df: int, inverse_sizes: float,
                     confidence: float) -> LogDifference:
    """The t-interval of a difference of means from a pooled sum of squares: `inverse_sizes`
    is `1/n_a + 1/n_b` (or the sums of weights' inverses)."""
    if df == 0:
        return LogDifference(diff, -math.inf, math.inf, math.inf, 0)
    se = math.sqrt(ss / df * inverse_sizes)
    half = t_ppf(0.5 + confidence / 2.0, df) * se
    return LogDifference(diff, diff - half, diff + half, se, df)


def weighted_log_difference(
    before: Sequence[float],
    after: Sequence[float],
    w_before: Sequence[float],
    w_after: Sequence[float],
    confidence: float = 0.95,
    extra_ss: float = 0.0,
    extra_df: int = 0,
) -> LogDifference:
    """:func:`log_difference` for values of unequal precision: value ``i`` has variance
    ``sigma^2 / w_i`` (a trial of more repetitions weighs more, see
    :meth:`orchestrator.strategies.bisect.evidence.Evidence.kept_weights`). Each side's mean is the
    precision-weighted one, its variance ``sigma^2 / sum w``; ``sum w_i (v_i - mean)^2`` has
    ``n - 1`` degrees of freedom of ``sigma^2`` and pools with ``extra_ss`` as before. With all
    weights 1 this is :func:`log_difference` exactly."""
    _check_sides(before, after, confidence, "weighted_log_difference")
    if len(w_before) != len(before) or len(w_after) != len(after):
        raise ValueError("one weight per value")
    if any(not w > 0 for w in (*w_before, *w_after)):
        raise ValueError("weights must be positive")

    def side(vals: Sequence[float], ws: Sequence[float]) -> tuple[float, float, float]:
        total = float(sum(ws))
        mean = sum(w * v for w, v in zip(ws, vals, strict=True)) / total
        ss = sum(w * (v - mean) ** 2 for w, v in zip(ws, vals, strict=True))
        return mean, ss, total

    mean_b, ss_b, sw_b = side(before, w_before)
    mean_a, ss_a, sw_a = side(after, w_after)
    ss = extra_ss + ss_b + ss_a
    df = extra_df + len(before) - 1 + len(after) - 1
    return _pooled_interval(mean_a - mean_b, ss, df, 1.0 / sw_a + 1.0 / sw_b, confidence)


def log_effect(
    before: Sequence[float],
    after: Sequence[float],
    confidence: float = 0.95,
    extra_ss: float = 0.0,
    extra_df: int = 0,
) -> Effect:
    """Relative change of geometric means from a pooled-variance t-interval on log values.

    Values must be positive. See :func:`log_difference` for ``extra_ss``/``extra_df``.
    """
    if any(v <= 0.0 for v in before) or any(v <= 0.0 for v in after):
        raise ValueError("log_effect needs positive values")
    result = log_difference(
        [math.log(v) for v in before],
        [math.log(v) for v in after],
        confidence,
        extra_ss,
        extra_df,
    )
    return result.to_effect(len(before), len(after), confidence)

