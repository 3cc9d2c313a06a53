"""What the culprits found so far leave unexplained, on both sides of each, with intervals.

The named steps cut the range at *anchors*: the good endpoint, each culprit's parent and the
culprit, the bad endpoint. On a chain the change between consecutive anchors that are not a
culprit and its parent is a *remainder*: ``level(next parent) - level(culprit)``, and with the
steps the remainders add up to the endpoints' change exactly (the levels telescope), so a step
can never be said to explain more than the intervals allow. On a graph the remainders are the
change from the good endpoint to each culprit's parent and from each culprit to the bad
endpoint, less the named steps that lie between them.

The remainders are recomputed after every trial. One whose interval excludes zero is a change
no named commit explains: the strategy searches for its culprit (a later stage) and, if it
cannot pin it, reports it with its size. One that is suggestive but unclear has its anchors
measured further, up to a cap.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scipy.stats import t as student_t

from orchestrator.strategies.bisect.plan import Remainder

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.state import BisectState


def anchor_pairs(strategy: BisectState) -> list[tuple[int, int]]:
    found = sorted((s.culprit for s in strategy.stages if s.culprit is not None
                    and s.outcome == "found"), key=lambda c: c.point)
    last = strategy.n - 1
    if not found:
        return []
    if strategy.history.linear:
        pairs, start = [], 0
        for culprit in found:
            parent = culprit.parents[0] if culprit.parents else culprit.point - 1
            if parent > start:
                pairs.append((start, parent))
            start = culprit.point
        if last > start:
            pairs.append((start, last))
        return pairs
    pairs = []
    for culprit in found:
        parent = culprit.parents[0] if culprit.parents else 0
        for pair in ((0, parent), (culprit.point, last)):
            if pair[0] != pair[1] and pair not in pairs:
                pairs.append(pair)
    return pairs


def contrast_weights(strategy: BisectState, lo: int, hi: int) -> dict[int, float]:
    """The anchors of ``level(hi) - level(lo)`` less the named steps between them, with their
    signs: the points whose trials the part's interval rests on."""
    weights = {hi: 1.0, lo: -1.0}
    history = strategy.history
    for stage in strategy.stages:
        culprit = stage.culprit
        if culprit is None or stage.outcome != "found":
            continue
        if history.descends(hi, culprit.point) and not history.descends(lo, culprit.point):
            parent = culprit.parents[0] if culprit.parents else culprit.point - 1
            weights[culprit.point] = weights.get(culprit.point, 0.0) - 1.0
            weights[parent] = weights.get(parent, 0.0) + 1.0
    return {p: w for p, w in weights.items() if w != 0.0}


def remainder(strategy: BisectState, lo: int, hi: int, confidence: float) -> Remainder | None:
    """``level(hi) - level(lo)`` less the named steps between them, with a t-interval."""
    weights = contrast_weights(strategy, lo, hi)
    if not weights:
        return None
    diff = strategy.evidence.contrast(weights, confidence)
    if diff is None or not math.isfinite(diff.se) or diff.se <= 0 or diff.df <= 0:
        return None
    p_value = float(2.0 * student_t.sf(abs(diff.diff) / diff.se, diff.df))
    return Remainder(lo, hi, diff, p_value)


def unexplained_total(strategy: BisectState, confidence: float) -> Remainder | None:
    """The endpoints' change less every named step: all the remainders at once. Its anchors
    include the endpoints, measured most, so it has more power than any one remainder and
    tells a staircase (the first step explains a third) from a lone culprit early."""
    if not strategy.found():
        return None
    return remainder(strategy, 0, strategy.n - 1, confidence)


def remainders(strategy: BisectState, confidence: float) -> list[Remainder]:
    out = []
    for lo, hi in anchor_pairs(strategy):
        found = remainder(strategy, lo, hi, confidence)
        if found is not None:
            out.append(found)
    return out
