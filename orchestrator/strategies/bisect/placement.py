"""Where to measure next, given a :class:`~orchestrator.strategies.bisect.posterior.RangePosterior`.

One point: the exact expected entropy reduction of the posterior, by look-ahead
over the posterior predictive of one more trial (:func:`expected_information`); it values
re-measuring an endpoint when the levels, not the position, are what is uncertain. A batch: the
rest is filled greedily by the joint information of binary readings (:func:`choose_batch`):
measuring ``p`` reveals, through a channel with error ``eps = Phi(-delta / (2 sigma))``, whether
``c <= p``, so ``I(c; Y_S) = H(Y_S) - |S| h(eps)``. With a clean signal that spreads a batch over
posterior quantiles (k-ary search), with a noisy one it stacks points near the median where
repeated readings are worth most; points in flight count as already chosen.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from orchestrator.strategies.bisect.posterior import (
    PriorSums,
    RangeData,
    RangePosterior,
    log_weights,
)

# Jointly scored readings are capped: 2**cap outcomes are enumerated per candidate.
_MAX_JOINT_POINTS = 11
# Candidate points scored per greedy step (spread over posterior quantiles).
_MAX_SCORED_CANDIDATES = 129
# Candidate points scored by the exact look-ahead (each costs one posterior per quadrature node).
_MAX_LOOKAHEAD_CANDIDATES = 48


def _entropy(log_w: np.ndarray) -> np.ndarray:
    """Entropy (bits) of the normalised exp(log_w) along the last axis."""
    log_w = log_w - log_w.max(axis=-1, keepdims=True)
    w = np.exp(log_w)
    total = w.sum(axis=-1, keepdims=True)
    p = w / total
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (log_w - np.log(total)), 0.0)
    return -terms.sum(axis=-1) / math.log(2.0)


_HERMITE_X, _HERMITE_W = np.polynomial.hermite_e.hermegauss(6)
_HERMITE_W = _HERMITE_W / _HERMITE_W.sum()


def _cell_starts(data: RangeData) -> np.ndarray:
    """First hypothesis index of each cell of the unsplit range (see :func:`_cells`)."""
    size = data.counts.size
    return np.flatnonzero(np.concatenate(([True], data.counts[1 : size - 1] > 0)))


def _cells(
    data: RangeData, sums: PriorSums, cut: int | None, base: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group hypotheses that the data cannot tell apart, optionally split at index ``cut``.

    Hypotheses ``j`` and ``j + 1`` have identical sufficient statistics when point ``j`` has
    no trial, so the likelihood only needs one evaluation per group: at most one per measured
    point, however long the range. Returns each cell's first hypothesis index (``j - 1``), its
    log prior mass and the entropy (nats) of the prior within it. ``base``: the unsplit cells'
    starts (:func:`_cell_starts`), when the caller splits the same range at many cuts.
    """
    size = data.counts.size
    starts = _cell_starts(data) if base is None else base
    if cut is not None and 0 < cut < size - 1:
        starts = np.union1d(starts, [cut])
    ends = np.append(starts[1:], size - 1)
    mass = sums.cum_p[ends] - sums.cum_p[starts]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_mass = np.log(mass) + sums.log_scale
        inner = np.where(
            mass > 0, np.log(mass) - (sums.cum_plogp[ends] - sums.cum_plogp[starts]) / mass, 0.0
        )
    return starts, log_mass, inner


def _cell_entropy(log_w: np.ndarray, inner: np.ndarray) -> np.ndarray:
    """Entropy (bits) over hypotheses of cell log weights (last axis) with within-cell entropy."""
    log_w = log_w - log_w.max(axis=-1, keepdims=True)
    w = np.exp(log_w)
    p = w / w.sum(axis=-1, keepdims=True)
    return (_entropy(log_w) + (p * inner).sum(axis=-1) / math.log(2.0))


