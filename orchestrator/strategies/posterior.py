"""Posterior over the first bad commit from a continuous metric, and where to measure next.

Model (per searched range ``lo..hi``). Hypothesis ``c`` ("commit c is the first bad one",
``lo < c <= hi``) says every trial at a point ``p < c`` is ``mu_good + e`` and every trial at
``p >= c`` is ``mu_bad + e``, with ``e ~ N(0, sigma^2)`` on the (signed) log scale: restart noise
on latencies is multiplicative, so one sigma fits both levels. The levels and sigma are unknown
and integrated out under the reference prior ``p(mu_good, mu_bad, sigma) ~ 1/sigma``:

    log p(data | c) = -1/2 log n_L(c) - 1/2 log n_R(c) - (N - 2)/2 log SS(c) + const

where ``n_L, n_R`` count trials left/right of ``c`` and ``SS(c)`` is the within-level sum of
squares. Every hypothesis has the same parameters, so the improper-prior constants cancel, and the
endpoints (measured during reproduction) keep both levels defined. The posterior predictive of a
level is a Student-t, so an unlucky trial moves the posterior less than a plug-in normal would.
It is the classic Bayesian single change-point posterior; all hypotheses at once from cumulative
sums: O(n + N) per update, vectorised.

Untestable points are simply absent from the data: hypotheses ``c`` and ``c + 1`` cannot be told
apart when point ``c`` is untestable, so they form one *block*; the answer is then a range.

Next points: measuring point ``p`` reveals (noisily) whether ``c <= p``. With shared levels the
information a trial carries about ``c`` is the information it carries about that bit, so the
expected entropy reduction of a batch ``S`` is ``I(c; Y_S) = H(Y_S) - |S| h(eps)`` for readings
through a binary channel with error ``eps = Phi(-delta / (2 sigma))``. For one point this is
maximal at the posterior median (probabilistic bisection); for a batch, points are added greedily,
each maximising the joint information given the points already chosen or in flight: with a clean
signal that spreads them at posterior quantiles (k-ary search), with a noisy one it stacks them
near the median where repeated readings are worth most.
"""

from __future__ import annotations

import math
import os as _os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.special import log_ndtr as _log_ndtr
from scipy.stats import t as _student_t

# Jointly scored readings are capped: 2**cap outcomes are enumerated per candidate.
_MAX_JOINT_POINTS = 11
# Candidate points scored per greedy step (spread over posterior quantiles).
_MAX_SCORED_CANDIDATES = 129


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


