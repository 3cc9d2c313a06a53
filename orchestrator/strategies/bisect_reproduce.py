"""Reproduce phase of the bisect strategy: is the endpoints' change real, and does it hold up?

A range is searched only once its endpoints, measured interleaved, confirm the change with a
pooled-variance t-interval on the log ratio. The interval is checked after every trial, so a
+50% change is confirmed with 2-3 trials per endpoint while a 5% change in 5% noise takes what
it needs; the price of those repeated looks is paid here too:

- a reversal ends the run, so its level shrinks with every look (:func:`clearly_reversed`);
- the reproduce interval passes by luck in about one no-change range in five, so the search
  keeps testing the reproduction on the endpoint trials it takes (:func:`refuted`).

Functions over a live :class:`~orchestrator.strategies.bisect.BisectStrategy`; they change only
the segment they are given.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from orchestrator.stats.effect import LogDifference
from orchestrator.strategies.bisect_plan import Reproduction, Segment

if TYPE_CHECKING:
    from orchestrator.strategies.bisect import BisectStrategy


def check_reproduced(strategy: BisectStrategy, segment: Segment) -> bool:
    """Decide an unreproduced range from its endpoints' trials: reproduced, reversed, not
    reproducible (or, for a sub-range, no change), unmeasurable; True if it was decided."""
    ev, cfg = strategy.evidence, strategy.settings
    is_top = segment is strategy.segments[0]
    for end, name in ((segment.lo, "good"), (segment.hi, "bad")):
        if ev.untestable(end) and ev.failures[end] >= cfg.endpoint_max_failures:
            segment.outcome = "inconclusive" if is_top else "no_change"
            segment.note = f"the {name} endpoint (point {end}) could not be measured"
            return True
    counts = (ev.count(segment.lo), ev.count(segment.hi))
    if min(counts) < strategy.settings.reproduce_min_per_endpoint:
        return False
    diff = ev.compare(segment.lo, segment.hi, cfg.reproduce_confidence)
    assert diff is not None
    cap = cfg.reproduce_max_per_endpoint if is_top else cfg.subrange_max_per_endpoint
    small = strategy.min_effect is not None and diff.hi < strategy.min_effect
    negligible = within_noise_floor(strategy, diff)
    dismiss = (
        not is_top and segment.target is not None and diff.hi < 0.5 * segment.target
    )
    if diff.lo > 0.0 and diff.diff >= strategy.negligible and not small:
        segment.reproduction = Reproduction(counts, diff.diff, ev.n_trials)
    elif (diff.hi < 0.0 and min(counts) >= cfg.reversed_min_per_endpoint
          and clearly_reversed(strategy, segment)):
        segment.outcome = "reversed" if is_top else "no_change"
    elif small or negligible or dismiss or min(counts) >= cap:
        segment.outcome = "not_reproducible" if is_top else "no_change"
    else:
        return False
    return True


def clearly_reversed(strategy: BisectStrategy, segment: Segment) -> bool:
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
    k = max(min(ev.count(segment.lo), ev.count(segment.hi)) - cfg.reversed_min_per_endpoint + 1, 1)
    level = (1.0 - cfg.reversed_confidence) / (k * (k + 1))
    diff = ev.compare(segment.lo, segment.hi, 1.0 - level)
    return diff is not None and diff.hi < 0.0


def refuted(strategy: BisectStrategy, segment: Segment) -> str | None:
    """Was the reproduction a fluke of the repeated looks? Why, if so. Two checks on the
    endpoints:

    - all their trials place the change confidently within +-``negligible_pct``;
    - their trials since the reproduction (the search re-measures them to pin the levels)
      favour "no change" over "a change of ``refute_fraction`` of the reproduced one" by a
      likelihood ratio of ``1 / (1 - confidence)``. A sequential probability ratio test: by
      Ville's inequality a real change at least that large trips it with probability at
      most ``1 - confidence`` however often it is checked (approximately: the noise is
      estimated), while a fluke trips it after a number of trials set by the noise, not by
      ``max_trials``. The total change is what the endpoints measure, so several culprits
      do not weaken it.
    """
    ev, cfg = strategy.evidence, strategy.settings
    diff = ev.compare(segment.lo, segment.hi, cfg.reproduce_confidence)
    if diff is not None and within_noise_floor(strategy, diff):
        return "it is within the noise floor"
    if fresh_endpoint_ratio(strategy, segment) >= -math.log1p(-cfg.confidence):
        return "their trials since the reproduction measure them alike"
    return None


def fresh_endpoint_ratio(strategy: BisectStrategy, segment: Segment) -> float:
    """Log likelihood ratio of "no change" over "a change of ``refute_fraction`` of the
    reproduced one" (or of the user's ``min_effect_pct`` when that is larger: a lucky
    reproduction just above zero would otherwise be refuted against a change the user said
    does not matter), from the endpoint trials that came after the reproduction (0 if none).

    The statistic is the difference of the fresh means, with the restart noise pooled over
    every replicated point: that is the likelihood of the location-free part of the data,
    which does not need the unknown levels.
    """
    if segment.reproduction is None:
        return 0.0
    ev = strategy.evidence
    good = ev.values[segment.lo][segment.reproduction.counts[0]:]
    bad = ev.values[segment.hi][segment.reproduction.counts[1]:]
    sigma = ev.sigma()
    if not good or not bad or not math.isfinite(sigma) or sigma <= 0.0:
        return 0.0
    floor = strategy.settings.refute_fraction * segment.reproduction.diff
    if strategy.min_effect is not None:  # smaller changes do not count: no need to refute them
        floor = max(floor, strategy.min_effect)
    gap = math.fsum(bad) / len(bad) - math.fsum(good) / len(good)
    variance = sigma * sigma * (1.0 / len(good) + 1.0 / len(bad))
    return floor * (floor - 2.0 * gap) / (2.0 * variance)


def within_noise_floor(strategy: BisectStrategy, diff: LogDifference) -> bool:
    """The interval lies within +-``negligible_pct``: the endpoints measure alike."""
    return -strategy.negligible < diff.lo and diff.hi < strategy.negligible
