"""Where a search stage measures next.

On a chain, the first stage keeps the exact look-ahead of :mod:`placement` (expected entropy
reduction under the single change-point model, which values re-measuring the endpoints when
the levels are what is uncertain), with the stage posterior of :mod:`.model` in place of
the plain one; later stages, whose model carries the steps already found, read each trial as a
noisy binary answer ("is this commit past the next step?") and use the joint-information batch
rule. On a graph, measuring a commit answers "does it descend from the culprit?", so the same
binary rule runs over the probability that each commit reads bad (the mass of its ancestors):
the noisy counterpart of ``git bisect``'s "halve the candidates".
"""

from __future__ import annotations

import math
from collections import Counter
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.strategies.base import Proposal
from orchestrator.strategies.bisect.placement import (
    _HERMITE_W,
    _HERMITE_X,
    channel_error,
    choose_points,
)
from orchestrator.strategies.bisect.plan import Stage
from orchestrator.strategies.bisect.posterior import (
    RangeData,
    RangePosterior,
    log_weights,
    range_data,
)

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.model import StagePosterior
    from orchestrator.strategies.bisect.state import BisectState

_MAX_GRAPH_CANDIDATES = 96
_LOOKAHEAD_CANDIDATES = 40
_MAX_GRAPH_BATCH = 8


def chain_posterior(strategy: BisectState, stage: Stage, with_data: bool) -> RangePosterior:
    """The stage posterior as a :class:`RangePosterior` over all points (for placement and for
    the verdict's posterior vector). Made once per stage posterior and step scale: the
    proposal and the verdict's forecast after one trial ask for the same."""
    post = strategy.stage_posterior(stage)
    scale = strategy._step_scale() if with_data else None
    key = (stage.index, with_data)
    cached = strategy._chain_cache.get(key)
    if cached is not None and cached[0] is post and cached[1] == strategy.evidence.version \
            and cached[2] == scale:
        return cached[3]
    result = _chain_posterior(strategy, post, scale)
    strategy._chain_cache[key] = (post, strategy.evidence.version, scale, result)
    return result


def _chain_posterior(strategy: BisectState, post: StagePosterior,
                     scale: float | None) -> RangePosterior:
    n = strategy.n
    untestable = strategy.evidence.untestable_mask()
    mass = np.zeros(n)
    mass[post.hyps] = post.mass
    testable_interior = np.ones(n, dtype=bool)
    testable_interior[1 : n - 1] = ~untestable[1 : n - 1]
    block_of = np.zeros(n, dtype=np.int64)
    block_of[1:] = np.concatenate(([0], np.cumsum(testable_interior[1 : n - 1])))
    data = None
    stats = strategy.evidence.stats(0, n - 1)
    if scale is not None and stats.counts[0] > 0 and stats.counts[-1] > 0:  # both ends measured
        data = range_data(stats, strategy.range_log_prior, scale)
    return RangePosterior(0, n - 1, mass, post.null_mass, block_of, data)


def _step_error(strategy: BisectState, stage: Stage) -> float:
    ev = strategy.evidence
    if stage.index == 0:
        step = ev.compare(0, strategy.n - 1, 0.5)
        size = step.diff if step is not None else math.nan
    else:
        rems = [abs(r.diff.diff) for r in strategy.remainders()]
        size = max(rems) if rems else math.nan
    return channel_error(size, ev.sigma())


# While other trials run, a free node does not measure a point whose side of the step the
# posterior already knows to this level: with the likely culprit in flight the next-best point
# is often one whose reading is certain (P(first bad <= p) = 1.00), a restart that changes
# nothing; the node waits for the trial in flight instead. Alone (nothing in flight) the
# search's own choice stands: then even a settled point is the most informative left.
SETTLED = 0.005