def range_posterior(
    lo: int,
    hi: int,
    values_by_point: Sequence[Sequence[float]],
    untestable: np.ndarray,
    log_prior: np.ndarray,
    step_scale: float,
    null_prior: float = 0.0,
) -> RangePosterior:
    """Posterior over "first bad point is ``c``" for ``c`` in ``lo+1 .. hi``, and "no change".

    ``values_by_point[j]``: signed log trial values at point ``lo + j`` (bad = higher).
    ``untestable[j]``: point ``lo + j`` cannot be measured. ``log_prior[j]``: log prior weight of
    hypothesis ``lo + j`` (entry 0 ignored). ``step_scale``: prior scale of the step in units of
    sigma; the step gets a half-normal prior in the bad direction (a proper prior is what makes
    "no change" comparable with "a step at c"; the half keeps noise dips from posing as culprits).
    ``null_prior``: prior probability that the range holds no change. Both endpoints must hold
    at least one value.
    """
    size = hi - lo + 1
    if size < 2:
        raise ValueError("a range needs two points")
    counts = np.array([len(v) for v in values_by_point], dtype=np.int64)
    if counts[0] == 0 or counts[-1] == 0:
        raise ValueError("both endpoints of a range need a measured value")
    owner = np.repeat(np.arange(size), counts)
    flat = np.fromiter((x for v in values_by_point for x in v), dtype=float, count=counts.sum())
    flat = flat - flat.mean()
    prior = np.exp(log_prior[1:] - log_prior[1:].max())
    prior /= prior.sum()
    with np.errstate(divide="ignore"):
        data = _RangeData(
            counts=counts.astype(float),
            sums=np.bincount(owner, weights=flat, minlength=size),
            squares=float(flat @ flat),
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


def _uncertainty(log_w: np.ndarray) -> np.ndarray:
    mode = _os.environ.get("ACQ", "entropy")
    if mode == "entropy":
        return _entropy(log_w)
    log_w = log_w - log_w.max(axis=-1, keepdims=True)
    w = np.exp(log_w)
    p = w / w.sum(axis=-1, keepdims=True)
    err = 1.0 - p.max(axis=-1)
    if mode == "error":
        return err
    return _entropy(log_w) * 0 + np.log2(np.maximum(err, 1e-12))


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


def expected_information(posterior: RangePosterior, points: np.ndarray) -> np.ndarray:
    """Expected entropy reduction (bits) of the posterior from one more trial at each point.

    Exact look-ahead under the model: the trial's value is drawn from the posterior predictive
    (bad level where ``c <= p``, good level where ``c > p``, the common level under "no change";
    Gauss-Hermite quadrature) and the posterior is recomputed for every imagined value. Unlike
    the binary-reading shortcut it values trials that pin down the *levels*, e.g. re-measuring an
    endpoint whose few readings disagree with everything else.
    """
    data = posterior.data
    assert data is not None
    size = posterior.hi - posterior.lo + 1
    weights = np.concatenate((posterior.mass[1:], [posterior.null_mass]))
    keep = np.flatnonzero(weights[:-1] > 1e-12 * weights.max())
    n_left = np.cumsum(data.counts)[:-1][keep]
    s_left = np.cumsum(data.sums)[:-1][keep]
    total_n = float(data.counts.sum())
    sub = _RangeData(
        data.counts, data.sums, data.squares, data.g, data.log_prior_steps[keep],
        data.log_prior_null,
    )
    log_steps, log_null = _log_weights(
        n_left, s_left, total_n, 0.0, data.squares, sub, exact_direction=False
    )
    current = _uncertainty(np.concatenate((log_steps, [float(log_null)])))
    w_steps = weights[:-1][keep]
    w_null = weights[-1]
    hyp = keep + 1  # hypothesis j (relative point of the first bad commit)
    mean_left = s_left / n_left
    mean_right = -s_left / (total_n - n_left)
    within = np.maximum(
        data.squares - (n_left * (total_n - n_left) / total_n) * (mean_right - mean_left) ** 2,
        1e-300,
    )
    sigma2 = (w_steps @ (within / max(total_n - 2.0, 1.0)) + w_null * data.squares
              / max(total_n - 1.0, 1.0)) / max(w_steps.sum() + w_null, 1e-300)
    sigma = math.sqrt(max(sigma2, 1e-300))
    gains = np.zeros(len(points))
    for index, rel in enumerate(points):
        bad = hyp <= rel
        components = []
        mass_bad, mass_good = w_steps[bad].sum(), w_steps[~bad].sum()
        if mass_bad > 1e-9:
            components.append((mass_bad, (w_steps[bad] @ mean_right[bad]) / mass_bad))
        if mass_good > 1e-9:
            components.append((mass_good, (w_steps[~bad] @ mean_left[~bad]) / mass_good))
        if w_null > 1e-9:
            components.append((w_null, 0.0))
        ys = np.concatenate([mu + sigma * _HERMITE_X for _, mu in components])[:, None]
        yw = np.concatenate([m * _HERMITE_W for m, _ in components])
        yw = yw / yw.sum()
        joins_left = ~bad  # for hypotheses j > rel the new trial is on the good side
        new_n_left = n_left + joins_left
        new_s_left = s_left + joins_left * ys
        log_s, log_n = _log_weights(
            new_n_left, new_s_left, total_n + 1.0, ys, data.squares + ys**2, sub,
            exact_direction=False,
        )
        after = _uncertainty(np.concatenate((log_s, log_n), axis=1))
        gains[index] = current - float(yw @ after)
    del size
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
    available = np.array(sorted(set(int(c) for c in candidates)), dtype=np.int64)
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
    if candidates.size <= int(_os.environ.get("CANDMAX", "48")):
        return candidates
    lo = posterior.lo
    cdf = posterior.cdf()[candidates - lo]
    targets = np.linspace(0.02, 0.98, 25) * max(cdf[-1], 1e-12)
    picked = set(candidates[np.clip(np.searchsorted(cdf, targets), 0, candidates.size - 1)])
    first, last, _ = posterior.best_block()
    for point in (first - 2, first - 1, first, last, last + 1, posterior.lo, posterior.hi):
        picked.add(point)
    allowed = set(int(c) for c in candidates)
    return np.array(sorted(p for p in picked if p in allowed), dtype=np.int64)


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
    if posterior.data is None or _os.environ.get("NOEIG"):
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
