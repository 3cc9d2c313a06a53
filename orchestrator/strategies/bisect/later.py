"""Later stages of the bisect strategy: is part of the change left unexplained, and which
anchors to measure to tell (:mod:`.remainders` computes the parts).

Functions over the live strategy's state
(:class:`~orchestrator.strategies.bisect.state.BisectState`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from scipy.stats import t as student_t

from orchestrator.stats.min_effect import ANSWER_CONFIDENCE, min_effect_log
from orchestrator.strategies.bisect.remainders import contrast_weights, unexplained_total

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.plan import Remainder
    from orchestrator.strategies.bisect.state import BisectState


def signalled(strategy: BisectState) -> bool:
    """Is part of the change left unexplained, clearly enough to search for its culprit?
    Not a sticky decision: a later stage with no such part is idle (the run is done) and
    wakes up if trials still in flight show one."""
    cfg, ev = strategy.settings, strategy.evidence
    floor = run_min_effect(strategy)
    for rem in strategy.remainders():
        if negligible_part(rem, floor):
            continue
        solid = min(ev.count(rem.lo), ev.count(rem.hi)) >= cfg.remainder_max_per_endpoint
        if rem.p_value < cfg.remainder_clear_p or (solid and
                                                   rem.p_value < cfg.remainder_search_p):
            return True
    return False


def negligible_part(rem: Remainder, floor: float) -> bool:
    """The part's interval lies within +-``floor``, the run's min effect (:func:`run_min_effect`,
    read once per decision: the stated ``min_effect_pct``, else the larger of 4% and a tenth of
    the endpoints' change): whatever it hints at is a change the answer would call explained (the answer's rule, with the answer's 95% interval), so it is
    neither searched nor measured further. On a quiet node a part reading +0.1% [-0.1%, +0.2%]
    has p under ``remainder_suggestive`` as often as a noisy one does; measuring its anchors
    again to chase a tenth of a percent cost a 10-release search a restart and a half on
    average, and after a x3 step found on a busy host a -2.8% [-5.6%, +0.1%] part held a
    two-node run for 126 restarts (docs/packages.md)."""
    diff = rem.diff
    half = float(student_t.ppf(0.5 + ANSWER_CONFIDENCE / 2.0, diff.df)) * diff.se
    return -floor < diff.diff - half and diff.diff + half < floor


def run_min_effect(strategy: BisectState) -> float:
    """The run's min effect (log scale, at least the negligible change), the endpoints' change
    read now."""
    whole = strategy.evidence.compare(0, strategy.n - 1, strategy.settings.verify_confidence)
    change = whole.diff if whole is not None and math.isfinite(whole.diff) else None
    return max(strategy.negligible, min_effect_log(change, strategy.min_effect_pct))


def resolution(strategy: BisectState) -> float | None:
    """The smallest further change (signed log) the run must rule out before it ends: a share
    (``remainder_resolution``) of the smallest step named, at least the negligible change.

    Relative to what was found, because that is what the answer's reader compares with: a run
    that named a +6% step and ends with "+5% [-2%, +12%] left, not distinguishable from no
    change" has not said whether a second step like the first is there. Where there is one
    culprit its head-to-head measured about that precision already, so ruling out a second
    one as large costs 6-13% more trials in the single-culprit regimes of the benchmark; in
    the staircase (three +6% steps in 5% noise) it is what names or reports the third step
    (docs/benchmarks.md)."""
    cfg, ev = strategy.settings, strategy.evidence
    if cfg.remainder_resolution <= 0.0:
        return None
    steps = []
    for stage in strategy.found():
        culprit = stage.culprit
        parent = culprit.parents[0] if culprit.parents else culprit.point - 1
        step = ev.compare(parent, culprit.point, cfg.verify_confidence)
        if step is not None and math.isfinite(step.diff):
            steps.append(abs(step.diff))
    if not steps:
        return None
    return max(strategy.negligible, cfg.remainder_resolution * min(steps))


def unresolved_total(strategy: BisectState) -> Remainder | None:
    """The whole unexplained change while its interval neither excludes zero nor rules out a
    further change of :func:`resolution`'s size (None once it does either)."""
    cfg = strategy.settings
    res = resolution(strategy)
    whole = unexplained_total(strategy, cfg.verify_confidence)
    if res is None or whole is None or whole.flagged:
        return None
    if -res < whole.diff.lo and whole.diff.hi < res:
        return None
    return whole


def suggestive_points(strategy: BisectState) -> list[int]:
    """Anchors of remainders that hint at a change but do not yet show one, and of the whole
    unexplained change while it is unresolved (:func:`unresolved_total`)."""
    cfg, ev = strategy.settings, strategy.evidence
    points = []
    whole = unexplained_total(strategy, cfg.verify_confidence)
    escalate = whole is not None and whole.p_value < cfg.remainder_escalate_p
    floor = run_min_effect(strategy)
    for rem in strategy.remainders():
        if negligible_part(rem, floor):
            continue
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
    open_total = unresolved_total(strategy)
    if open_total is not None:
        # Its variance is the noise times the sum of 1/count over its anchors (weights +-1):
        # the least-measured anchor shrinks it most.
        anchors = sorted(contrast_weights(strategy, open_total.lo, open_total.hi), key=ev.count)
        for point in anchors:
            if ev.count(point) < cfg.remainder_max_per_endpoint and point not in points:
                points.append(point)
                break
    return points
