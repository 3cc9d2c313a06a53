"""Reproduce phase of the bisect strategy: is the endpoints' change real, and does it hold up?

The range is searched only once its endpoints, measured interleaved, confirm the change with a
t-interval on the log ratio (the drift- and epoch-robust level fit of :mod:`.levels`). The
interval is checked after every trial, so a +50% change is confirmed with 2-3 trials per
endpoint while a 5% change in 5% noise takes what it needs; the price of those repeated looks
is paid here too:

- a reversal ends the run, so its level shrinks with every look (:func:`clearly_reversed`);
- the reproduce interval passes by luck in about one no-change range in four (29% of 2000
  seeded ones in 5% noise, 14% with an estimate under 4%), so until a culprit's step is
  verified the endpoints' later trials keep testing it (:func:`refuted`), the search
  re-measuring them when they lean towards "no change" (an audit), and the reproduction is
  withdrawn, saying so, when they refute it. A run stopped because it would cost far more
  than its budget keeps the change only if it clears a level that pays for all the looks
  (:func:`confirmed`).

Functions over the live strategy's state
(:class:`~orchestrator.strategies.bisect.state.BisectState`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.stats.effect import LogDifference
from orchestrator.strategies.bisect.plan import Reproduction

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.state import BisectState


def check_reproduced(strategy: BisectState) -> bool:
    """Decide the endpoints: reproduced, reversed, not reproducible, unmeasurable; True if
    decided."""
    ev, cfg = strategy.evidence, strategy.settings
    good, bad = 0, strategy.n - 1
    for end, name in ((good, "good"), (bad, "bad")):
        if ev.untestable(end) and ev.failures[end] >= cfg.endpoint_max_failures:
            strategy.outcome = "inconclusive"
            strategy.note = f"the {name} endpoint (point {end}) could not be measured"
            return True
    counts = (ev.count(good), ev.count(bad))
    if min(counts) < cfg.reproduce_min_per_endpoint:
        return False
    diff = ev.compare(good, bad, cfg.reproduce_confidence)
    if diff is None:
        return False
    small = ruled_out_below_floor(strategy)
    # Under the floor as estimated: not reproduced yet, whatever the interval says. The
    # endpoints are measured until :func:`ruled_out_below_floor` decides, or the estimate
    # clears the floor.
    floor = strategy.effective_min_effect()
    under = floor is not None and diff.diff < floor
    negligible = within_noise_floor(strategy, diff)
    if diff.lo > 0.0 and diff.diff >= strategy.negligible and not small and not under:
        strategy.reproduction = Reproduction(counts, diff.diff, ev.n_trials, (diff.lo, diff.hi))
        strategy.reproduced_order = ev.n_trials
    elif (diff.hi < 0.0 and min(counts) >= cfg.reversed_min_per_endpoint
          and clearly_reversed(strategy) and not split_endpoint(strategy)):
        strategy.outcome = "reversed"
    elif small or negligible or min(counts) >= cfg.reproduce_max_per_endpoint:
        strategy.outcome = "not_reproducible"
        # Decided against the change being chased (a reference's or `was=`), not a stated
        # min effect: the range does not hold the regression. Kept as decided, whatever
        # trials still in flight add to the interval afterwards.
        strategy.chase_ruled_out = small and strategy.min_effect is None
    else:
        return False
    return True


def ruled_out_below_floor(strategy: BisectState) -> bool:
    """Does the range hold confidently less than the smallest change that counts: the stated
    ``min_effect_pct``, or half of the change since the good level the user gave (``was=``, a
    reference run's level)?

    That answer ends the run "not reproducible" (not in this range), so it is held to the
    standard of the run's other decisions: at least ``reversed_min_per_endpoint`` restarts a
    side and the run's confidence, with a level that shrinks with every look,
    ``(1 - confidence) / (k (k + 1))`` at the ``k``-th (the looks together spend at most
    ``1 - confidence``). Before, it stopped after 2 restarts a side on a 90% interval, against
    a floor estimated from those same restarts, and a noise harness of bimodal, 3x-outlier,
    log-normal and load-step restarts ended real regressions "not reproducible" in up to 23 of
    1000 cases (``experiments/reference_reproduce.py``, docs/statistics.md).

    Against a good level, the question is a contrast of the two endpoints and that level:
    the range holds less than half of the change since it when ``bad - good < (bad - level)
    / 2``, i.e. ``bad / 2 - good + level / 2 < 0``; its interval carries the noise of both
    endpoints' means (the floor is not a constant read off the bad endpoint's restarts)."""
    ev, cfg = strategy.evidence, strategy.settings
    good, bad = 0, strategy.n - 1
    counts = min(ev.count(good), ev.count(bad))
    if counts < cfg.reversed_min_per_endpoint:
        return False
    k = look_index(counts, cfg.reversed_min_per_endpoint)
    level = 1.0 - 2.0 * (1.0 - cfg.confidence) / (k * (k + 1))  # two-sided, one side used
    if strategy.min_effect is not None:
        diff = ev.compare(good, bad, level)
        return diff is not None and diff.hi < strategy.min_effect
    if strategy.effective_min_effect() is None:  # no level given, or no change since it
        return False
    shift = ev.shift
    assert shift is not None and strategy.reference_value is not None
    given = strategy.sign * math.log(strategy.reference_value) - shift
    half = ev.contrast({bad: 0.5, good: -1.0}, level)
    return half is not None and half.hi + 0.5 * given < 0.0


def look_index(counts: int, first: int, growth: float = 1.5) -> int:
    """The look a decision taken at ``counts`` restarts a side belongs to: looks at ``first``,
    then each time the restarts grow by half (4, 6, 9, 14, 21, 31, 47 a side). The level of
    the ``k``-th, ``(1 - confidence) / (k (k + 1))``, is spent once per look, and the checks
    between two looks read nearly the same data; counted per restart, the level shrank so fast
    that a range 8% short of the change being chased in 5% noise was measured about 40
    restarts a side to be ruled out, as many as from nothing."""
    k, edge = 1, float(first)
    while counts >= edge * growth:
        edge *= growth
        k += 1
    return k


def look_level(strategy: BisectState) -> float:
    """One-sided level of the confirmation at the current look: the reproduce level for the
    first ``confirm_free_looks`` looks (a large change is confirmed as soon as it reproduces),
    then shrinking as ``1 / (k (k + 1))``, so that the late looks, which find the small lucky
    estimates, together add little."""
    ev, cfg = strategy.evidence, strategy.settings
    k = max(min(ev.count(0), ev.count(strategy.n - 1)) - 1, 1)
    base = (1.0 - cfg.reproduce_confidence) / 2.0
    free = cfg.confirm_free_looks
    return base if k <= free else base * free * (free + 1) / (k * (k + 1))


def confirmed(strategy: BisectState) -> bool:
    """The endpoints' interval excludes zero at the level the repeated looks have earned."""
    ev = strategy.evidence
    diff = ev.compare(0, strategy.n - 1, 1.0 - 2.0 * look_level(strategy))
    return diff is not None and diff.lo > 0.0 and diff.diff >= strategy.negligible


