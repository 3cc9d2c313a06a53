"""The change-point posterior of one search stage: where is the next culprit, if any?

Model, on the signed log scale (bad = higher), for the kept trials of the whole range:

    y_t = offset[epoch_t] + sum_j beta_j [point_t descends from culprit j]     (found culprits)
          + delta [point_t descends from h] + b[block_t] + e_t

Hypothesis ``h`` is "commit h is the next culprit"; "no change" drops the ``delta`` term. The
epoch offsets and the steps of culprits already found are nuisance parameters with flat priors
(integrated out exactly: they are linear), ``e ~ N(0, sigma^2)`` with ``p(sigma) ~ 1/sigma``
(Student-t tails), ``delta ~ N(0, g sigma^2)``, half-normal in the bad direction for the first
culprit (the change being chased) and two-sided for later ones (a later partial fix is a step
the other way), and time-block effects ``b ~ N(0, r sigma^2)`` for drift, with ``r`` averaged
over the grid weights of :mod:`.levels`. With ``P`` the GLS projection that removes the
nuisance columns under the block covariance ``V``, ``S_xx = x'Px``, ``S_xy = x'Py``,
``S_yy = y'Py`` and ``dof = N - rank(nuisance)``:

    log p(y | h)    = -1/2 log|V| - 1/2 log|F'V^-1 F| - 1/2 log(1 + g S_xx) - dof/2 log Q(h)
                      [+ log 2 P(delta > 0 | h, y)]
    Q(h)            = S_yy - S_xy^2 / (S_xx + 1/g)
    log p(y | none) = -1/2 log|V| - 1/2 log|F'V^-1 F| - dof/2 log S_yy

With one epoch, no found culprit and ``r = 0`` this is exactly the single change-point
posterior of :mod:`posterior` (the one the first benchmark validated).

A noise prior (``noise_df`` pseudo degrees of freedom holding the sum of squares ``noise_ss``:
a scaled inverse chi-square prior on sigma^2) adds ``noise_ss`` to ``S_yy`` and ``Q(h)`` and
``noise_df`` to ``dof``; a very large ``noise_df`` is the posterior for sigma known.

Hypotheses that the measured points cannot tell apart (no measured point between them on a
chain; the same set of measured descendants on a graph) share their statistics, so the
likelihood is evaluated once per such *cell*: the cost grows with the points measured, not
with the commits in the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy.special import logsumexp
from scipy.stats import t as _student_t

from orchestrator.strategies.bisect.history import History

# Pseudo degrees of freedom that fix sigma at a given value (the known-noise posterior, to the
# precision that matters here).
FIXED_DF = 1e4


@dataclass(frozen=True)
class StageData:
    """The kept trials and what the stage assumes about them."""

    points: np.ndarray  # point of each trial
    values: np.ndarray  # signed log value (bad = higher), any common shift
    blocks: np.ndarray  # time block of each trial, nested in epochs
    epochs: np.ndarray
    known: tuple[int, ...]  # culprits already found (their steps are nuisance parameters)
    hyps: np.ndarray  # the hypotheses of this stage (absolute points)
    log_prior: np.ndarray  # log prior weight of each hypothesis (any scale)
    null_prior: float  # prior probability of "no further change"
    g: float  # step prior variance in sigma^2 units
    one_sided: bool
    r_weights: tuple[tuple[float, float], ...] = ((0.0, 1.0),)
    # Relative precision of each trial (variance sigma^2 / w: trials of different repetition
    # counts); None: all alike, the plain model.
    weights: np.ndarray | None = None
    # Log prior mass of runs of hypotheses already summed, by (first, end) index: the prior
    # does not change between trials, and most cells survive a new measurement. Only for one
    # ``hyps``/``log_prior`` pair; None: summed afresh.
    prior_runs: dict[tuple[int, int], float] | None = None
    # What is known of sigma besides these trials, as a scaled inverse chi-square prior:
    # ``noise_df`` pseudo degrees of freedom holding the sum of squares ``noise_ss`` (an
    # earlier run's restarts on the node; a very large ``noise_df`` fixes sigma, as the
    # naming rule's stress test does). 0: the plain ``p(sigma) ~ 1/sigma``.
    noise_ss: float = 0.0
    noise_df: float = 0.0


@dataclass(frozen=True)
class StagePosterior:
    """Posterior over the stage's hypotheses (aligned with ``hyps``) and "no change"."""

    hyps: np.ndarray
    mass: np.ndarray
    null_mass: float
    step_sign: np.ndarray  # sign of the posterior mean step under each hypothesis
    # The noise under the likeliest hypothesis: residual variance (noise prior included) and
    # its degrees of freedom, from the drift grid's likeliest row.
    resid_var: float = math.nan
    resid_df: float = 0.0

    def best(self) -> tuple[int, float]:
        i = int(np.argmax(self.mass))
        return int(self.hyps[i]), float(self.mass[i])


