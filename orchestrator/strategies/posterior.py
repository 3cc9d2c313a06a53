"""Posterior over the first bad commit from a continuous metric, and where to measure next.

Model (per searched range ``lo..hi``). Hypothesis ``c`` ("commit c is the first bad one",
``lo < c <= hi``) says every trial at a point ``p < c`` is ``mu + e`` and every trial at
``p >= c`` is ``mu + delta + e``, with ``e ~ N(0, sigma^2)`` on the signed log scale: restart noise
on latencies is multiplicative, so one sigma fits both levels. "No change" says every trial is
``mu + e``. The good level, the step and sigma are unknown and integrated out: flat prior on
``mu``, ``p(sigma) ~ 1/sigma``, and a half-normal step ``delta ~ N+(0, g sigma^2)`` in the bad
direction. With ``S_xx = n_L n_R / N`` and ``S_xy = S_xx (mean_R - mean_L)`` (n_L/n_R trials left
and right of ``c``, N in all, ``S_yy`` the total sum of squares):

    log p(data | c)    = -1/2 log(1 + g S_xx) - (N-1)/2 log Q(c) + log 2 P(delta > 0 | c, data)
    Q(c)               = S_yy - S_xy^2 / (S_xx + 1/g)
    log p(data | none) = -(N-1)/2 log S_yy                       (same constants)

A proper step prior is what makes "no change" comparable with "a step at c" (the range of a
second culprit may hold none); the half keeps noise dips from posing as culprits; integrating
sigma out gives Student-t tails, so one unlucky trial moves the posterior less than a plug-in
normal would. It is the Bayesian single change-point posterior: all hypotheses at once from
cumulative sums, O(n + N) per update, vectorised. The benchmark checks that it is calibrated.

Untestable points are simply absent from the data: hypotheses ``c`` and ``c + 1`` cannot be told
apart when point ``c`` is untestable, so they form one *block*; the answer is then a range.

Next points. One point: the exact expected entropy reduction of the posterior, by look-ahead
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
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr as _log_ndtr
from scipy.stats import t as _student_t

# Jointly scored readings are capped: 2**cap outcomes are enumerated per candidate.
_MAX_JOINT_POINTS = 11
# Candidate points scored per greedy step (spread over posterior quantiles).
_MAX_SCORED_CANDIDATES = 129
# Candidate points scored by the exact look-ahead (each costs one posterior per quadrature node).
_MAX_LOOKAHEAD_CANDIDATES = 48


@dataclass(frozen=True)
class _RangeData:
    """Sufficient statistics of one range, centred at ``centre`` for numerical stability."""

    counts: np.ndarray  # trials per point (float)
    sums: np.ndarray  # sum of centred values per point
    squares: float  # sum of squared centred values
    g: float  # prior variance of the step in sigma^2 units
    log_prior_steps: np.ndarray  # log prior of hypotheses 1..size-1 (normalised with the null)
    log_prior_null: float


@dataclass(frozen=True)
class RangePosterior:
    """Posterior over the first bad point within ``lo..hi`` (index ``j`` is point ``lo + j``).

    ``mass[0]`` is always zero: the good endpoint cannot be the first bad point. ``null_mass`` is
    the probability that nothing in the range changed the metric. ``block_of[j]`` numbers the
    indistinguishable groups of hypotheses (see module docstring).
    """

    lo: int
    hi: int
    mass: np.ndarray
    null_mass: float
    block_of: np.ndarray
    data: _RangeData | None = None

    def block_masses(self) -> np.ndarray:
        return np.bincount(self.block_of[1:], weights=self.mass[1:])

    def best_block(self) -> tuple[int, int, float]:
        """``(first_hyp, last_hyp, mass)`` of the most probable block, as absolute points."""
        masses = self.block_masses()
        best = int(np.argmax(masses))
        members = np.flatnonzero(self.block_of[1:] == best) + 1
        return self.lo + int(members[0]), self.lo + int(members[-1]), float(masses[best])

    def cdf(self) -> np.ndarray:
        """``cdf[j] = P(first bad <= lo + j)``: the chance that point ``lo + j`` reads bad.

        Under "no change" every point reads like the good endpoint, so ``cdf[-1]`` is
        ``1 - null_mass``.
        """
        return np.cumsum(self.mass)


def _log_weights(
    n_left: np.ndarray,
    s_left: np.ndarray,
    total_n: np.ndarray | float,
    total_s: np.ndarray | float,
    total_q: np.ndarray | float,
    data: _RangeData,
    exact_direction: bool,
) -> tuple[np.ndarray, np.ndarray]:
    """Unnormalised log posterior of each step hypothesis and of "no change".

    Broadcasts over leading axes (one row per imagined extra trial in the look-ahead).
    """
    n_right = total_n - n_left
    s_right = total_s - s_left
    syy = np.maximum(total_q - total_s**2 / total_n, 1e-300)
    sxx = n_left * n_right / total_n
    sxy = sxx * (s_right / n_right - s_left / n_left)
    shrink = sxx + 1.0 / data.g
    resid = np.maximum(syy - sxy**2 / shrink, 1e-12 * syy)
    dof = np.maximum(total_n - 1.0, 1.0)
    z = (sxy / shrink) / np.sqrt(resid / (dof * shrink))
    positive = _student_t.logcdf(z, dof) if exact_direction else _log_ndtr(z)
    log_steps = -0.5 * np.log1p(data.g * sxx) - 0.5 * dof * np.log(resid) + math.log(2.0)
    log_steps = log_steps + positive + data.log_prior_steps
    log_null = -0.5 * dof * np.log(syy) + data.log_prior_null
    return log_steps, log_null


@dataclass(frozen=True)
class PointStats:
    """Per-point trial counts, sums and sums of squares of signed log values (one range)."""

    counts: np.ndarray
    sums: np.ndarray
    squares: np.ndarray

    @classmethod
    def from_values(cls, values_by_point: Sequence[Sequence[float]]) -> PointStats:
        return cls(
            np.array([len(v) for v in values_by_point], dtype=float),
            np.array([math.fsum(v) for v in values_by_point], dtype=float),
            np.array([math.fsum(x * x for x in v) for v in values_by_point], dtype=float),
        )


def range_posterior(
    lo: int,
    hi: int,
    stats: PointStats,
    untestable: np.ndarray,
    log_prior: np.ndarray,
    step_scale: float,
    null_prior: float = 0.0,
) -> RangePosterior:
    """Posterior over "first bad point is ``c``" for ``c`` in ``lo+1 .. hi``, and "no change".

    ``stats``: the trials at points ``lo..hi`` (signed log values, bad = higher; shift them near
    zero for precision). ``untestable[j]``: point ``lo + j`` cannot be measured. ``log_prior[j]``: log prior weight of
    hypothesis ``lo + j`` (entry 0 ignored). ``step_scale``: prior scale of the step in units of
    sigma; the step gets a half-normal prior in the bad direction (a proper prior is what makes
    "no change" comparable with "a step at c"; the half keeps noise dips from posing as culprits).
    ``null_prior``: prior probability that the range holds no change. Both endpoints must hold
    at least one value.
    """
    size = hi - lo + 1
    if size < 2 or stats.counts.size != size:
        raise ValueError("a range needs two points and statistics for each of them")
    if stats.counts[0] == 0 or stats.counts[-1] == 0:
        raise ValueError("both endpoints of a range need a measured value")
    total = float(stats.counts.sum())
    centre = float(stats.sums.sum()) / total
    prior = np.exp(log_prior[1:] - log_prior[1:].max())
    prior /= prior.sum()
    with np.errstate(divide="ignore"):
        data = _RangeData(
            counts=stats.counts.astype(float),
            sums=stats.sums - stats.counts * centre,
            squares=max(float(stats.squares.sum()) - total * centre**2, 0.0),
            g=max(step_scale, 1e-3) ** 2,
            log_prior_steps=np.log(prior * (1.0 - null_prior)),
            log_prior_null=math.log(null_prior) if null_prior > 0 else -math.inf,
        )
    # Hypothesis j: points 0..j-1 good, j..size-1 bad (j = 1..size-1).
    log_steps, log_null = _log_weights(
        np.cumsum(data.counts)[:-1],
        np.cumsum(data.sums)[:-1],
        float(data.counts.sum()),
        0.0,
        data.squares,
        data,
        exact_direction=True,
    )
    log_post = np.concatenate(([-np.inf], log_steps, [float(log_null)]))
    log_post -= log_post.max()
    weights = np.exp(log_post)
    weights /= weights.sum()

    testable_interior = np.ones(size, dtype=bool)
    testable_interior[1 : size - 1] = ~untestable[1 : size - 1]
    block_of = np.zeros(size, dtype=np.int64)
    # Hypotheses j and j+1 share a block exactly when point j is untestable.
    block_of[1:] = np.concatenate(([0], np.cumsum(testable_interior[1 : size - 1])))
    return RangePosterior(lo, hi, weights[:size], float(weights[size]), block_of, data)


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


@dataclass(frozen=True)
class _PriorSums:
    """Cumulative prior mass and prior ``p log p`` over hypotheses, for grouping them."""

    cum_p: np.ndarray
    cum_plogp: np.ndarray
    log_scale: float

    @classmethod
    def of(cls, log_prior_steps: np.ndarray) -> _PriorSums:
        scale = float(log_prior_steps.max())
        prior = np.exp(log_prior_steps - scale)
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(prior > 0, prior * np.log(prior), 0.0)
        return cls(
            np.concatenate(([0.0], np.cumsum(prior))),
            np.concatenate(([0.0], np.cumsum(plogp))),
            scale,
        )


def _cells(
    data: _RangeData, sums: _PriorSums, cut: int | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Group hypotheses that the data cannot tell apart, optionally split at index ``cut``.

    Hypotheses ``j`` and ``j + 1`` have identical sufficient statistics when point ``j`` has
    no trial, so the likelihood only needs one evaluation per group: at most one per measured
    point, however long the range. Returns each cell's first hypothesis index (``j - 1``), its
    log prior mass and the entropy (nats) of the prior within it.
    """
    size = data.counts.size
    starts = np.flatnonzero(np.concatenate(([True], data.counts[1 : size - 1] > 0)))
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
    no_prior = _RangeData(data.counts, data.sums, data.squares, data.g, np.zeros(1), 0.0)

    def log_cells(first: np.ndarray, log_mass: np.ndarray, extra_n, extra_s, ys) -> np.ndarray:
        steps, null = _log_weights(
            cum_n[first] + extra_n, cum_s[first] + extra_s, total_n + (ys is not None),
            0.0 if ys is None else ys, data.squares + (0.0 if ys is None else ys**2),
            no_prior, exact_direction=False,
        )
        steps = steps + log_mass
        null = np.broadcast_to(null + data.log_prior_null, steps.shape[:-1] + (1,))
        return np.concatenate((steps, null), axis=-1)

    prior_sums = _PriorSums.of(data.log_prior_steps)
    first, log_mass, inner = _cells(data, prior_sums, None)
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
        first_c, log_mass_c, inner_c = _cells(data, prior_sums, int(rel))
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
    cdf = posterior.cdf()
    lo = posterior.lo
    chosen: list[int] = []
    fixed = [p for p in in_flight if posterior.lo <= p <= posterior.hi]
    fixed_cdf = sorted(cdf[p - lo] for p in fixed)
    available = np.unique(np.asarray(candidates, dtype=np.int64))
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
    return picked[np.isin(picked, candidates)]


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
