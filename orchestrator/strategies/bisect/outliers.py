"""Which restarts are outliers: a restart that lands in a bad state is one reading, not a level.

On a real node a restart now and then measures 2-3x slower than its commit does (a slow NCCL
ring, a JIT compile on the critical path, a thermal excursion). In a Gaussian model one such
trial inflates the noise estimate several-fold and drags its point's mean, and a bisection
that trusts it names a wrong commit or stops trusting every real difference. A heavy-tailed
likelihood (Student-t per trial) would keep it but breaks the sufficient statistics that make
the posterior cheap; so the trial is classified instead, from evidence that does not depend on
the culprit hypotheses, and a classified trial is kept in the record, flagged, and left out of
the likelihood:

- the restart noise ``sigma`` is first estimated robustly, from the differences between
  successive restarts of one commit (a 3x restart spoils at most two of them): the mean square
  of the smallest 60%, scaled to be unbiased for Gaussian noise (steadier than their median
  with few restarts, where an underestimate would flag good trials), or their median when that
  is larger (three restarts that agree by chance make the trimmed scale tiny); then it is
  refined as the pooled standard deviation of the trials kept, and at most a quarter of the
  trials is ever left out;
- a commit with three or more restarts: a trial more than ``k`` sigma from their median is an
  **outlier** (its replicates disagree with it);
- a commit with two that disagree by more than ``k`` sigma: the one outside the range of the
  levels measured so far (the "hull": every commit whose level is replicated) is the outlier;
  when that does not tell, both wait for a third restart;
- a commit with one restart that reads more than ``k`` sigma outside the hull is **pending**:
  left out until a replicate says whether it was a bad restart or a level nobody has seen yet
  (a commit between a regression and its later fix really does measure outside the endpoints),
  and the strategy measures it again next.

With ``k = 4.5`` a Gaussian trial is flagged with probability 7e-6, a Student-t(3) one in
about 0.6% of restarts; a 3x restart in 5% noise sits at 22 sigma.
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.stats import norm
from scipy.stats import t as student_t

KEPT, OUTLIER, PENDING = 0, 1, 2
MIN_DIFFERENCES = 6  # successive-restart differences needed before anything is flagged
MAX_FLAGGED = 0.25  # outliers are the exception: never leave out more than this share
_KEEP = 0.6  # share of the smallest differences the robust scale uses


def _trimmed_second_moment(q: float) -> float:
    """``E[Z^2 | |Z| <= z_q]`` for a standard normal ``Z``, ``z_q`` its two-sided ``q``
    quantile: ``(q - 2 z phi(z)) / q``."""
    z = float(norm.ppf(0.5 + q / 2.0))
    return (q - 2.0 * z * float(norm.pdf(z))) / q


def robust_sigma(points: np.ndarray, values: np.ndarray) -> float | None:
    """Restart noise from successive restarts of the same commit (in trial order), robust to a
    few bad restarts: the trimmed mean square of the differences, ``d ~ N(0, 2 sigma^2)``."""
    order = np.argsort(points, kind="stable")
    p, y = points[order], values[order]
    same = p[1:] == p[:-1]
    diffs = np.sort(np.abs(np.diff(y))[same])
    if diffs.size < MIN_DIFFERENCES:
        return None
    keep = max(int(_KEEP * diffs.size), 1)
    kept = diffs[:keep]
    trimmed = math.sqrt(float((kept**2).mean()) / (2.0 * _trimmed_second_moment(keep / diffs.size)))
    # Three restarts that happen to agree closely make the trimmed scale tiny; their median
    # difference does not fall for that (and still ignores up to half bad differences).
    median = 1.4826 * float(np.median(diffs)) / math.sqrt(2.0)
    sigma = max(trimmed, median)
    return sigma if sigma > 0.0 else None


def _replicate_differences(points: np.ndarray) -> int:
    """How many successive-restart differences of one commit the noise estimate rests on."""
    counts = np.unique(points, return_counts=True)[1]
    return int((counts - 1).sum())


@lru_cache(maxsize=256)
def _small_sample_factor(k: float, df: int) -> float:
    """How much wider than ``k`` sigma a reading must lie when sigma itself is estimated from
    ``df`` differences: the Student-t quantile at the Gaussian tail of ``k``, over ``k``.

    Measured: with four restarts at each endpoint (six differences) the robust scale read 1.6%
    in 5% noise, a restart 9% below its commit's others was flagged at "4.5 sigma", and the
    three left made a no-change range reproduce at +7% [+5%, +9%]; the search then named a
    commit at P > 0.999 (no_change_drift, case 1). With the factor (3.2 at six differences, 1.3
    at twenty, 1.1 at fifty) a 3x restart in 5% noise (22 sigma) is still flagged."""
    if df >= 400:
        return 1.0
    return float(student_t.isf(float(norm.sf(k)), max(df, 1))) / k


def _groups(points: np.ndarray, values: np.ndarray):
    """Trials sorted by (point, value), with each group's start and size."""
    order = np.lexsort((values, points))
    p, y = points[order], values[order]
    starts = np.flatnonzero(np.concatenate(([True], p[1:] != p[:-1])))
    sizes = np.diff(np.append(starts, p.size))
    return order, y, starts, sizes