def expected_information(posterior: RangePosterior, points: np.ndarray) -> np.ndarray:
    """Expected entropy reduction (bits) of the posterior from one more trial at each point.

    Exact look-ahead under the model: the trial's value is drawn from the posterior predictive
    (bad level where ``c <= p``, good level where ``c > p``, the common level under "no change";
    Gauss-Hermite quadrature) and the posterior is recomputed for every imagined value. Unlike
    the binary-reading shortcut it values trials that pin down the *levels*, e.g. re-measuring an
    endpoint whose few readings disagree with everything else. Hypotheses are handled in groups
    with identical statistics (:func:`_cells`), so a decision costs the same for 2000 commits as
    for 200.
    """
    data = posterior.data
    assert data is not None
    total_n = float(data.counts.sum())
    cum_n = np.cumsum(data.counts)[:-1]
    cum_s = np.cumsum(data.sums)[:-1]
    no_prior = RangeData(data.counts, data.sums, data.squares, data.g, np.zeros(1), 0.0)

    def log_cells(first: np.ndarray, log_mass: np.ndarray, extra_n, extra_s, ys) -> np.ndarray:
        steps, null = log_weights(
            cum_n[first] + extra_n, cum_s[first] + extra_s, total_n + (ys is not None),
            0.0 if ys is None else ys, data.squares + (0.0 if ys is None else ys**2),
            no_prior, exact_direction=False,
        )
        steps = steps + log_mass
        null = np.broadcast_to(null + data.log_prior_null, steps.shape[:-1] + (1,))
        return np.concatenate((steps, null), axis=-1)

    prior_sums = data.prior_sums()
    base = _cell_starts(data)
    first, log_mass, inner = _cells(data, prior_sums, None, base)
    inner_all = np.append(inner, 0.0)
    log_w = log_cells(first, log_mass, 0.0, 0.0, None)
    current = float(_cell_entropy(log_w, inner_all))
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    n_l, s_l = cum_n[first], cum_s[first]
    mean_left, mean_right = s_l / n_l, -s_l / (total_n - n_l)
    within = data.squares - (n_l * (total_n - n_l) / total_n) * (mean_right - mean_left) ** 2
    sigma2 = (w[:-1] @ np.maximum(within, 0.0) / max(total_n - 2.0, 1.0)
              + w[-1] * data.squares / max(total_n - 1.0, 1.0))
    sigma = math.sqrt(max(sigma2, 1e-300))

    gains = np.zeros(len(points))
    for index, rel in enumerate(points):
        first_c, log_mass_c, inner_c = _cells(data, prior_sums, int(rel), base)
        log_w_c = log_cells(first_c, log_mass_c, 0.0, 0.0, None)
        w_c = np.exp(log_w_c - log_w_c.max())
        w_c /= w_c.sum()
        good_side = first_c >= rel  # hypotheses c > rel: the new trial joins the good level
        n_c, s_c = cum_n[first_c], cum_s[first_c]
        components = []
        for side, level in ((~good_side, -s_c / (total_n - n_c)), (good_side, s_c / n_c)):
            mass = w_c[:-1][side].sum()
            if mass > 1e-9:
                components.append((mass, float(w_c[:-1][side] @ level[side]) / mass))
        if w_c[-1] > 1e-9:
            components.append((w_c[-1], 0.0))
        ys = np.concatenate([mu + sigma * _HERMITE_X for _, mu in components])[:, None]
        yw = np.concatenate([m * _HERMITE_W for m, _ in components])
        after = _cell_entropy(
            log_cells(first_c, log_mass_c, good_side, good_side * ys, ys),
            np.append(inner_c, 0.0),
        )
        gains[index] = current - float(yw @ after) / float(yw.sum())
    return gains


def channel_error(step: float, sigma: float) -> float:
    """Error of reading one trial as good/bad at the midpoint between two levels."""
    if not math.isfinite(step) or not math.isfinite(sigma) or sigma <= 0.0:
        return 0.25
    error = 0.5 * math.erfc(abs(step) / (2.0 * sigma) / math.sqrt(2.0))
    return min(max(error, 1e-4), 0.45)


def _outcome_entropies(cut_masses: np.ndarray, error: float) -> np.ndarray:
    """Entropy (bits) of the readings at ``m`` sorted cut points, one column per candidate set.

    ``cut_masses``: shape ``(m + 1, n_sets)``; row ``i`` is the posterior mass of "the first
    ``i`` cut points read good, the rest bad".
    """
    n_patterns, _ = cut_masses.shape
    m = n_patterns - 1
    outcomes = np.arange(2**m)[:, None]
    bits = (outcomes >> np.arange(m)[None, :]) & 1  # bit l = reading of cut point l (1 = bad)
    patterns = (np.arange(m)[None, :] >= np.arange(n_patterns)[:, None]).astype(np.int64)
    mismatches = (bits[:, None, :] != patterns[None, :, :]).sum(axis=2)
    channel = error**mismatches * (1.0 - error) ** (m - mismatches)
    prob = channel @ cut_masses
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(prob > 0.0, prob * np.log2(prob), 0.0)
    return -terms.sum(axis=0)