def _cells(history: History, hyps: np.ndarray, measured: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """``(cell_of_hypothesis, reads)``: ``reads[c, i]`` says whether measured point ``i``
    reads bad under the hypotheses of cell ``c``."""
    if history.linear:
        first = np.searchsorted(measured, hyps)  # first measured point at or after h
        # ``hyps`` ascend, so ``first`` does: its cells are runs, found without sorting N.
        starts = np.flatnonzero(np.concatenate(([True], first[1:] != first[:-1])))
        cells = first[starts]
        cell_of = np.repeat(np.arange(starts.size), np.diff(np.append(starts, first.size)))
        reads = np.arange(measured.size)[None, :] >= cells[:, None]
        return cell_of, reads
    rows = history.bad_matrix(hyps, measured)
    reads, cell_of = np.unique(rows, axis=0, return_inverse=True)
    return cell_of.ravel(), reads


def stage_posterior(history: History, data: StageData) -> StagePosterior:
    hyps = data.hyps
    if data.values.size < 2 or hyps.size == 0:
        mass = np.full(hyps.size, (1.0 - data.null_prior) / max(hyps.size, 1))
        return StagePosterior(hyps, mass, data.null_prior, np.ones(hyps.size))
    measured, point_idx = np.unique(data.points, return_inverse=True)
    cell_of, reads = _cells(history, hyps, measured)
    n_cells = reads.shape[0]
    y = data.values - data.values.mean()
    _, blk = np.unique(data.blocks, return_inverse=True)
    n_blocks = int(blk.max()) + 1
    # Nuisance columns: epoch intercepts and the steps of the culprits found so far.
    epochs = np.unique(data.epochs)
    cols = [(data.epochs == e).astype(float) for e in epochs]
    for culprit in data.known:
        cols.append(np.array([history.descends(int(p), culprit) for p in measured],
                             dtype=float)[point_idx])
    f = np.stack(cols, axis=1)
    # Per block and measured point: trial counts and sums (precision-weighted when trials
    # differ in precision: every sum below then carries W, the GLS form is unchanged).
    prec = None if data.weights is None else np.asarray(data.weights, dtype=float)
    wf = f if prec is None else f * prec[:, None]
    wy = y if prec is None else y * prec
    counts = np.zeros((n_blocks, measured.size))
    sums = np.zeros((n_blocks, measured.size))
    np.add.at(counts, (blk, point_idx), 1.0 if prec is None else prec)
    np.add.at(sums, (blk, point_idx), wy)
    if history.linear:  # bad points of cell c are measured points c.. (reverse cumsum)
        first = _first_bad(reads)
        m_bad = _tail_sums(counts)[:, first]
        t_bad = _tail_sums(sums)[:, first]
    else:
        m_bad = counts @ reads.T
        t_bad = sums @ reads.T
    point_f = np.zeros((measured.size, f.shape[1]))
    np.add.at(point_f, point_idx, wf)
    x_f = reads.astype(float) @ point_f  # (cells, nuisance)
    n_k = counts.sum(axis=1)
    s_k = sums.sum(axis=1)
    f_k = np.zeros((n_blocks, f.shape[1]))
    np.add.at(f_k, blk, wf)
    ff, fy, yy = f.T @ wf, f.T @ wy, float(y @ wy)
    n_total = float(y.size)

    cell_prior = _cell_log_prior(cell_of, data.log_prior, n_cells, data.prior_runs)
    shift = float(cell_prior.max())
    log_null_prior = math.log(data.null_prior) if data.null_prior > 0 else -math.inf
    log_steps_prior = (cell_prior - shift
                       - logsumexp(cell_prior - shift) + math.log1p(-data.null_prior))
    rows, signs, noise = [], [], []
    for r, weight in data.r_weights:
        # A trace of drift belief changes nothing but the cost. A weight of exactly zero (the
        # level fit's posterior underflows when drift is overwhelming, so even r = 0 can get
        # it) is a hypothesis with no mass: its row would be log(0).
        if weight <= 0.0 or (weight < 0.01 and r > 0):
            continue
        w = r / (1.0 + r * n_k)
        g_mat = ff - f_k.T @ (w[:, None] * f_k)
        fvy = fy - f_k.T @ (w * s_k)
        yvy = yy - float((w * s_k**2).sum())
        eigval, eigvec = np.linalg.eigh(g_mat)
        keep = eigval > 1e-9 * max(float(eigval.max()), 1e-300)
        g_inv = (eigvec[:, keep] / eigval[keep]) @ eigvec[:, keep].T
        rank = int(keep.sum())
        dof = max(n_total - rank, 1.0) + data.noise_df
        xvx = (m_bad - w[:, None] * m_bad**2).sum(axis=0)
        xvy = (t_bad - (w * s_k)[:, None] * m_bad).sum(axis=0)
        xvf = x_f - (m_bad * w[:, None]).T @ f_k
        syy = max(yvy - float(fvy @ g_inv @ fvy), 1e-300) + data.noise_ss
        sxx = np.maximum(xvx - np.einsum("ij,jk,ik->i", xvf, g_inv, xvf), 0.0)
        sxy = xvy - xvf @ (g_inv @ fvy)
        const = -0.5 * float(np.log1p(r * n_k).sum()) - 0.5 * float(np.log(eigval[keep]).sum())
        shrink = sxx + 1.0 / data.g
        resid = np.maximum(syy - sxy**2 / shrink, 1e-12 * syy)
        log_steps = const - 0.5 * np.log1p(data.g * sxx) - 0.5 * dof * np.log(resid)
        if data.one_sided:
            z = (sxy / shrink) / np.sqrt(resid / (dof * shrink))
            log_steps = log_steps + math.log(2.0) + _student_t.logcdf(z, dof)
        log_null = const - 0.5 * dof * math.log(syy)
        rows.append(np.append(log_steps + log_steps_prior, log_null + log_null_prior)
                    + math.log(weight))
        signs.append(np.sign(sxy))
        noise.append((resid, dof))
    table = np.array(rows)
    joint = logsumexp(table, axis=0)
    joint -= joint.max()
    post = np.exp(joint)
    post /= post.sum()
    by_r = np.exp(table - table.max(axis=1, keepdims=True))
    sign = np.sign((np.array(signs) * by_r[:, :-1]).sum(axis=0))
    # Spread each cell's mass over its hypotheses by prior.
    within = np.exp(data.log_prior - cell_prior[cell_of])
    mass = post[:-1][cell_of] * within
    row = int(np.argmax(table.max(axis=1)))
    resid, dof = noise[row]
    best = int(np.argmax(post[:-1]))
    return StagePosterior(hyps, mass, float(post[-1]), np.where(sign == 0, 1.0, sign)[cell_of],
                          resid_var=float(resid[best]) / dof, resid_df=float(dof))


_MAX_PRIOR_RUNS = 4096


def _cell_log_prior(cell_of: np.ndarray, log_prior: np.ndarray, n_cells: int,
                    runs: dict[tuple[int, int], float] | None = None) -> np.ndarray:
    """Log prior mass of each cell. Where the cells are runs of hypotheses (a chain) each is
    added in the same order as ``logaddexp.at`` would, without its per-element cost, and a
    run summed before (``runs``) is not summed again."""
    if cell_of.size and cell_of[0] == 0 and np.all(np.diff(cell_of) >= 0):
        starts = np.flatnonzero(np.concatenate(([True], cell_of[1:] != cell_of[:-1])))
        if starts.size == n_cells:
            if runs is None:
                return np.logaddexp.reduceat(log_prior, starts)
            if len(runs) > _MAX_PRIOR_RUNS:
                runs.clear()
            ends = np.append(starts[1:], cell_of.size)
            out = np.empty(n_cells)
            for i, (first, end) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
                value = runs.get((first, end))
                if value is None:
                    value = runs[(first, end)] = float(
                        np.logaddexp.reduceat(log_prior[first:end], [0])[0])
                out[i] = value
            return out
    cell_prior = np.full(n_cells, -np.inf)
    np.logaddexp.at(cell_prior, cell_of, log_prior)
    return cell_prior


def _tail_sums(a: np.ndarray) -> np.ndarray:
    """``out[:, i] = a[:, i:].sum(axis=1)``, with a last column of zeros."""
    tail = np.cumsum(a[:, ::-1], axis=1)[:, ::-1]
    return np.hstack([tail, np.zeros((a.shape[0], 1))])


def _first_bad(reads: np.ndarray) -> np.ndarray:
    """On a chain, the first measured point that reads bad in each cell (cells read bad from
    that point on)."""
    return np.argmax(reads, axis=1) + np.where(reads.any(axis=1), 0, reads.shape[1])