def clearly_reversed(strategy: BisectState) -> bool:
    """Reversal ends the run, so it needs stronger evidence than confirmation does.

    The check is repeated after every trial while the range reproduces: a fixed 99% interval
    looked at that often ended 18 of 400 seeded no-change ranges "reversed". So the
    ``k``-th pair of looks (``k = 1`` at ``reversed_min_per_endpoint`` trials per endpoint)
    uses the level ``(1 - reversed_confidence) / (k (k + 1))``: the levels sum to
    ``1 - reversed_confidence`` (a union bound), so a range whose endpoints measure alike
    ends "reversed" with at most that probability however long it takes to reproduce. A
    real reversal of any size that matters still shows within a few looks.
    """
    ev, cfg = strategy.evidence, strategy.settings
    lo, hi = 0, strategy.n - 1
    k = max(min(ev.count(lo), ev.count(hi)) - cfg.reversed_min_per_endpoint + 1, 1)
    level = (1.0 - cfg.reversed_confidence) / (k * (k + 1))
    diff = ev.compare(lo, hi, 1.0 - level)
    return diff is not None and diff.hi < 0.0


def split_endpoint(strategy: BisectState) -> bool:
    """Would an endpoint's left-out restarts undo the reversal, and are they not yet clearly
    outnumbered?

    Outliers are told from a commit's level by its majority. With one restart in eight landing
    3x slow, four of the good endpoint's first five did so about once in a thousand runs: its
    one normal restart was then the "outlier", and a regression read as a confident reversal
    (-49% [-50, -48]), which ends the run. A reversal is therefore not taken from an endpoint
    whose left-out restarts lie on the other side of the other endpoint's level until its kept
    restarts outnumber them by ``reversed_min_per_endpoint``: the majority being the bad state
    then needs that many more bad restarts than good ones (with one in four, the most the
    outlier rule ever leaves out, under half a percent; with one in eight, about 2e-4). A real
    reversal with a lone bad restart at an endpoint pays a few more of that endpoint's restarts.
    """
    ev, cfg = strategy.evidence, strategy.settings
    good, bad = 0, strategy.n - 1
    good_kept, bad_kept = ev.values_at(good), ev.values_at(bad)
    if not good_kept or not bad_kept:
        return True
    good_level, bad_level = float(np.median(good_kept)), float(np.median(bad_kept))
    # Signed so that higher is slower: a reversal is a good endpoint above the bad one.
    contrary_good = sum(1 for v in ev.left_out_at(good) if v < bad_level)
    contrary_bad = sum(1 for v in ev.left_out_at(bad) if v > good_level)
    margin = cfg.reversed_min_per_endpoint
    return ((contrary_good > 0 and len(good_kept) < contrary_good + margin)
            or (contrary_bad > 0 and len(bad_kept) < contrary_bad + margin))