def _flag_once(points: np.ndarray, values: np.ndarray, sigma: float, k: float) -> np.ndarray:
    status = np.zeros(values.size, dtype=np.int8)
    order, y, starts, sizes = _groups(points, values)
    sorted_status = np.zeros(values.size, dtype=np.int8)
    group_of = np.repeat(np.arange(starts.size), sizes)
    # Three or more restarts: distance from the centre of the commit's densest cluster.
    big = sizes >= 3
    median = 0.5 * (y[starts + (sizes - 1) // 2] + y[starts + sizes // 2])
    overall = float(np.median(y))
    for g in np.flatnonzero(big):
        median[g] = _cluster_centre(y[starts[g]: starts[g] + sizes[g]], 2 * k * sigma, overall)
    spread = k * sigma * np.sqrt(1.0 + math.pi / (2.0 * np.maximum(sizes, 1)))
    far = np.abs(y - median[group_of]) > spread[group_of]
    sorted_status[far & big[group_of]] = OUTLIER
    # Replicated levels: the hull of what commits of this range measure.
    pair = sizes == 2
    first, second = y[starts], y[np.minimum(starts + 1, y.size - 1)]
    agree = pair & (np.abs(second - first) <= k * sigma * math.sqrt(2.0))
    levels = np.concatenate((median[big], 0.5 * (first + second)[agree]))
    if levels.size:
        lo, hi = float(levels.min()) - k * sigma, float(levels.max()) + k * sigma
        outside = (y < lo) | (y > hi)
        disagree = pair & ~agree
        # A disagreeing pair: the one outside the hull is the outlier; else both wait.
        out_first, out_second = outside[starts], outside[np.minimum(starts + 1, y.size - 1)]
        one_out = disagree & (out_first != out_second)
        both_wait = disagree & ~one_out
        g = np.flatnonzero(one_out)
        sorted_status[np.where(out_first[g], starts[g], starts[g] + 1)] = OUTLIER
        g = np.flatnonzero(both_wait)
        sorted_status[starts[g]] = PENDING
        sorted_status[starts[g] + 1] = PENDING
        single = sizes == 1
        g = np.flatnonzero(single & outside[starts])
        sorted_status[starts[g]] = PENDING
    status[order] = sorted_status
    return status


def _cluster_centre(sorted_values: np.ndarray, width: float, overall: float) -> float:
    """Median of the largest group of a commit's restarts that lie within ``width`` of each
    other (its plain median unless bad restarts are as many as good ones: with 2 good and 2
    bad the median falls between them and would flag all four). A tie goes to the group
    nearer the range's overall level."""
    ends = np.searchsorted(sorted_values, sorted_values + width, side="right")
    counts = ends - np.arange(sorted_values.size)
    best = np.flatnonzero(counts == counts.max())
    if best.size > 1:
        centres = [float(np.median(sorted_values[i:ends[i]])) for i in best]
        return min(centres, key=lambda c: abs(c - overall))
    i = int(best[0])
    return float(np.median(sorted_values[i:ends[i]]))


def flag_trials(points: np.ndarray, values: np.ndarray, k: float = 4.5,
                rounds: int = 3) -> tuple[np.ndarray, float | None]:
    """Status of every trial (``KEPT``, ``OUTLIER``, ``PENDING``) and the restart noise of the
    kept ones (None while too few restarts are replicated to tell)."""
    status = np.zeros(values.size, dtype=np.int8)
    sigma = robust_sigma(points, values)
    if sigma is None:
        return status, None
    k = k * _small_sample_factor(k, _replicate_differences(points))
    for _ in range(rounds):
        new = _flag_once(points, values, sigma, k)
        if (new != KEPT).mean() > MAX_FLAGGED:  # outliers are the exception, not a quarter
            return np.zeros(values.size, dtype=np.int8), pooled_sigma(points, values)
        kept = new == KEPT
        refined = pooled_sigma(points[kept], values[kept])
        if refined is not None:
            sigma = refined
        if np.array_equal(new, status):
            break
        status = new
    return status, sigma


def pooled_sigma(points: np.ndarray, values: np.ndarray) -> float | None:
    """Pooled within-commit standard deviation, or None with fewer than 3 degrees of freedom."""
    if points.size == 0:
        return None
    uniq, inverse, counts = np.unique(points, return_inverse=True, return_counts=True)
    sums = np.bincount(inverse, weights=values)
    means = sums / counts
    ss = float(((values - means[inverse]) ** 2).sum())
    df = int((counts - 1).sum())
    if df < 3 or ss <= 0.0:
        return None
    return math.sqrt(ss / df)
