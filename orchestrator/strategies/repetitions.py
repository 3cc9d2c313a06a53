"""How many benchmark repetitions the next restart should run: information per GPU-minute.

A restart with ``n`` repetitions costs ``C_r + n C_e`` (launch to ready and warm-up, then
``n`` repetitions) and its trial-level value has variance ``sigma_r^2 + sigma_e^2 / n``
(:mod:`orchestrator.stats.variance`). Information per unit of cost, in ``sigma_r^2`` units
with ``rho = sigma_e^2 / sigma_r^2`` and ``k = C_r / C_e``:

    I(n) = 1 / ((1 + rho / n) (k + n))        maximised at   n* = sqrt(rho k)

so repetitions pay when they scatter much more than restarts *and* a restart costs many
repetitions. ``rho`` is only estimated; the choice maximises the worst relative efficiency
``I(n) / max_m I(m)`` over ``rho``'s interval (a choice that is good whatever ``rho`` really
is among the plausible values), and keeps the current count unless the change gains at least
``min_gain``: a run does not flip between neighbouring counts on noise. Until both components
and the costs are measured well enough the configured count stays.

Pure: no I/O. The drive loop feeds it what the store holds and passes the count to the next
trial.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from orchestrator.stats.variance import VarianceComponents

MIN_REPETITION_DF = 4  # within-restart degrees of freedom before repetitions are judged
MIN_RESTART_DF = 3  # replicated restarts (beyond one per commit) before restarts are judged
VAR_FLOOR = 1e-8  # (0.01%)^2: below this a restart's scatter is indistinguishable from none


@dataclass(frozen=True)
class CostModel:
    """Seconds of node wall time: ``restart_s`` (launch to ready, warm-up, teardown: all but
    the repetitions) and ``repetition_s`` (one repetition), on a node of ``gpus`` GPUs."""

    restart_s: float
    repetition_s: float
    gpus: int = 1

    def trial_s(self, repetitions: int) -> float:
        return self.restart_s + repetitions * self.repetition_s

    def gpu_minutes(self, repetitions: int, trials: float = 1.0) -> float:
        return trials * self.trial_s(repetitions) * self.gpus / 60.0


@dataclass(frozen=True)
class RepetitionPlan:
    """The count for the next restarts, the one before, and why (one line for people)."""

    repetitions: int
    previous: int
    reason: str
    changed: bool


def efficiency(n: int, rho: float, k: float) -> float:
    """Information per unit cost of ``n`` repetitions (any common scale)."""
    if math.isinf(rho):
        return n / (k + n)
    return 1.0 / ((1.0 + rho / n) * (k + n))


def plan_repetitions(components: VarianceComponents | None, cost: CostModel | None,
                     current: int, lo: int = 1, hi: int = 16,
                     min_gain: float = 0.05) -> RepetitionPlan:
    """The repetitions for the next restart (``lo..hi``), starting from ``current``."""
    if not 1 <= lo <= hi:
        raise ValueError("repetition bounds need 1 <= lo <= hi")
    current = min(max(current, lo), hi)
    if cost is None or cost.repetition_s <= 0 or cost.restart_s <= 0:
        return RepetitionPlan(current, current, "the cost of a restart and of a repetition "
                              "are not measured yet", False)
    if (components is None or components.repetition.df < MIN_REPETITION_DF
            or components.restart.df < MIN_RESTART_DF or not math.isfinite(components.restart.var)):
        return RepetitionPlan(current, current, "the two noise levels are not measured well "
                              "enough yet", False)
    k = cost.restart_s / cost.repetition_s
    var_r = max(components.restart.var, VAR_FLOOR)
    rho_hat = components.repetition.var / var_r
    rho_lo = components.repetition.lo / max(components.restart.hi, VAR_FLOOR)
    rho_hi = components.repetition.hi / max(components.restart.lo, VAR_FLOOR)
    rhos = (rho_lo, rho_hat, rho_hi)
    counts = range(lo, hi + 1)
    best_at = {rho: max(efficiency(m, rho, k) for m in counts) for rho in rhos}

    def worst(n: int) -> float:
        return min(efficiency(n, rho, k) / best_at[rho] for rho in rhos)

    choice = max(counts, key=lambda n: (worst(n), -abs(n - current)))
    if choice != current and worst(choice) < (1.0 + min_gain) * worst(current):
        choice = current
    ratio = math.sqrt(rho_hat)
    if ratio >= 1.0:
        scatter = f"a repetition scatters {ratio:.1f}x more than a restart"
    elif ratio > 0:
        scatter = f"a restart scatters {1.0 / ratio:.1f}x more than a repetition"
    else:
        scatter = "repetitions do not scatter"
    why = (f"{scatter} (sd {100 * components.repetition.sd:.2f}% vs "
           f"{100 * components.restart.sd:.2f}%), a restart costs {k:.0f}x a repetition")
    if choice == current:
        reason = f"{current} repetitions per restart kept: {why}"
    else:
        reason = f"{current} -> {choice} repetitions per restart: {why}"
    return RepetitionPlan(choice, current, reason, choice != current)
