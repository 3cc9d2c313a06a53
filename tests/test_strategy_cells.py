"""The bisect strategy's per-cell shortcuts give what the per-hypothesis formulas give.

A decision must not cost a pass of the Student-t over every commit; the shortcuts that avoid
it (cells of hypotheses the measured points cannot tell apart, the prior summed once) are
checked here against the plain computations they replace.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from conftest import point_stats

from orchestrator.strategies.base import Observation
from orchestrator.strategies.bisect import BisectStrategy
from orchestrator.strategies.bisect import posterior as posterior_module
from orchestrator.strategies.bisect.forecast import mean_squared_step
from orchestrator.strategies.bisect.model import _cell_log_prior
from orchestrator.strategies.bisect.placement import _member, _sorted_unique
from orchestrator.strategies.bisect.posterior import (
    range_data,
    range_log_prior,
    range_posterior,
)


def _runs(rng: np.random.Generator, n: int) -> np.ndarray:
    cuts = np.sort(rng.integers(1, n, size=rng.integers(0, 12)))
    return np.unique(np.searchsorted(cuts, np.arange(n), side="right"), return_inverse=True)[1]


def test_cell_prior_of_runs_is_bit_identical_to_logaddexp_at_and_reuses_runs():
    rng = np.random.default_rng(7)
    for i in range(60):
        n = int(rng.integers(2, 800))
        cell_of = _runs(rng, n)
        log_prior = np.zeros(n) if i % 2 else np.log(rng.gamma(0.5, size=n))
        n_cells = int(cell_of.max()) + 1
        plain = np.full(n_cells, -np.inf)
        np.logaddexp.at(plain, cell_of, log_prior)
        runs: dict[tuple[int, int], float] = {}
        assert np.array_equal(_cell_log_prior(cell_of, log_prior, n_cells), plain)
        assert np.array_equal(_cell_log_prior(cell_of, log_prior, n_cells, runs), plain)
        assert len(runs) == n_cells
        assert np.array_equal(_cell_log_prior(cell_of, log_prior, n_cells, runs), plain)
    scattered = np.array([1, 0, 1, 2, 0])  # not runs (a graph's cells): the general path
    plain = np.full(3, -np.inf)
    np.logaddexp.at(plain, scattered, np.arange(5.0))
    assert np.array_equal(_cell_log_prior(scattered, np.arange(5.0), 3, {}), plain)


def _per_hypothesis_step2(counts, sums, mass, sigma2):
    n_left, s_left = np.cumsum(counts)[:-1], np.cumsum(sums)[:-1]
    n_all, s_all = counts.sum(), sums.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        diff = (s_all - s_left) / (n_all - n_left) - s_left / n_left
        squared = diff**2 - sigma2 * (1.0 / n_left + 1.0 / (n_all - n_left))
    use = np.isfinite(squared) & (mass[1:] > 0)
    return float(mass[1:][use] @ squared[use]) / float(mass[1:][use].sum())


def test_mean_squared_step_over_cells_matches_every_hypothesis():
    rng = np.random.default_rng(3)
    for _ in range(40):
        n = int(rng.integers(3, 500))
        counts = np.zeros(n)
        counts[[0, n - 1]] = rng.integers(1, 5, size=2)
        counts[rng.integers(0, n, size=rng.integers(0, 8))] += 1
        sums = counts * rng.normal(0.0, 0.3, size=n)
        mass = rng.dirichlet(np.ones(n))
        mass[0] = 0.0
        got = mean_squared_step(counts, sums, mass, 0.01)
        want = _per_hypothesis_step2(counts, sums, mass, 0.01)
        if want <= 0.0:
            assert got is None
        else:
            assert got == pytest.approx(want, rel=1e-9)


def test_range_data_is_the_posterior_data_without_the_posterior():
    rng = np.random.default_rng(5)
    n = 300
    values = [[] for _ in range(n)]
    for p in (0, 0, n - 1, n - 1, 150, 75, 220):
        values[p].append(float(rng.normal(0.1 if p >= 200 else 0.0, 0.02)))
    stats = point_stats(values)
    log_prior = np.log(rng.gamma(1.0, size=n))
    full = range_posterior(0, n - 1, stats, np.zeros(n, bool), log_prior, 3.0, 0.1).data
    alone = range_data(stats, range_log_prior(log_prior, 0.1), 3.0)
    assert full is not None
    for name in ("counts", "sums", "log_prior_steps"):
        assert np.array_equal(getattr(full, name), getattr(alone, name))
    assert (full.squares, full.g, full.log_prior_null) == (
        alone.squares, alone.g, alone.log_prior_null)
    sums = alone.prior_sums()
    assert sums is alone.prior_sums()  # made once per range prior
    assert sums.cum_p[-1] == pytest.approx(np.exp(alone.log_prior_steps
                                                  - alone.log_prior_steps.max()).sum())


def test_sorted_helpers_match_numpy():
    rng = np.random.default_rng(2)
    for _ in range(30):
        pool = rng.integers(0, 200, size=rng.integers(0, 60))
        points = rng.integers(-5, 205, size=20)
        assert np.array_equal(_sorted_unique(pool), np.unique(pool))
        assert np.array_equal(_member(points, np.unique(pool)), np.isin(points, pool))
        assert np.array_equal(_member(points, pool), np.isin(points, pool))


def test_a_decision_over_many_commits_evaluates_the_t_tail_per_cell(monkeypatch):
    """No Student-t pass over every commit: the t is evaluated on arrays of cells (a few per
    measured point), never of hypotheses."""
    seen: list[int] = []
    real = posterior_module._student_t

    class Recording:
        def logcdf(self, x, df):
            seen.append(int(np.size(x)))
            return real.logcdf(x, df)

    from orchestrator.strategies.bisect import model as bisect_model

    monkeypatch.setattr(posterior_module, "_student_t", Recording())
    monkeypatch.setattr(bisect_model, "_student_t", Recording())
    n, culprit = 20_000, 12_345
    rng = random.Random(1)
    strategy = BisectStrategy(n, confidence=0.99)
    observations: list[Observation] = []
    for _ in range(24):
        proposals = strategy.propose(observations, [], 2)
        if not proposals:
            break
        for p in proposals:
            level = 1.2 if p.point >= culprit else 1.0
            observations.append(Observation(p.point, level * (1 + 0.02 * rng.gauss(0, 1)),
                                            trial_id=len(observations)))
        strategy.verdict(observations)
    assert seen and max(seen) < 200, max(seen)
