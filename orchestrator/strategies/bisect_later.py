"""Later stages of the bisect strategy: is part of the change left unexplained, and which
anchors to measure to tell (:mod:`bisect_remainders` computes the parts).

Functions over the live strategy's state
(:class:`~orchestrator.strategies.bisect_state.BisectState`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.strategies.bisect_remainders import unexplained_total

if TYPE_CHECKING:
    from orchestrator.strategies.bisect_state import BisectState


def signalled(strategy: BisectState) -> bool:
    """Is part of the change left unexplained, clearly enough to search for its culprit?
    Not a sticky decision: a later stage with no such part is idle (the run is done) and
    wakes up if trials still in flight show one."""
    cfg, ev = strategy.settings, strategy.evidence
    for rem in strategy.remainders():
        solid = min(ev.count(rem.lo), ev.count(rem.hi)) >= cfg.remainder_max_per_endpoint
        if rem.p_value < cfg.remainder_clear_p or (solid and
                                                   rem.p_value < cfg.remainder_search_p):
            return True
    return False


def suggestive_points(strategy: BisectState) -> list[int]:
    """Anchors of remainders that hint at a change but do not yet show one."""
    cfg, ev = strategy.settings, strategy.evidence
    points = []
    whole = unexplained_total(strategy, cfg.verify_confidence)
    escalate = whole is not None and whole.p_value < cfg.remainder_escalate_p
    for rem in strategy.remainders():
        if rem.p_value >= cfg.remainder_suggestive and not escalate:
            if cfg.remainder_min_trials:
                for point in (rem.lo, rem.hi):
                    if ev.count(point) < cfg.remainder_min_trials and point not in points:
                        points.append(point)
            continue
        cap = max(cfg.remainder_max_per_endpoint if (
            escalate or rem.p_value < cfg.remainder_escalate_p) else
            cfg.remainder_check_trials, cfg.remainder_min_trials)
        for point in sorted((rem.lo, rem.hi), key=ev.count):
            if ev.count(point) < cap and point not in points:
                points.append(point)
                break
    return points
