"""BisectStrategy driven through the controller's propose/verdict loop against seeded oracles."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from orchestrator.strategies import (
    NOT_REPRODUCIBLE_MESSAGE,
    BisectStrategy,
    Observation,
    Verdict,
)

Oracle = Callable[[int], "float | None"]


def step_oracle(
    culprits: dict[int, float], cv: float, seed: int, base: float = 19.0
) -> Oracle:
    """Trial values with multiplicative steps at the culprits and restart-level noise."""
    rng = np.random.default_rng(seed)

    def measure(point: int) -> float:
        level = base
        for culprit, effect in culprits.items():
            if point >= culprit:
                level *= 1.0 + effect
        return level * (1.0 + cv * rng.standard_normal())

    return measure


def run(
    strategy: BisectStrategy, oracle: Oracle, k: int = 1, limit: int = 600
) -> tuple[Verdict, list[Observation], int]:
    observations: list[Observation] = []
    rounds = 0
    while len(observations) < limit:
        proposals = strategy.propose(observations, [], k)
        if not proposals:
            break
        rounds += 1
        for proposal in proposals:
            observations.append(Observation(proposal.point, oracle(proposal.point)))
    return strategy.verdict(observations), observations, rounds


@pytest.mark.parametrize(
    "effect, cv, seeds",
    [(0.53, 0.10, range(6)), (0.08, 0.05, range(3)), (0.05, 0.03, range(3))],
    ids=["seed_verify", "decode_like", "subtle"],
)
def test_localizes_the_culprit_with_stated_confidence(effect, cv, seeds) -> None:
    for seed in seeds:
        culprit = int(np.random.default_rng(100 + seed).integers(1, 64))
        verdict, observations, _ = run(BisectStrategy(64), step_oracle({culprit: effect}, cv, seed))
        assert verdict.done and verdict.status == "found", verdict.message
        assert verdict.top is not None and verdict.top.point == culprit, verdict.message
        assert verdict.top.probability >= 0.99
        assert verdict.n_trials == len(observations)
        assert verdict.top.effect_pct == pytest.approx(100 * effect, abs=100 * effect * 0.8)
        assert len(verdict.posterior) == 64 and abs(sum(verdict.posterior) - 1.0) < 0.02


def test_reproduces_first_with_interleaved_endpoints() -> None:
    strategy = BisectStrategy(32)
    oracle = step_oracle({20: 0.5}, 0.03, seed=1)
    observations: list[Observation] = []
    phases = []
    while True:
        proposals = strategy.propose(observations, [], 1)
        if not proposals or proposals[0].phase != "reproduce":
            break
        phases.append(proposals[0].point)
        observations.append(Observation(proposals[0].point, oracle(proposals[0].point)))
    assert phases[:4] == [0, 31, 0, 31]
    assert len(phases) <= 6  # a +50% change in 3% noise is confirmed with a few trials
    assert strategy.verdict(observations).status == "searching"


def test_big_effect_needs_few_trials_and_calibration_holds_over_many_cases() -> None:
    correct, trials = 0, []
    for seed in range(40):
        culprit = int(np.random.default_rng(500 + seed).integers(1, 128))
        verdict, observations, _ = run(
            BisectStrategy(128), step_oracle({culprit: 0.5}, 0.10, seed + 500)
        )
        assert verdict.top is not None and verdict.top.probability >= 0.99
        correct += verdict.top.point == culprit
        trials.append(len(observations))
    assert correct >= 39  # stated >= 0.99 each: at most one miss is plausible
    assert np.mean(trials) < 20


def test_untestable_commits_are_skipped_and_make_the_answer_a_range() -> None:
    broken = set(range(20, 25))
    noisy = step_oracle({22: 0.4}, 0.03, seed=3)
    verdict, observations, _ = run(
        BisectStrategy(48), lambda p: None if p in broken else noisy(p)
    )
    assert verdict.status == "found", verdict.message
    assert verdict.range == (19, 25)
    assert verdict.top is not None and verdict.top.probability >= 0.99
    assert "one of points 20..25" in verdict.message
    failed = [o.point for o in observations if o.value is None]
    assert all(failed.count(p) == 1 for p in broken)  # never retried, never counted as slow


def test_an_untestable_neighbour_is_replaced_by_the_next_point() -> None:
    noisy = step_oracle({30: 0.4}, 0.03, seed=4)
    verdict, _, _ = run(BisectStrategy(64), lambda p: None if p == 29 else noisy(p))
    assert verdict.status == "found"
    assert verdict.top is not None and verdict.top.point == 30
    assert verdict.range == (28, 30)


def test_reversed_endpoints_stop_with_reversed() -> None:
    verdict, observations, _ = run(BisectStrategy(64), step_oracle({10: -0.3}, 0.03, seed=5))
    assert verdict.done and verdict.status == "reversed"
    assert verdict.culprits == [] and {o.point for o in observations} == {0, 63}


def test_good_endpoint_like_bad_one_is_not_reproducible() -> None:
    strategy = BisectStrategy(64, min_effect_pct=10.0)
    verdict, observations, _ = run(strategy, step_oracle({}, 0.03, seed=6))
    assert verdict.done and verdict.status == "not_reproducible"
    assert verdict.message.startswith(NOT_REPRODUCIBLE_MESSAGE)
    assert {o.point for o in observations} == {0, 63} and len(observations) <= 12


def test_reproduction_rarely_confirms_a_change_that_is_not_there() -> None:
    confirmed, spent = 0, []
    for seed in range(60):
        strategy = BisectStrategy(16)
        oracle = step_oracle({}, 0.05, seed=3000 + seed)
        observations: list[Observation] = []
        while True:
            proposals = strategy.propose(observations, [], 2)
            if not proposals or proposals[0].phase != "reproduce":
                break
            observations += [Observation(p.point, oracle(p.point)) for p in proposals]
        confirmed += strategy.verdict(observations).status != "not_reproducible"
        spent.append(len(observations))
    assert confirmed <= 8  # planned looks keep false confirmations near 5-7%
    assert max(spent) <= 2 * 64


def test_two_culprits_are_both_found() -> None:
    verdict, _, _ = run(BisectStrategy(64), step_oracle({20: 0.3, 45: 0.3}, 0.02, seed=8))
    assert verdict.status == "found", verdict.message
    assert sorted(c.point for c in verdict.culprits) == [20, 45]
    assert all(c.probability >= 0.99 for c in verdict.culprits)
    assert any(0.3 < (c.explained or 0) < 0.8 for c in verdict.culprits)  # the first of two
    assert "Found 2 culprits" in verdict.message


def test_batches_fill_k_slots_without_duplicates_and_respect_pending() -> None:
    strategy = BisectStrategy(256)
    oracle = step_oracle({100: 0.5}, 0.03, seed=9)
    first = strategy.propose([], [], 4)
    assert [p.point for p in first] == [0, 255, 0, 255]
    observations = [Observation(p.point, oracle(p.point)) for p in first]
    batch = strategy.propose(observations, [], 4)
    points = [p.point for p in batch]
    assert [p.phase for p in batch] == ["search"] * 4
    assert len(set(points)) == 4
    later = strategy.propose(observations, points, 4)
    assert not set(p.point for p in later) & set(points)
    assert len(later) == 4


def test_k4_needs_far_fewer_rounds() -> None:
    rounds: dict[int, list[int]] = {1: [], 4: []}
    for seed in range(6):
        for k in rounds:
            oracle = step_oracle({40 + 13 * seed: 0.12}, 0.05, seed)
            verdict, _, r = run(BisectStrategy(128), oracle, k=k)
            assert verdict.top is not None and verdict.top.point == 40 + 13 * seed
            rounds[k].append(r)
    assert np.mean(rounds[1]) >= 2.5 * np.mean(rounds[4])


def test_prior_weights_help_and_never_rule_a_commit_out() -> None:
    culprit = 40
    helped, plain = [], []
    weights = np.full(128, 0.1)
    weights[culprit] = 20.0
    for seed in range(4):
        oracle_seed = 1000 + seed
        verdict, obs, _ = run(BisectStrategy(128), step_oracle({culprit: 0.1}, 0.04, oracle_seed))
        plain.append(len(obs))
        verdict, obs, _ = run(
            BisectStrategy(128, prior_weights=weights),
            step_oracle({culprit: 0.1}, 0.04, oracle_seed),
        )
        assert verdict.top is not None and verdict.top.point == culprit
        helped.append(len(obs))
    assert np.mean(helped) < np.mean(plain)
    zero = np.ones(128)
    zero[culprit] = 0.0
    verdict, _, _ = run(
        BisectStrategy(128, prior_weights=zero), step_oracle({culprit: 0.3}, 0.03, 2000)
    )
    assert verdict.top is not None and verdict.top.point == culprit


def test_decrease_direction_finds_a_throughput_drop() -> None:
    verdict, _, _ = run(
        BisectStrategy(64, direction="decrease"), step_oracle({33: -0.3}, 0.04, seed=11)
    )
    assert verdict.status == "found" and verdict.top is not None and verdict.top.point == 33
    assert verdict.top.effect_pct < -15


def test_suspect_trials_are_ignored() -> None:
    oracle = step_oracle({12: 0.4}, 0.03, seed=12)
    strategy = BisectStrategy(32)
    observations: list[Observation] = []
    while True:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        point = proposals[0].point
        # Every first trial at a point runs on a throttled GPU and reads absurdly slow.
        if not any(o.point == point for o in observations):
            observations.append(Observation(point, 500.0, suspect=True))
        observations.append(Observation(point, oracle(point)))
    verdict = strategy.verdict(observations)
    assert verdict.status == "found" and verdict.top is not None and verdict.top.point == 12


def test_replay_from_scratch_matches_incremental_state() -> None:
    strategy = BisectStrategy(128)
    _, observations, _ = run(strategy, step_oracle({70: 0.2}, 0.05, seed=13), limit=25)
    fresh = BisectStrategy(128)
    assert fresh.verdict(observations) == strategy.verdict(observations)
    assert fresh.propose(observations, [], 3) == strategy.propose(observations, [], 3)
    # A different history (not an extension) is replayed, not mixed in.
    assert strategy.verdict(observations[:10]) == BisectStrategy(128).verdict(observations[:10])


def test_unmeasurable_endpoint_is_inconclusive_and_budget_ends_the_run() -> None:
    noisy = step_oracle({5: 0.5}, 0.03, seed=14)
    verdict, _, _ = run(BisectStrategy(16), lambda p: None if p == 15 else noisy(p))
    assert verdict.status == "inconclusive" and "bad endpoint" in verdict.message
    verdict, observations, _ = run(
        BisectStrategy(256, max_trials=12), step_oracle({99: 0.05}, 0.05, seed=15)
    )
    assert verdict.status == "budget_exhausted" and len(observations) == 12
    assert verdict.top is None or verdict.top.probability < 0.99


def test_decisions_take_milliseconds_for_two_thousand_commits() -> None:
    strategy = BisectStrategy(2000)
    oracle = step_oracle({1234: 0.08}, 0.05, seed=16)
    verdict, observations, _ = run(strategy, oracle, limit=30)
    started = time.perf_counter()
    for _ in range(5):
        strategy.propose(observations, [], 1)
        strategy.verdict(observations)
    assert (time.perf_counter() - started) / 5 < 0.25
    observations.append(Observation(1000, oracle(1000)))
    started = time.perf_counter()
    strategy.propose(observations, [], 4)
    assert time.perf_counter() - started < 0.5


@pytest.mark.parametrize(
    "kwargs",
    [{"n": 1}, {"n": 8, "direction": "up"}, {"n": 8, "confidence": 1.0}, {"n": 8, "max_trials": 2}],
)
def test_bad_arguments_are_refused(kwargs) -> None:
    n = kwargs.pop("n")
    with pytest.raises(ValueError):
        BisectStrategy(n, **kwargs)
    with pytest.raises(ValueError):
        BisectStrategy(8, prior_weights=[1.0] * 7)
