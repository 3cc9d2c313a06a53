"""Restart-to-restart noise of a sweep, and the rule that stops obviously bad configurations.

Restart noise on speed metrics is multiplicative, so it is estimated on the log scale and pooled
over every configuration measured more than once (it is a property of the node and server, not of
one configuration). Until the run has a few degrees of freedom of its own, a prior coefficient of
variation stands in, weighted like `PRIOR_DF` restarts' worth of evidence.

Pruning compares a new configuration's first restart with the incumbent (the best configuration
measured at least twice). "Obviously bad" means worse by more than `sigmas` standard deviations
of the difference between one restart and the incumbent's mean; with the default 2 a
configuration exactly as good as the incumbent is stopped about 2% of the time, one that is
clearly worse after a single restart does not cost a second one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

PRIOR_DF = 2


def log_values(values: Iterable[float]) -> list[float]:
    return [math.log(v) for v in values if v > 0 and math.isfinite(v)]


def pooled_log_ss(groups: Iterable[Sequence[float]]) -> tuple[float, int]:
    """Within-group sum of squares of log values and its degrees of freedom."""
    ss, df = 0.0, 0
    for values in groups:
        logs = log_values(values)
        if len(logs) > 1:
            mean = sum(logs) / len(logs)
            ss += sum((x - mean) ** 2 for x in logs)
            df += len(logs) - 1
    return ss, df


def restart_sd(groups: Iterable[Sequence[float]], prior_cv: float) -> float:
    """Log-scale standard deviation of one restart, shrunk towards the prior."""
    ss, df = pooled_log_ss(groups)
    prior_var = math.log1p(prior_cv * prior_cv)
    return math.sqrt((ss + PRIOR_DF * prior_var) / (df + PRIOR_DF))


@dataclass(frozen=True)
class PruneDecision:
    prune: bool
    shortfall_pct: float  # how much worse than the incumbent (positive = worse)
    threshold_pct: float
    reason: str


def prune_decision(first: float, incumbent: Sequence[float], sd: float, *, maximize: bool,
                   sigmas: float) -> PruneDecision:
    """Whether one restart is obviously worse than the incumbent's restarts."""
    inc = log_values(incumbent)
    if not inc or first <= 0 or not math.isfinite(first):
        return PruneDecision(False, 0.0, math.inf, "no incumbent to compare with")
    gap = math.log(first) - sum(inc) / len(inc)
    worse = -gap if maximize else gap
    limit = sigmas * sd * math.sqrt(1.0 + 1.0 / len(inc))
    shortfall = 100.0 * math.expm1(worse)
    threshold = 100.0 * math.expm1(limit)
    if worse > limit:
        return PruneDecision(True, shortfall, threshold,
                             f"{shortfall:.1f}% worse than the incumbent after one restart "
                             f"(limit {threshold:.1f}%)")
    return PruneDecision(False, shortfall, threshold, "")