def refuted(strategy: BisectState) -> str | None:
    """Was the reproduction a fluke of the repeated looks? Why, if so. Checks on the
    endpoints:

    - all their trials place the change confidently within +-``negligible_pct``;
    - their trials since the reproduction (the audit re-measures them) favour "no change" over
      "a change of ``refute_fraction`` of the reproduced one" (shrunk for the reproduce
      check's selection: :func:`reproduced_size`) by a likelihood ratio of
      ``1 / (1 - confidence)``. A sequential probability ratio test: by Ville's inequality a
      real change at least that large trips it with probability at most ``1 - confidence``
      however often it is checked (approximately: the noise is estimated), while a fluke trips
      it after a number of trials set by the noise, not by ``max_trials``. The total change is
      what the endpoints measure, so several culprits do not weaken it.

    A search that the forecast says would cost far more than the budget is stopped too; the
    reproduction is then withdrawn unless :func:`confirmed` holds (strategy ``_too_costly``).
    """
    ev, cfg = strategy.evidence, strategy.settings
    diff = ev.compare(0, strategy.n - 1, cfg.reproduce_confidence)
    if diff is not None and within_noise_floor(strategy, diff):
        return "the endpoints measure alike within the noise floor"
    if fresh_endpoint_ratio(strategy) >= -math.log1p(-cfg.confidence):
        return "the endpoints' trials since then measure them alike"
    return None


