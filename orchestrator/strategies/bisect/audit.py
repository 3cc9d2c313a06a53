"""The no-change path of the bisect strategy: re-measuring the endpoints to test a
reproduction, and stopping a search that would cost far more than its budget.

A reproduction found by one of many looks can be luck (:mod:`.reproduce`). Until a
culprit is verified, the endpoints' trials since the reproduction keep testing it; these
functions decide when the search must give them trials, and when to stop.

Functions over the live strategy's state
(:class:`~orchestrator.strategies.bisect.state.BisectState`).
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from orchestrator.strategies.bisect.forecast import stage_forecast
from orchestrator.strategies.bisect.plan import Stage
from orchestrator.strategies.bisect.reproduce import confirmed, fresh_endpoint_ratio
from orchestrator.strategies.bisect.verify import verify_target

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.state import BisectState


def too_costly(strategy: BisectState, stage: Stage) -> bool:
    """Stop when the forecast says, again and again, that the run would cost far more
    than its budget. A single forecast is rough (often off by 2x, more while the step is
    barely measured), so it is taken every ``forecast_every`` trials once a stage has run
    for a tenth of the budget, and only ``forecast_window`` forecasts in a row count."""
    cfg = strategy.settings
    spent = strategy.evidence.n_trials - stage.opened_at
    if spent < max(20, strategy.budget // 10) or spent % cfg.forecast_every or \
            strategy.far_checked_at == strategy.evidence.n_trials:
        return False
    strategy.far_checked_at = strategy.evidence.n_trials
    left = stage_forecast(strategy, stage)
    far = left is not None and strategy.evidence.n_trials + left > cfg.far_more * strategy.budget
    strategy.far_forecasts.append(far)
    if len(strategy.far_forecasts) < cfg.forecast_window or not all(strategy.far_forecasts[-cfg.forecast_window:]):
        return False
    strategy.stopped_early = (f"the forecast of about {left} more trials far exceeds the budget "
                          f"of {strategy.budget}")
    if not strategy.found() and not confirmed(strategy):
        strategy.withdraw(f"it is not confirmed beyond the luck of repeated looks, and "
                       f"{strategy.stopped_early}")
    else:
        strategy.outcome = "budget_exhausted"
    return True


def ready_but_unconfirmed(strategy: BisectState, stage: Stage) -> bool:
    """The first culprit would be accepted but for the change itself: the endpoints'
    interval does not yet clear the level that pays for the reproduce check's looks. A
    search that chased a lucky reproduction converges somewhere too, and verifying that
    point again and again would pass by luck in the end; measuring the endpoints instead
    either confirms the change or refutes it."""
    ev, cfg = strategy.evidence, strategy.settings
    culprit, parents, mass = verify_target(strategy, stage)
    return mass >= cfg.confidence and min(ev.count(p) for p in (culprit, *parents)) >= \
        cfg.verify_min_per_side


def audit_point(strategy: BisectState, in_flight: Counter) -> int | None:
    """An endpoint to re-measure for the test of the reproduction, or None."""
    if strategy.found() or strategy.reproduction is None:
        return None
    ev, cfg = strategy.evidence, strategy.settings
    good, bad = 0, strategy.n - 1
    fresh = {p: len(ev.values_since(p, strategy.reproduced_order)) + in_flight[p]
             for p in (good, bad)}
    if min(fresh.values()) > 0 and fresh_endpoint_ratio(strategy) <= 0.0:
        return None  # the fresh trials say the change is there: nothing to audit
    low = min((good, bad), key=lambda p: (fresh[p], p))
    since = ev.n_trials - strategy.reproduction.at_trial
    horizon = max(30.0, cfg.audit_after * (strategy.first_forecast or 20))
    if since > horizon:
        return low if sum(fresh.values()) < 0.5 * (since - horizon) + 2 else None
    high = bad if low == good else good
    return low if fresh[high] > 2 * fresh[low] + 2 else None