def search_points(strategy: BisectState, stage: Stage, in_flight: Counter,
                  slots: int) -> list[Proposal]:
    ev = strategy.evidence
    untestable = ev.untestable_mask()
    usable = np.flatnonzero(~untestable)
    busy = [p for p, c in in_flight.items() if c > 0]
    if busy:
        usable = usable[~np.isin(usable, busy)]
    flying = [p for p, c in in_flight.items() if c > 0 for _ in range(c)]
    error = _step_error(strategy, stage)
    if strategy.history.linear:
        post = chain_posterior(strategy, stage, with_data=stage.index == 0)
        chosen = choose_points(post, usable.astype(np.int64), flying, slots, error)
        cdf = post.cdf()
        if flying:
            chosen = [p for p in chosen if SETTLED < cdf[p] < 1.0 - SETTLED]
        reasons = [f"P(first bad <= {p}) = {cdf[p]:.2f}" for p in chosen]
    else:
        p_bad = graph_reads_bad(strategy, stage)
        chosen = []
        if stage.index == 0 and slots > 0:
            first = graph_lookahead_point(strategy, stage, p_bad, usable)
            if first is not None:
                chosen = [first]
        chosen += choose_graph_points(strategy, stage, p_bad, usable[~np.isin(usable, chosen)],
                                      [*flying, *chosen], slots - len(chosen), error)
        reasons = [f"P(descends from the culprit) = {p_bad[p]:.2f}" for p in chosen]
    proposals = []
    for point, reason in zip(chosen, reasons, strict=True):
        in_flight[point] += 1
        proposals.append(Proposal(int(point), "search", reason))
    return proposals


def graph_lookahead_point(strategy: BisectState, stage: Stage, p_bad: np.ndarray,
                          usable: np.ndarray) -> int | None:
    """The point whose next trial is expected to reduce the posterior's entropy most, by the
    same exact look-ahead the chain uses (:func:`placement.expected_information`), over the
    hypotheses of the graph: under each, the trial joins the good or the bad level. It values
    re-measuring an endpoint when the levels, not the culprit's place, are what is uncertain,
    which the binary rule cannot see (it takes the levels as known)."""
    ev = strategy.evidence
    points, values, _, _ = ev.kept()
    post = strategy.stage_posterior(stage)
    hyps = post.hyps
    if values.size < 3 or usable.size == 0:
        return None
    measured, idx = np.unique(points, return_inverse=True)
    y = values - values.mean()
    counts = np.bincount(idx).astype(float)
    sums = np.bincount(idx, weights=y)
    reads = strategy.history.bad_matrix(hyps, measured).astype(float)
    total_n, total_q = float(y.size), float(y @ y)
    n_left = total_n - reads @ counts
    s_left = -(reads @ sums)
    g = strategy._step_scale() ** 2
    prior = strategy.log_prior[hyps]
    prior = prior - prior.max()
    null_prior = strategy.settings.null_prior_top
    log_prior = prior - np.log(np.exp(prior).sum()) + math.log1p(-null_prior)
    data = RangeData(counts, sums, total_q, g, log_prior, math.log(null_prior))

    def weights(n_l, s_l, n, s, q) -> np.ndarray:
        steps, null = log_weights(n_l, s_l, n, s, q, data, exact_direction=False)
        steps = steps + log_prior
        null = np.broadcast_to(null + data.log_prior_null, steps.shape[:-1] + (1,))
        return np.concatenate((steps, null), axis=-1)

    now = weights(n_left, s_left, total_n, 0.0, total_q)
    w = np.exp(now - now.max())
    w /= w.sum()
    current = float(_entropy_bits(now))
    mean_left = s_left / n_left
    mean_right = -s_left / (total_n - n_left)
    within = total_q - (n_left * (total_n - n_left) / total_n) * (mean_right - mean_left) ** 2
    sigma = math.sqrt(max(float(w[:-1] @ np.maximum(within, 0.0)) / max(total_n - 2.0, 1.0)
                          + w[-1] * total_q / max(total_n - 1.0, 1.0), 1e-300))
    order = np.argsort(np.abs(p_bad[usable] - 0.5), kind="stable")
    best = int(hyps[int(np.argmax(post.mass))])
    extra = [0, strategy.n - 1, best, *strategy.history.parents[best]]
    candidates = np.unique(np.concatenate((usable[order[:_LOOKAHEAD_CANDIDATES]],
                                           [p for p in extra if p in set(usable.tolist())])))
    best_point, best_gain = None, 1e-9
    for point in candidates:
        bad = strategy.history.reads_bad(int(point), hyps)
        good = ~bad
        parts = []
        for side, level in ((bad, mean_right), (good, mean_left)):
            mass = float(w[:-1][side].sum())
            if mass > 1e-9:
                parts.append((mass, float(w[:-1][side] @ level[side]) / mass))
        if w[-1] > 1e-9:
            parts.append((float(w[-1]), 0.0))
        ys = np.concatenate([mu + sigma * _HERMITE_X for _, mu in parts])[:, None]
        yw = np.concatenate([m * _HERMITE_W for m, _ in parts])
        after = _entropy_bits(weights(n_left + good, s_left + good * ys, total_n + 1.0, ys,
                                      total_q + ys**2))
        gain = current - float(yw @ after) / float(yw.sum())
        if gain > best_gain:
            best_point, best_gain = int(point), gain
    return best_point


