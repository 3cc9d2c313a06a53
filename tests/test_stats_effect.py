"""Effect statistics: point estimates, interval coverage on simulated restarts, edge cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from orchestrator.stats import effect, log_difference, log_effect, summarize_repetitions


def _simulated_pairs(seed: int, cases: int):
    """Restart-level values as the benchmark draws them: 3-8 trials a side, CV 3-15%."""
    rng = np.random.default_rng(seed)
    for _ in range(cases):
        n_before, n_after = rng.integers(3, 9, size=2)
        change = rng.uniform(-0.2, 0.6)
        cv = rng.uniform(0.03, 0.15)
        before = 20.0 * (1.0 + cv * rng.standard_normal(n_before))
        after = 20.0 * (1.0 + change) * (1.0 + cv * rng.standard_normal(n_after))
        yield before.tolist(), after.tolist(), 100.0 * change


def test_point_estimate_is_relative_change_of_means() -> None:
    result = effect([19.0, 21.0], [28.0, 30.0, 29.0])
    assert result.pct == pytest.approx(100.0 * (29.0 / 20.0 - 1.0))
    assert (result.n_before, result.n_after) == (2, 3)
    assert result.ci[0] < result.pct < result.ci[1]
    assert result.significant and result.p_value < 0.05


def test_fieller_interval_covers_the_true_change_at_least_90_percent() -> None:
    covered = 0
    for before, after, truth in _simulated_pairs(seed=7, cases=500):
        result = effect(before, after, 0.95)
        covered += result.ci[0] <= truth <= result.ci[1]
    assert covered / 500 >= 0.90


def test_pooled_log_interval_covers_the_true_change_at_least_90_percent() -> None:
    covered = 0
    for before, after, truth in _simulated_pairs(seed=11, cases=500):
        result = log_effect(before, after, 0.95)
        covered += result.ci[0] <= truth <= result.ci[1]
    assert covered / 500 >= 0.90


def test_p_value_is_uniform_when_nothing_changed() -> None:
    rng = np.random.default_rng(3)
    p_values = [
        effect(
            (10 * (1 + 0.05 * rng.standard_normal(5))).tolist(),
            (10 * (1 + 0.05 * rng.standard_normal(5))).tolist(),
        ).p_value
        for _ in range(400)
    ]
    false_alarms = np.mean(np.array(p_values) < 0.05)
    assert 0.02 <= false_alarms <= 0.09


def test_pooling_variance_from_other_candidates_narrows_the_interval() -> None:
    before, after = [math.log(v) for v in (19.2, 18.9)], [math.log(v) for v in (29.1, 28.8)]
    alone = log_difference(before, after, 0.95)
    pooled = log_difference(before, after, 0.95, extra_ss=0.0004 * 20, extra_df=20)
    assert alone.df == 2 and pooled.df == 22
    assert pooled.hi - pooled.lo < alone.hi - alone.lo
    assert pooled.diff == pytest.approx(alone.diff)


def test_one_trial_a_side_has_no_interval_and_constant_data_has_a_point() -> None:
    single = effect([20.0], [30.0])
    assert single.ci == (-math.inf, math.inf) and math.isnan(single.p_value)
    constant = effect([20.0, 20.0], [30.0, 30.0])
    assert constant.ci == (pytest.approx(50.0), pytest.approx(50.0))
    assert constant.p_value == 0.0


@pytest.mark.parametrize(
    "before, after, confidence",
    [([], [1.0], 0.95), ([1.0], [1.0], 1.5), ([0.0, 0.0], [1.0, 2.0], 0.95)],
)
def test_bad_inputs_are_refused(before, after, confidence) -> None:
    with pytest.raises(ValueError):
        effect(before, after, confidence)


def test_log_effect_refuses_non_positive_values() -> None:
    with pytest.raises(ValueError):
        log_effect([1.0, -1.0], [2.0, 3.0])


def test_summarize_repetitions_mean_median_and_trim() -> None:
    summary = summarize_repetitions([10.0, 11.0, 12.0, 13.0, 100.0])
    assert summary.n == 5
    assert summary.mean == pytest.approx(29.2)
    assert summary.median == 12.0
    assert summary.value == pytest.approx(29.2)
    trimmed = summarize_repetitions([10.0, 11.0, 12.0, 13.0, 100.0], trim=0.2)
    assert trimmed.value == pytest.approx(12.0)
    assert summary.cv > 1.0  # the straggler dominates the within-trial spread
    with pytest.raises(ValueError):
        summarize_repetitions([])