def choose_batch(
    posterior: RangePosterior,
    candidates: np.ndarray,
    in_flight: Sequence[int],
    k: int,
    error: float,
) -> list[int]:
    """Greedily pick up to ``k`` distinct points (absolute) maximising joint information gain.

    ``candidates``: absolute points that may be proposed (testable, not in flight).
    ``in_flight``: absolute points whose readings are pending; they count as already chosen.
    """
    if k <= 0:
        return []
    cdf = posterior.cdf()
    lo = posterior.lo
    chosen: list[int] = []
    fixed = [p for p in in_flight if posterior.lo <= p <= posterior.hi]
    fixed_cdf = sorted(cdf[p - lo] for p in fixed)
    available = _sorted_unique(candidates)
    for _ in range(k):
        if available.size == 0:
            break
        cand_cdf = cdf[available - lo]
        informative = (cand_cdf > 1e-9) & (cand_cdf < 1.0 - 1e-9)
        if not informative.any():
            break
        pool = available[informative]
        pool_cdf = cand_cdf[informative]
        if pool.size > _MAX_SCORED_CANDIDATES:
            targets = np.linspace(pool_cdf[0], pool_cdf[-1], _MAX_SCORED_CANDIDATES)
            keep = np.unique(np.clip(np.searchsorted(pool_cdf, targets), 0, pool.size - 1))
            pool, pool_cdf = pool[keep], pool_cdf[keep]
        # Keep the joint enumeration small: the cut points nearest the median matter most.
        context = sorted(fixed_cdf, key=lambda f: abs(f - 0.5))[: _MAX_JOINT_POINTS - 1]
        context_arr = np.array(sorted(context))
        cuts = np.concatenate(
            [np.repeat(context_arr[None, :], pool.size, axis=0), pool_cdf[:, None]], axis=1
        )
        cuts.sort(axis=1)
        edges = np.concatenate(
            [np.zeros((pool.size, 1)), cuts, np.ones((pool.size, 1))], axis=1
        )
        # Pattern i ("the first i cut points read good, the rest bad") has the posterior mass
        # between the i-th and (i+1)-th cut: F(p_{i+1}) - F(p_i), with F(p_0) = 0, F(p_{m+1}) = 1.
        cut_masses = np.diff(edges, axis=1).T
        scores = _outcome_entropies(cut_masses, error)
        # Ties (flat posterior): prefer the point closest to the median.
        best_score = scores.max()
        tied = np.flatnonzero(scores >= best_score - 1e-9)
        pick = int(tied[np.argmin(np.abs(pool_cdf[tied] - 0.5))])
        point = int(pool[pick])
        chosen.append(point)
        fixed_cdf.append(float(cdf[point - lo]))
        available = available[available != point]
    return chosen


def _lookahead_candidates(posterior: RangePosterior, candidates: np.ndarray) -> np.ndarray:
    """A few dozen points worth scoring exactly: posterior quantiles, the best block's edges
    and the two endpoints (everything when the range is small)."""
    if candidates.size <= _MAX_LOOKAHEAD_CANDIDATES:
        return candidates
    lo = posterior.lo
    cdf = posterior.cdf()[candidates - lo]
    targets = np.linspace(0.02, 0.98, 25) * max(cdf[-1], 1e-12)
    quantiles = candidates[np.clip(np.searchsorted(cdf, targets), 0, candidates.size - 1)]
    first, last, _ = posterior.best_block()
    edges = np.array([first - 2, first - 1, first, last, last + 1, posterior.lo, posterior.hi])
    picked = np.unique(np.concatenate((quantiles, edges)))
    return picked[_member(picked, candidates)]


def _sorted_unique(points: np.ndarray) -> np.ndarray:
    """``np.unique(points)`` as int64, without sorting when they already ascend strictly (the
    strategy's candidates do: a sort of every commit per decision is what this saves)."""
    points = np.asarray(points, dtype=np.int64)
    if points.size < 2 or bool(np.all(points[1:] > points[:-1])):
        return points
    return np.unique(points)


def _member(points: np.ndarray, pool: np.ndarray) -> np.ndarray:
    """``np.isin(points, pool)``, by binary search when ``pool`` ascends strictly."""
    pool = np.asarray(pool)
    if pool.size == 0 or not bool(np.all(pool[1:] > pool[:-1])):
        return np.isin(points, pool)
    at = np.minimum(np.searchsorted(pool, points), pool.size - 1)
    return pool[at] == points


def choose_points(
    posterior: RangePosterior,
    candidates: np.ndarray,
    in_flight: Sequence[int],
    k: int,
    error: float,
) -> list[int]:
    """Up to ``k`` distinct points to measure next (absolute), best first.

    The first point maximises the exact expected entropy reduction (:func:`expected_information`);
    the rest of a batch is filled greedily by the joint binary-reading criterion
    (:func:`choose_batch`) given the first point and the points in flight, which is what spreads a
    batch over the posterior instead of stacking k copies of the single best point.
    """
    if k <= 0 or candidates.size == 0:
        return []
    if posterior.data is None:
        return choose_batch(posterior, candidates, in_flight, k, error)
    scored = _lookahead_candidates(posterior, candidates)
    gains = expected_information(posterior, scored - posterior.lo)
    if gains.max() <= 1e-9:
        return choose_batch(posterior, candidates, in_flight, k, error)
    best = float(gains.max())
    tied = np.flatnonzero(gains >= best - 1e-9 * max(best, 1.0))
    cdf = posterior.cdf()
    first = int(scored[tied[np.argmin(np.abs(cdf[scored[tied] - posterior.lo] - 0.5))]])
    rest = choose_batch(
        posterior, candidates[candidates != first], [*in_flight, first], k - 1, error
    )
    return [first, *rest]
