"""Verify phase of the bisect strategy: the culprit against its parent, head to head.

Once one commit (or a range hidden by untestable commits) holds ``verify_handoff`` of the
posterior, the culprit and its parent are measured interleaved until an effect interval exists
and the posterior holds ``confidence``. If the culprit explains clearly less than the change
between the range's endpoints (estimate below ``explain_fraction`` of it and the interval of
the gap excluding zero), the ranges on either side are searched again, as new ranges that must
reproduce first: this finds several culprits without letting one misfit model blur them.

Functions over a live :class:`~orchestrator.strategies.bisect.BisectStrategy`.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scipy.stats import t as student_t

from orchestrator.stats.effect import LogDifference, log_difference
from orchestrator.strategies.base import Culprit
from orchestrator.strategies.bisect_plan import Segment

if TYPE_CHECKING:
    from orchestrator.strategies.bisect import BisectStrategy


def verify_plan(
    strategy: BisectStrategy, segment: Segment
) -> tuple[int, int, dict[int, int], int]:
    """``(parent, culprit, counts, target)``: trials per side so far and the goal.

    Normally every trial at the two points counts. When the data say the culprit explains
    clearly less than the range's change, only trials measured during verification count:
    the search picked those points *because* their readings were ambiguous, so its trials
    are biased towards a smaller step, and a split costs a whole new search.
    """
    ev, cfg = strategy.evidence, strategy.settings
    first, last, _ = strategy.posterior(segment).best_block()
    parent, culprit = first - 1, last
    if segment.fresh_pair != (parent, culprit):
        segment.fresh_pair, segment.fresh = (parent, culprit), {parent: [], culprit: []}
    fresh = {p: len(segment.fresh[p]) for p in (parent, culprit)}
    if min(fresh.values()) < cfg.verify_fresh_per_side:
        return parent, culprit, fresh, cfg.verify_fresh_per_side
    if suspect_partial(strategy, segment, parent, culprit):
        return parent, culprit, fresh, cfg.verify_split_min_per_side
    counts = {p: ev.count(p) for p in (parent, culprit)}
    return parent, culprit, counts, cfg.verify_min_per_side


def gap_excludes_zero(
    strategy: BisectStrategy, step: LogDifference, total: LogDifference
) -> bool:
    """Does the interval of ``total - step`` exclude zero (the culprit explains less)?"""
    gap_se = math.hypot(total.se, step.se)
    df = max(min(total.df, step.df), 1.0)
    t_crit = float(student_t.ppf(0.5 + strategy.settings.verify_confidence / 2.0, df))
    return total.diff - step.diff - t_crit * gap_se > 0.0


def suspect_partial(strategy: BisectStrategy, segment: Segment, parent: int, culprit: int) -> bool:
    """All trials so far hint that the culprit explains only part of the range's change:
    below ``explain_fraction`` of it with the gap interval excluding zero, or below half."""
    if (parent, culprit) == (segment.lo, segment.hi):
        return False
    ev, cfg = strategy.evidence, strategy.settings
    if min(ev.count(parent), ev.count(culprit)) < cfg.verify_min_per_side:
        return False
    step = ev.compare(parent, culprit, cfg.verify_confidence)
    total = ev.compare(segment.lo, segment.hi, cfg.verify_confidence)
    assert step is not None and total is not None
    if total.diff <= 0 or step.diff >= cfg.explain_fraction * total.diff:
        return False
    return step.diff < 0.5 * total.diff or gap_excludes_zero(strategy, step, total)


def check_verified(strategy: BisectStrategy, segment: Segment) -> bool:
    """Accept the culprit once the posterior holds ``confidence`` and the head-to-head trials
    suffice; open the side ranges when it explains only part of the change. True if accepted."""
    ev, cfg = strategy.evidence, strategy.settings
    _, _, mass = strategy.posterior(segment).best_block()
    parent, culprit, counts, target = verify_plan(strategy, segment)
    if min(counts.values()) < target or mass < cfg.confidence:
        return False
    step = ev.compare(parent, culprit, cfg.verify_confidence)
    total = ev.compare(segment.lo, segment.hi, cfg.verify_confidence)
    assert step is not None and total is not None
    partial = False
    if suspect_partial(strategy, segment, parent, culprit):
        extra_ss, extra_df = ev.pooled_within()
        fresh = log_difference(
            segment.fresh[parent], segment.fresh[culprit], cfg.verify_confidence,
            extra_ss, extra_df,
        )
        if fresh.diff < cfg.explain_fraction * total.diff and gap_excludes_zero(
            strategy, fresh, total
        ):
            partial = True
        elif min(counts.values()) < cfg.verify_max_per_side:
            return False  # undecided: more head-to-head trials
    explained = step.diff / total.diff if total.diff > 0 else math.nan
    segment.outcome = "found"
    segment.culprit = Culprit(
        point=culprit,
        probability=mass,
        range=(parent, culprit) if culprit - parent > 1 else None,
        effect_pct=ev.to_pct(step.diff),
        effect_ci=ev.ci_pct(step.lo, step.hi),
        explained=explained,
    )
    if partial:
        unexplained = total.diff - step.diff
        if parent > segment.lo:
            strategy.segments.append(
                Segment(segment.lo, parent, target=unexplained, opened_at=ev.n_trials)
            )
        if segment.hi > culprit:
            strategy.segments.append(
                Segment(culprit, segment.hi, target=unexplained, opened_at=ev.n_trials)
            )
        segment.note = "partial"
    return True