def _entropy_bits(log_w: np.ndarray) -> np.ndarray:
    log_w = log_w - log_w.max(axis=-1, keepdims=True)
    p = np.exp(log_w)
    p /= p.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * np.log2(p), 0.0)
    return -terms.sum(axis=-1)


def graph_reads_bad(strategy: BisectState, stage: Stage) -> np.ndarray:
    """P(point reads bad) for every point: the posterior mass of its ancestors."""
    post = strategy.stage_posterior(stage)
    points = np.arange(strategy.n)
    reads = strategy.history.bad_matrix(post.hyps, points)  # (hyps, points)
    return post.mass @ reads


def choose_graph_points(strategy: BisectState, stage: Stage, p_bad: np.ndarray,
                        usable: np.ndarray, in_flight: list[int], k: int,
                        error: float) -> list[int]:
    """Greedy batch maximising the joint information of binary readings on a graph.

    Each hypothesis fixes which of the chosen points read bad; the readings pass through a
    channel with error ``error``; the score of a set is the entropy of its noisy readings
    (minus the noise entropy, a constant per point). One point is the commit whose bad
    probability is nearest 1/2.
    """
    post = strategy.stage_posterior(stage)
    hyps = post.hyps
    informative = usable[(p_bad[usable] > 1e-6) & (p_bad[usable] < 1.0 - 1e-6)]
    if informative.size == 0:
        return []
    order = np.argsort(np.abs(p_bad[informative] - 0.5), kind="stable")
    pool = informative[order[:_MAX_GRAPH_CANDIDATES]]
    fixed = [p for p in in_flight if 0 <= p < strategy.n][: _MAX_GRAPH_BATCH - 1]
    chosen: list[int] = []
    weights = np.append(post.mass, post.null_mass)
    for _ in range(k):
        if pool.size == 0 or len(fixed) + len(chosen) >= _MAX_GRAPH_BATCH:
            break
        context = fixed + chosen
        scores = np.empty(pool.size)
        base = _patterns(strategy, hyps, context)
        for i, cand in enumerate(pool):
            bits = np.append(strategy.history.reads_bad(int(cand), hyps), False)
            codes = base * 2 + bits
            scores[i] = _pattern_entropy(codes, weights, len(context) + 1, error)
        best = int(np.argmax(scores))
        chosen.append(int(pool[best]))
        pool = np.delete(pool, best)
    return chosen


def _patterns(strategy: BisectState, hyps: np.ndarray, points: list[int]) -> np.ndarray:
    """Integer code of the readings each hypothesis (and, last, "no change") gives."""
    codes = np.zeros(hyps.size + 1, dtype=np.int64)
    for point in points:
        bits = np.append(strategy.history.reads_bad(int(point), hyps), False)
        codes = codes * 2 + bits
    return codes


def _pattern_entropy(codes: np.ndarray, weights: np.ndarray, m: int, error: float) -> float:
    """Entropy of ``m`` noisy binary readings given the hypotheses' reading patterns."""
    uniq, inverse = np.unique(codes, return_inverse=True)
    masses = np.bincount(inverse, weights=weights)
    bits = (uniq[:, None] >> np.arange(m)[None, :]) & 1
    outcomes = np.arange(2**m)[:, None]
    obits = (outcomes >> np.arange(m)[None, :]) & 1
    mismatches = (obits[:, None, :] != bits[None, :, :]).sum(axis=2)
    channel = error**mismatches * (1.0 - error) ** (m - mismatches)
    prob = channel @ masses
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(prob > 0.0, prob * np.log2(prob), 0.0)
    return float(-terms.sum())
