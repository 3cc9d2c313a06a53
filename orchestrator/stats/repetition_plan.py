"""How many benchmark repetitions the next restart should run: information per GPU-minute.

A restart with ``n`` repetitions costs ``C_r + n C_e`` (launch to ready and warm-up, then
``n`` repetitions) and its trial-level value has variance ``sigma_r^2 + sigma_e^2 / n``
(:mod:`orchestrator.stats.variance`). Information per unit of cost, in ``sigma_r^2`` units
with ``rho = sigma_e^2 / sigma_r^2`` and ``k = C_r / C_e``:

    I(n) = 1 / ((1 + rho / n) (k + n))        maximised at   n* = sqrt(rho k)

so repetitions pay when they scatter much more than restarts *and* a restart costs many
repetitions. That holds while the restarts needed grow with the trial variance. They do not
below a floor: once one restart tells the good level from the bad (its sd under about 0.3 of
the change), the search still needs its ~log2(N) restarts, its reproduction and its
head-to-head, and more precision per restart buys nothing. Measured on the cost benchmark
(:mod:`experiments.bench_cost`, 32 commits, confidence 0.99), the restarts to the answer
follow ``T ~ 150 (0.1 + max(x - 0.1, 0))`` in ``x = v(n) / change^2``; once the change is
known (reproduced) the plan minimises ``(C_r + n C_e) (0.1 + max(x(n) - 0.1, 0))`` instead.

``rho`` is only estimated; the choice maximises the worst relative efficiency (best cost over
its cost) over the components' intervals (a choice that is good whatever ``rho`` really
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
# Restarts to the answer ~ FLOOR_TRIALS + max(v(n) / change^2 - PRECISE_ENOUGH, 0), scaled:
PRECISE_ENOUGH = 0.1  # trial sd ~0.3 x the change: a restart already reads good or bad
FLOOR_TRIALS = 0.1  # the restarts needed however precise each one is (relative units)


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


def expected_cost(n: int, var_r: float, var_e: float, k: float,
                  effect: float | None) -> float:
    """Relative cost to the answer with ``n`` repetitions per restart (``k = C_r / C_e``):
    cost per restart times the restarts needed, proportional to the trial variance, or with
    the floor above once the change's size ``effect`` (signed log) is known."""
    var = var_r + var_e / n
    if effect is None or effect <= 0:
        return (k + n) * var
    return (k + n) * (FLOOR_TRIALS + max(var / effect**2 - PRECISE_ENOUGH, 0.0))


def plan_repetitions(components: VarianceComponents | None, cost: CostModel | None,
                     current: int, lo: int = 1, hi: int = 32,
                     min_gain: float = 0.1, effect: float | None = None) -> RepetitionPlan:
    """The repetitions for the next restart (``lo..hi``), starting from ``current``;
    ``effect``: the size of the change hunted (signed log), once reproduced."""
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
    # The plausible corners: repetitions as quiet and restarts as noisy as the intervals
    # allow, the estimate, and the other way round.
    corners = ((components.repetition.lo, min(components.restart.hi, 1.0)),
               (components.repetition.var, var_r),
               (components.repetition.hi, max(components.restart.lo, VAR_FLOOR)))
    counts = range(lo, hi + 1)
    best_at = [min(expected_cost(m, r, e, k, effect) for m in counts) for e, r in corners]

    def worst(n: int) -> float:
        return min(best / max(expected_cost(n, r, e, k, effect), 1e-300)
                   for best, (e, r) in zip(best_at, corners, strict=True))

    choice = max(counts, key=lambda n: (worst(n), -abs(n - current)))
    if choice != current and worst(choice) < (1.0 + min_gain) * worst(current):
        choice = current
    ratio = math.sqrt(rho_hat)
    if components.restart.var <= VAR_FLOOR:
        scatter = (f"restarts scatter no more than their repetitions explain (restart sd under "
                   f"{100 * math.sqrt(components.restart.hi):.2f}%)")
    elif ratio >= 1.0:
        scatter = f"a repetition scatters {ratio:.1f}x more than a restart"
    elif ratio > 0:
        scatter = f"a restart scatters {1.0 / ratio:.1f}x more than a repetition"
    else:
        scatter = "repetitions do not scatter"
    why = (f"{scatter} (sd {100 * components.repetition.sd:.2f}% vs "
           f"{100 * components.restart.sd:.2f}%), a restart costs {k:.0f}x a repetition")
    if components.restart.var <= VAR_FLOOR:
        why = (f"{scatter}, a repetition's sd is {100 * components.repetition.sd:.2f}%, a "
               f"restart costs {k:.0f}x a repetition")
    if effect is not None and effect > 0:
        why += (f"; the change of {100 * math.expm1(effect):.1f}% is read by a restart whose sd "
                f"is under ~{100 * 0.3 * effect:.1f}%")
    if choice == current:
        reason = f"{current} repetitions per restart kept: {why}"
    else:
        reason = f"{current} -> {choice} repetitions per restart: {why}"
    return RepetitionPlan(choice, current, reason, choice != current)