def fresh_endpoint_ratio(strategy: BisectState) -> float:
    """Log likelihood ratio of "no change" over "a change of ``refute_fraction`` of the
    reproduced one" (:func:`reproduced_size`; at least the negligible change, or the user's
    ``min_effect_pct`` when that is larger: a lucky reproduction just above zero would
    otherwise be refuted against a change the user said does not matter), from the endpoint
    trials that came after the reproduction (0 if none).

    The statistic is the difference of the fresh means, with the restart noise of the level
    fit: that is the likelihood of the location-free part of the data, which does not need the
    unknown levels. Where restarts ran different repetition counts the means are
    precision-weighted and their variances ``sigma^2 / sum of weights`` (``sigma`` is the
    noise of a trial at the latest count: read as the noise of every fresh trial, the earlier
    ones at fewer repetitions, the test was overconfident and refuted real changes).
    """
    if strategy.reproduction is None:
        return 0.0
    ev = strategy.evidence
    good = ev.weighted_since(0, strategy.reproduced_order)
    bad = ev.weighted_since(strategy.n - 1, strategy.reproduced_order)
    sigma = ev.sigma()
    if good is None or bad is None or not math.isfinite(sigma) or sigma <= 0.0:
        return 0.0
    floor = max(strategy.settings.refute_fraction * reproduced_size(strategy, sigma),
                strategy.negligible)
    # The user's min effect (smaller changes do not count: no need to refute them). Not half
    # the change since a given level: that is estimated from the bad endpoint's restarts, a
    # load on them inflates it, and the test then withdrew real changes smaller than the
    # inflated half (load-step harness, experiments/reference_reproduce.py); whether the range
    # holds less than that half is :func:`ruled_out_below_floor`'s question, at the run's
    # confidence.
    stated = strategy.min_effect
    if stated is not None:
        floor = max(floor, stated)
    gap = bad[0] - good[0]
    variance = sigma * sigma * (1.0 / good[1] + 1.0 / bad[1])
    return floor * (floor - 2.0 * gap) / (2.0 * variance)


def reproduced_size(strategy: BisectState, sigma: float) -> float:
    """The reproduced change less ``refute_shrink_se`` of its standard error, that error read
    with the noise as it is known now. The reproduce check stops on the first interval that
    clears zero, so its estimate runs high (a +3% change in 6% trial noise reproduced at +10
    to +16% after 2-3 restarts a side), and often on a noise estimate that happened to read low
    (2 degrees of freedom); the refutation tests "no change" against a share of this size, and
    a real change smaller than that share could be refuted.

    The size is the change as measured robustly: a restart flagged as an outlier since (too
    few restarts were replicated to flag it when the check stopped) counts for nothing. Two 3x
    restarts among the first seven made a +8% change reproduce at +200%, and "no change" tested
    against half of that withdrew the real change. With the flagged restarts left out the
    reproduce-phase trials read the change again; where every one of them at an endpoint was
    flagged, they cannot, and the endpoints' change over all their kept trials stands in (never
    more than what reproduced)."""
    rep = strategy.reproduction
    assert rep is not None
    ev, cfg = strategy.evidence, strategy.settings
    last = strategy.n - 1
    size = rep.diff
    tainted = any(t.index < strategy.reproduced_order and t.point in (0, last)
                  for t in ev.flagged())
    good = ev.weighted_since(0, 0, strategy.reproduced_order)
    bad = ev.weighted_since(last, 0, strategy.reproduced_order)
    if good is None or bad is None:
        if not tainted:
            return rep.diff
        now = ev.compare(0, last, cfg.reproduce_confidence)
        if now is None:
            return rep.diff
        return min(rep.diff, now.diff) - cfg.refute_shrink_se * now.se
    if tainted:
        size = min(rep.diff, bad[0] - good[0])
    se = sigma * math.sqrt(1.0 / good[1] + 1.0 / bad[1])
    return size - cfg.refute_shrink_se * se


def within_noise_floor(strategy: BisectState, diff: LogDifference) -> bool:
    """The interval lies within +-``negligible_pct``: the endpoints measure alike."""
    return -strategy.negligible < diff.lo and diff.hi < strategy.negligible
