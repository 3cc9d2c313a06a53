"""How many more restarts a bisection will need: a forecast for the progress line's ETA.

Before the endpoints reproduce, nothing is known about the change or the noise, and the caller
falls back to a noise-free count. After, two measured quantities set the cost of the search:

- the posterior's entropy ``H`` (bits): how much is still unknown about the culprit's position
  (``log2`` of the number of commits at the start, near zero at the end);
- the change in units of the restart noise, ``d = |step| / sigma``: one restart at the
  posterior median tells good from bad with an error of ``Phi(-d/2)``, and the information a
  restart carries falls off as ``1/d^2`` once ``d`` is small.

``remaining ~ (H + 1) * (A / d^2 + B)`` restarts, search and verification together. ``A`` and
``B`` were fitted on the strategy itself (virtual oracle, 64 and 256 commits, d = 1 to 4.25, 30
cases each): the per-run spread is about +-40% at small ``d``, so this is an estimate for an
ETA, never a promise. ``python -m experiments.forecast_check`` measures it against real runs of
the strategy.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.strategies.bisect.posterior import RangePosterior

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.plan import Stage
    from orchestrator.strategies.bisect.state import BisectState

PER_BIT_NOISE = 11.6  # A: restarts per bit at d = 1, less the floor below
PER_BIT_FLOOR = 0.76  # B: restarts per bit with no noise to speak of (misreadings aside)
MAX_FORECAST = 100_000


def remaining_trials(start_bits: float, entropy_bits: float, effect_sigmas: float,
                     spent: int) -> int | None:
    """Forecast restarts still needed, or None when the inputs say nothing (no change seen).

    ``start_bits``: log2 of the hypotheses when the search began; ``spent``: restarts since.
    The search costs about ``(start_bits + 1) * per_bit`` in all; once a run has outgrown that,
    what the posterior still does not know, ``(entropy_bits + 1) * per_bit``, is the estimate.
    """
    values = (start_bits, entropy_bits, effect_sigmas)
    if not all(math.isfinite(v) for v in values) or effect_sigmas <= 0:
        return None
    per_bit = PER_BIT_NOISE / effect_sigmas**2 + PER_BIT_FLOOR
    planned = (max(start_bits, 0.0) + 1.0) * per_bit - spent
    unknown = (max(entropy_bits, 0.0) + 1.0) * per_bit
    left = planned if planned >= 1.0 else unknown
    return int(min(math.ceil(left), MAX_FORECAST))


def range_forecast(posterior: RangePosterior, sigma: float, spent: int) -> int | None:
    """:func:`remaining_trials` for one searched range, from its posterior (which holds the
    range's trial statistics); ``sigma``: the restart noise (log scale); ``spent``: trials
    since the range reproduced."""
    if posterior.data is None or not math.isfinite(sigma) or sigma <= 0.0:
        return None
    stats = posterior.data
    step2 = mean_squared_step(stats.counts, stats.sums, posterior.mass, sigma * sigma)
    if step2 is None:
        return None
    probs = np.append(posterior.mass[1:], posterior.null_mass)
    probs = probs[probs > 0.0]
    entropy = float(-(probs * np.log2(probs)).sum())
    start_bits = math.log2(max(stats.counts.size - 1, 1))
    return remaining_trials(start_bits, entropy, math.sqrt(step2) / sigma, spent)


def mean_squared_step(counts: np.ndarray, sums: np.ndarray, mass: np.ndarray,
                      sigma2: float) -> float | None:
    """The squared step, averaged over the posterior's hypotheses (``counts``/``sums``: trials
    and their sum per point; a common shift of the values does not matter).

    Each hypothesis splits every trial of the range into a good and a bad group, so the search's
    trials count as well as the endpoints' (which alone are few, and overstate the change just
    after the reproduce check stopped on a large one). Each squared difference of means is
    corrected for its variance; None when nothing is left of it.

    Hypotheses with no trial between them split the trials alike, so the squared step is
    taken once per such cell and weighted by the cell's mass: the cost grows with the points
    measured, not with the commits.
    """
    size = counts.size
    # Hypothesis j (index j - 1) starts a cell when point j - 1 holds trials.
    starts = np.flatnonzero(np.concatenate(([True], counts[1 : size - 1] > 0)))
    n_left = np.cumsum(counts)[:-1][starts]
    s_left = np.cumsum(sums)[:-1][starts]
    n_all, s_all = float(counts.sum()), float(sums.sum())
    n_right = n_all - n_left
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = (s_all - s_left) / n_right - s_left / n_left
        squared = diff**2 - sigma2 * (1.0 / n_left + 1.0 / n_right)
    weights = np.add.reduceat(mass[1:], starts)
    usable = np.isfinite(squared) & (weights > 0)
    if not usable.any():
        return None
    step2 = float(weights[usable] @ squared[usable]) / float(weights[usable].sum())
    return step2 if step2 > 0.0 else None


def stage_forecast(strategy: BisectState, stage: Stage) -> int | None:
    """:func:`remaining_trials` for one search stage of the strategy.

    The first stage on a chain reads the step from its posterior (:func:`range_forecast`); a
    later stage, or one on a graph, takes the largest unexplained part of the change as its
    step and its posterior's entropy as what is unknown. The naming rule's hold trials are
    added: they are spent whatever the search needs."""
    search = _search_forecast(strategy, stage)
    return None if search is None else search + _hold_left(strategy, stage)


def _hold_left(strategy: BisectState, stage: Stage) -> int:
    """The fresh head-to-head restarts the naming rule still wants after the posterior's first
    pass over the confidence (``verify_hold_per_side`` a side, culprit and one parent)."""
    hold = strategy.settings.verify_hold_per_side
    if stage.held_since is None or stage.verify_pair is None:
        return 2 * hold
    ev = strategy.evidence
    return sum(max(hold - len(ev.values_since(p, stage.held_since)), 0)
               for p in stage.verify_pair[:2])


def _search_forecast(strategy: BisectState, stage: Stage) -> int | None:
    from orchestrator.strategies.bisect.search import chain_posterior

    ev = strategy.evidence
    sigma = ev.sigma()
    if not math.isfinite(sigma) or sigma <= 0.0:
        return None
    spent = ev.n_trials - stage.opened_at
    if stage.index == 0 and strategy.history.linear:
        return range_forecast(chain_posterior(strategy, stage, with_data=True), sigma, spent)
    post = strategy.stage_posterior(stage)
    if stage.index == 0:
        step = ev.compare(0, strategy.n - 1, 0.5)
        size = abs(step.diff) if step is not None else math.nan
    else:
        rems = [abs(r.diff.diff) for r in strategy.remainders()]
        size = max(rems) if rems else math.nan
    probs = np.append(post.mass, post.null_mass)
    probs = probs[probs > 0.0]
    entropy = float(-(probs * np.log2(probs)).sum())
    start_bits = math.log2(max(post.hyps.size, 1))
    return remaining_trials(start_bits, entropy, size / sigma, spent)
