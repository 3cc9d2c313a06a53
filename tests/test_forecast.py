"""The bisect strategy's forecast of the trials it still needs (the basis of the bisect ETA)."""

from __future__ import annotations

import math

import numpy as np

from experiments.bench_localize import N_COMMITS, REGIMES, VirtualOracle
from experiments.forecast_check import ratios
from orchestrator.strategies import BisectStrategy, Observation
from orchestrator.strategies.bisect.forecast import remaining_trials


def test_the_forecast_grows_with_noise_and_with_what_is_unknown():
    start = math.log2(255)
    clean, noisy = remaining_trials(start, start, 4.0, 0), remaining_trials(start, start, 1.0, 0)
    assert clean is not None and noisy is not None and noisy > 4 * clean
    assert remaining_trials(start, start, 1.0, 40) == noisy - 40
    # Outgrown: what the posterior still does not know is the estimate, never zero or less.
    late = remaining_trials(start, 2.0, 1.0, 10 * noisy)
    assert late is not None and 0 < late < noisy
    assert remaining_trials(start, 1.0, 0.0, 0) is None
    assert remaining_trials(start, 1.0, math.nan, 0) is None


def test_no_forecast_before_the_endpoints_reproduce():
    regime = next(r for r in REGIMES if r.name == "decode_like")
    oracle = VirtualOracle(regime, 0)
    strategy = BisectStrategy(N_COMMITS)
    observations: list[Observation] = []
    forecasts = []
    while proposals := strategy.propose(observations, [], 1):
        proposal = proposals[0]
        forecasts.append((proposal.phase, strategy.verdict(observations).expected_remaining))
        value = oracle.measure(proposal.point)
        observations.append(Observation(proposal.point, value, trial_id=len(observations)))
    assert all(left is None for phase, left in forecasts if phase == "reproduce")
    assert any(left is not None and left > 0 for phase, left in forecasts if phase == "search")


def test_the_first_forecast_is_about_right_for_a_large_change():
    """+53% in 10% noise: the first forecast (just reproduced) is within a factor of two of
    the trials the run then spends, in most cases (measured median 0.96)."""
    first = ratios("seed_verify", 12)["first"]
    assert 0.6 < float(np.median(first)) < 1.6
    assert np.mean((first > 0.5) & (first < 2.0)) >= 0.75
