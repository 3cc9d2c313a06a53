"""The level of each replicated commit, robust to drift and to a change of the node's system.

Every decision that compares two commits (does the change reproduce, how large is the
culprit's step, how much of the change is left unexplained) reads their levels from one fit:

    y_t = level[point_t] + offset[epoch_t] + b[block_t] + e_t,   e ~ N(0, sigma^2)

- ``level`` per commit that has at least two kept trials (a commit measured once says nothing
  about the noise or the drift: its level is its reading);
- ``offset`` per system epoch: a change of the node's system (a power limit lowered from
  outside, a driver update) shifts every reading after it, so commits are compared only within
  an epoch, and across epochs only through commits measured in both;
- ``b ~ N(0, r sigma^2)`` per time block (``block_trials`` consecutive trials of one epoch): a
  neighbour's job that adds 10% for half an hour, or a slow thermal trend, moves every trial of
  a block alike. ``r = 0`` is the plain pooled-variance comparison; ``r`` is chosen on a small
  grid by its restricted (REML) likelihood with a prior that favours no drift, so clean data
  keep the plain comparison and its power, and a load step makes the fit compare trials within
  blocks (the schedule interleaves points, so every block holds several of them).

Generalised least squares with the block covariance ``I + r Z Z'`` is closed-form per block
(``V_k^-1 = I - r / (1 + r n_k) 11'``), so the fit costs one small dense solve per grid value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from scipy.stats import t as student_t

from orchestrator.stats.effect import LogDifference

# Block-effect variance in units of sigma^2, and its prior: no drift is the default belief.
DRIFT_GRID = (0.0, 0.5, 2.0, 8.0)
DRIFT_PRIOR = (0.94, 0.02, 0.02, 0.02)
MAX_FIT_POINTS = 40  # the most-measured commits carry the drift; the rest add only cost


@lru_cache(maxsize=1024)
def _t_quantile(q: float, df: int) -> float:
    """Student-t quantile: a handful of (confidence, df) pairs, asked for many times a
    decision, each a costly scipy call."""
    return float(student_t.ppf(q, df))


@dataclass(frozen=True)
class LevelFit:
    """Levels of the fitted commits with their covariance (in units of ``sigma2``)."""

    points: np.ndarray
    beta: np.ndarray
    cov: np.ndarray
    sigma2: float
    df: int
    r: float
    drift_weight: float  # posterior probability of block effects (r > 0)
    r_weights: tuple[tuple[float, float], ...]

    @property
    def sigma(self) -> float:
        return math.sqrt(self.sigma2) if self.sigma2 > 0 else math.nan

    def index(self, point: int) -> int | None:
        hit = np.flatnonzero(self.points == point)
        return int(hit[0]) if hit.size else None

    def contrast(self, weights: dict[int, float], confidence: float) -> LogDifference | None:
        """``sum_p w_p level_p`` with a t-interval, or None if a point is not fitted."""
        vec = np.zeros(self.points.size)
        for point, w in weights.items():
            i = self.index(point)
            if i is None:
                return None
            vec[i] += w
        if self.df <= 0 or not np.isfinite(self.sigma2):
            est = float(vec @ self.beta)
            return LogDifference(est, -math.inf, math.inf, math.inf, 0)
        est = float(vec @ self.beta)
        var = float(vec @ self.cov @ vec) * self.sigma2
        if not math.isfinite(var) or var < 0:
            return None
        se = math.sqrt(var)
        half = _t_quantile(0.5 + confidence / 2.0, self.df) * se
        return LogDifference(est, est - half, est + half, se, self.df)

    def difference(self, before: int, after: int, confidence: float) -> LogDifference | None:
        return self.contrast({after: 1.0, before: -1.0}, confidence)


def _design(points: np.ndarray, epochs: np.ndarray, fit_points: np.ndarray) -> np.ndarray:
    """Point indicators plus one offset column per epoch after the first seen."""
    cols = (points[:, None] == fit_points[None, :]).astype(float)
    seen = np.unique(epochs)
    if seen.size > 1:
        cols = np.hstack([cols, (epochs[:, None] == seen[None, 1:]).astype(float)])
    return cols


def _solve(x: np.ndarray, y: np.ndarray, blocks: np.ndarray, r: float,
           prec: np.ndarray | None = None):
    """GLS pieces for one ``r``: (beta, unscaled cov, RSS, rank, log REML likelihood).

    ``prec``: relative precision per trial (its variance is ``sigma^2 / prec``); with it the
    block inverse is ``W - r W11'W / (1 + r 1'W1)``, the same closed form on weighted sums."""
    n_blocks = int(blocks.max()) + 1 if blocks.size else 0
    if prec is None:
        counts = np.bincount(blocks, minlength=n_blocks).astype(float)
        wx, wy = x, y
    else:
        counts = np.bincount(blocks, weights=prec, minlength=n_blocks)
        wx, wy = x * prec[:, None], y * prec
    w = r / (1.0 + r * counts)
    block_x = np.zeros((n_blocks, x.shape[1]))
    np.add.at(block_x, blocks, wx)
    block_y = np.bincount(blocks, weights=wy, minlength=n_blocks)
    xtvx = x.T @ wx - block_x.T @ (w[:, None] * block_x)
    xtvy = x.T @ wy - block_x.T @ (w * block_y)
    ytvy = float(y @ wy - (w * block_y**2).sum())
    eigval, eigvec = np.linalg.eigh(xtvx)
    keep = eigval > 1e-9 * max(float(eigval.max()), 1e-300)
    inv = (eigvec[:, keep] / eigval[keep]) @ eigvec[:, keep].T
    beta = inv @ xtvy
    rss = max(ytvy - float(beta @ xtvy), 1e-300)
    rank = int(keep.sum())
    df = y.size - rank
    log_det_v = float(np.log1p(r * counts).sum())
    log_like = -0.5 * log_det_v - 0.5 * float(np.log(eigval[keep]).sum())
    log_like -= 0.5 * max(df, 0) * math.log(rss)
    return beta, inv, rss, df, log_like


def fit_levels(points: np.ndarray, values: np.ndarray, blocks: np.ndarray,
               epochs: np.ndarray, must: tuple[int, ...] = (),
               weights: np.ndarray | None = None) -> LevelFit | None:
    """Fit the levels of the replicated commits (the ``MAX_FIT_POINTS`` most measured, plus
    ``must`` when replicated). ``blocks`` must be nested in ``epochs``. ``weights``: relative
    precision per trial (trials of different repetition counts), None for all alike. None
    without any replicated commit."""
    uniq, counts = np.unique(points, return_counts=True)
    replicated = uniq[counts >= 2]
    if replicated.size == 0:
        return None
    if replicated.size > MAX_FIT_POINTS:
        by_count = replicated[np.argsort(-counts[counts >= 2], kind="stable")]
        chosen = set(by_count[:MAX_FIT_POINTS].tolist()) | (set(must) & set(replicated.tolist()))
        replicated = np.array(sorted(chosen))
    sel = np.isin(points, replicated)
    p, y, b, e = points[sel], values[sel], blocks[sel], epochs[sel]
    prec = None if weights is None else np.asarray(weights, dtype=float)[sel]
    _, b = np.unique(b, return_inverse=True)
    x = _design(p, e, replicated)
    centre = float(y.mean())
    y = y - centre
    results = []
    if y.size - x.shape[1] <= 0 or int(b.max()) + 1 < 3:
        grid = ((0.0, 1.0),)  # too little data to see drift
    else:
        grid = tuple(zip(DRIFT_GRID, DRIFT_PRIOR, strict=True))
    for r, prior in grid:
        beta, inv, rss, df, log_like = _solve(x, y, b, r, prec)
        results.append((log_like + math.log(prior), r, beta, inv, rss, df))
    logs = np.array([res[0] for res in results])
    post = np.exp(logs - logs.max())
    post /= post.sum()
    best = int(np.argmax(post))
    _, r, beta, inv, rss, df = results[best]
    m = replicated.size
    sigma2 = rss / df if df > 0 else math.nan
    weights = tuple((res[1], float(w)) for res, w in zip(results, post, strict=True))
    drift = float(sum(w for (rr, w) in weights if rr > 0))
    return LevelFit(replicated, beta[:m] + centre, inv[:m, :m], sigma2, df, r, drift, weights)
