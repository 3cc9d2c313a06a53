"""The bisect strategy alone (pure, no processes): reproduce-first decisions and localization on
the benchmark's virtual oracle. Milliseconds to a few seconds per case."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest
from conftest import seed_counts

from experiments.bench_localize import N_COMMITS, REGIMES, VirtualOracle, drive, run_benchmark
from orchestrator.strategies import BisectStrategy, Observation
from orchestrator.strategies.bisect import BisectSettings
from orchestrator.strategies.bisect.reproduce import fresh_endpoint_ratio


def _regime(name: str):
    return next(r for r in REGIMES if r.name == name)


def _run_endpoints(good_level: float, bad_level: float, cv: float, seed: int,
                   strategy: BisectStrategy, limit: int = 400) -> list[Observation]:
    """Lognormal restarts: the bad endpoint at `bad_level`, every other point at `good_level`
    (with no change the search, should the repeated reproduce looks let it start, finds none)."""
    rng = np.random.default_rng(seed)
    obs: list[Observation] = []
    while len(obs) < limit:
        proposals = strategy.propose(obs, [], 1)
        if not proposals:
            break
        for p in proposals:
            level = good_level if p.point < strategy.n - 1 else bad_level
            obs.append(Observation(p.point, level * math.exp(cv * rng.standard_normal()),
                                   trial_id=len(obs)))
    return obs


@pytest.mark.parametrize("seed", range(8))
def test_no_change_stops_as_not_reproducible_once_the_endpoints_measure_alike(seed: int):
    strategy = BisectStrategy(50)
    obs = _run_endpoints(19.0, 19.0, 0.02, seed, strategy)
    verdict = strategy.verdict(obs)
    # Checked after every pair, the reproduce interval sometimes passes by luck; the search then
    # re-measures the endpoints until their later trials or all their trials refute the change,
    # and the verdict withdraws the reproduction in so many words.
    # When the search runs to the budget instead (seed 6: a head-to-head of two neighbours at
    # P ~ 0.93 never ends, its forecast stays small), the unconfirmed reproduction is retracted
    # all the same, never left standing as "budget exhausted".
    assert verdict.done and verdict.status == "not_reproducible" and not verdict.culprits
    assert len(obs) <= strategy.budget
    lo, hi = verdict.total_effect_ci
    if strategy.reproduction is None:
        assert -2.0 < lo and hi < 2.0
    else:
        assert lo < 0.5, verdict.total_effect_ci  # not confirmed: its interval reaches zero
        assert any(n.startswith("retracted: the change that seemed to reproduce after")
                   for n in verdict.notes)
        assert "Retracted:" in verdict.message


@pytest.mark.parametrize("seed", range(5))
def test_a_reversed_change_is_reported_only_after_enough_restarts(seed: int):
    strategy = BisectStrategy(50)
    obs = _run_endpoints(19.0, 15.0, 0.02, seed, strategy)
    verdict = strategy.verdict(obs)
    assert verdict.done and verdict.status == "reversed"
    per_endpoint = min(sum(o.point == 0 for o in obs), sum(o.point == 49 for o in obs))
    assert per_endpoint >= BisectSettings().reversed_min_per_endpoint


def _scripted(strategy: BisectStrategy, levels: dict[int, list[float]], level: float,
              cv: float, seed: int, until) -> list[Observation]:
    """Restarts whose base level is scripted per point (the next entry of `levels[point]`, then
    `level` once a point's script is spent; the bad endpoint's default is `level` too)."""
    rng = np.random.default_rng(seed)
    obs: list[Observation] = []
    while not until(strategy) and len(obs) < 200:
        p = strategy.propose(obs, [], 1)[0].point
        script = levels.get(p, [])
        base = script.pop(0) if script else level if p < strategy.n - 1 else levels["bad"][0]
        obs.append(Observation(p, base * math.exp(cv * rng.standard_normal()), trial_id=len(obs)))
        strategy.verdict(obs)
    return obs


@pytest.mark.parametrize("seed", range(6))
def test_a_good_endpoint_mostly_in_the_bad_state_is_not_read_as_a_reversal(seed: int):
    """The rare draw a CI run met: one restart in eight lands 3x slow, and four of the good
    endpoint's first five did. Its one normal restart is then the odd one out, and a +49%
    regression read as a -49% reversal, which ends the run. The reversal now waits until the
    endpoint's kept restarts clearly outnumber the left-out ones that would undo it: the good
    endpoint's next (normal) restarts turn its level back and the change reproduces."""
    strategy = BisectStrategy(50)
    good = [57.0, 56.6, 18.8, 57.2, 56.9]
    _scripted(strategy, {0: good, "bad": [28.0]}, 18.8, 0.01, seed,
              lambda s: s.reproduction is not None or s.outcome is not None)
    assert strategy.outcome is None and strategy.reproduction is not None


@pytest.mark.parametrize("seed", range(4))
def test_a_real_reversal_with_a_bad_restart_at_an_endpoint_is_still_named(seed: int):
    """A range that really got faster (19 -> 15 ms), one of the bad endpoint's restarts in the
    3x state: still "reversed", after a few more restarts of that endpoint."""
    strategy = BisectStrategy(50)
    bad = strategy.n - 1
    obs = _scripted(strategy, {bad: [15.0, 45.0], "bad": [15.0]}, 19.0, 0.02, seed,
                    lambda s: s.outcome is not None)
    assert strategy.outcome == "reversed"
    assert sum(o.point == bad for o in obs) <= 12


def test_a_real_subtle_change_is_not_given_up_at_24_restarts_per_endpoint():
    """Case 160 of the subtle regime: +5% in 5% noise, but the good endpoint's first restarts
    read high; its 90% interval still spans zero at 24 restarts a side."""
    oracle = VirtualOracle(_regime("subtle"), 160)
    verdict, trials, _ = drive(BisectStrategy(N_COMMITS, max_trials=1500), oracle, 1)
    assert verdict.status == "found" and verdict.top is not None
    assert verdict.top.point == oracle.culprit and verdict.top.probability >= 0.99
    assert sum(1 for p in oracle.visits if p in (0, N_COMMITS - 1)) == 2
    assert min(oracle.visits[0], oracle.visits[N_COMMITS - 1]) > 24


def test_seed_verify_cases_are_found_with_the_stated_confidence():
    regime = _regime("seed_verify")
    for case in range(20):
        oracle = VirtualOracle(regime, case)
        verdict, trials, _ = drive(BisectStrategy(N_COMMITS, max_trials=400), oracle, 1)
        assert verdict.status == "found" and verdict.top.point == oracle.culprit, case
        assert verdict.top.probability >= 0.99
        assert trials <= 40, (case, trials)
        # A posterior is never 1: a near-certain one reads ">0.999", never a rounded "1.000".
        assert "1.000" not in verdict.message
        if verdict.top.probability > 0.999:
            assert "with probability >0.999" in verdict.message


def _lucky_start(seed: int, min_effect_pct: float | None = None
                 ) -> tuple[BisectStrategy, list[Observation]]:
    """A 50-commit range with no change whose bad endpoint's first two restarts read 4% high by
    luck; every other restart reads one level in 2% noise. Run to the end (600 at most)."""
    rng = np.random.default_rng(seed)
    lucky = {0: [19.85, 19.95], 49: [20.75, 20.85]}
    strategy = BisectStrategy(50, min_effect_pct=min_effect_pct)
    obs: list[Observation] = []
    while len(obs) < 600:
        proposals = strategy.propose(obs, [], 1)
        if not proposals:
            break
        point = proposals[0].point
        value = (lucky[point].pop(0) if lucky.get(point)
                 else 19.9 * math.exp(0.02 * rng.standard_normal()))
        obs.append(Observation(point, value, trial_id=len(obs)))
    return strategy, obs


@pytest.mark.parametrize("seed", range(6))
def test_a_lucky_reproduction_is_refuted_by_the_endpoints_later_trials(seed: int):
    """The +-1% refutation would need about 90 restarts per endpoint at 2% noise; the
    sequential test on the endpoints' trials since the reproduction ends a lucky start sooner."""
    strategy, obs = _lucky_start(seed)
    assert strategy.reproduction is not None and strategy.reproduction.counts == (2, 2)
    verdict = strategy.verdict(obs)
    assert verdict.status == "not_reproducible" and not verdict.culprits
    if "trials since then measure them alike" in strategy.note:
        assert fresh_endpoint_ratio(strategy) >= -math.log(0.01)
    else:  # or it stopped: ruling out the small change left would cost far more than allowed
        assert "not confirmed beyond the luck of repeated looks" in strategy.note
    assert len(obs) < 250
    # The run had said "the change reproduces"; its verdict takes that back in plain words.
    assert "Retracted: the change that seemed to reproduce after 4 trials (+4." in verdict.message


def test_the_benchmark_reports_every_method_and_how_runs_ended():
    """The benchmark's own plumbing on two cases: the JSON shape the README promises, and a
    no-change regime where the right answer is "not reproducible"."""
    report = run_benchmark(2, workers=1, regimes=["seed_verify", "no_change"])
    assert set(report) == {"seed_verify", "no_change"}
    assert set(report["seed_verify"]) == {
        "sleuth", "sleuth_ref", "sleuth_k4", "bisect", "bayesect", "oracle", "oracle_placed",
        "sleuth_prior"}
    assert set(report["no_change"]) == {"sleuth", "sleuth_ref", "bisect"}
    for methods in report.values():
        for row in methods.values():
            assert {"accuracy", "mean_trials", "p90_trials", "mean_rounds"} <= set(row)
            assert sum(row["statuses"].values()) == row["cases"] == 2
    sleuth = report["no_change"]["sleuth"]
    assert sleuth["accuracy"] == sleuth["statuses"].get("not_reproducible", 0) / 2
    # Classic bisect always blames a commit, so it is never right without a change.
    assert report["no_change"]["bisect"]["accuracy"] == 0.0


def test_the_oracle_placed_reference_keeps_sleuths_phases_and_searches_at_the_known_median():
    """The reference that splits sleuth's gap to the oracle: sleuth's own reproduce, stopping and
    verify, with every search point at the known-levels posterior median."""
    from experiments.bench_localize import _oracle_placed
    from experiments.reference_oracle import KnownLevelsOracle

    regime = _regime("decode_like")
    oracle = VirtualOracle(regime, 7)
    strategy = _oracle_placed(regime)
    placer = KnownLevelsOracle(N_COMMITS, 19.0, 19.0 * (1 + regime.effect), regime.cv)
    obs: list[Observation] = []
    phases = []
    while len(obs) < 400:
        proposals = strategy.propose(obs, [], 1)
        if not proposals:
            break
        proposal = proposals[0]
        if proposal.phase == "search" and "known-levels" in proposal.reason:
            post = placer.posterior(obs)
            if post.max() < 0.99:  # before the oracle is sure, it measures its median
                assert proposal.point == int(np.argmin(np.abs(np.cumsum(post) - 0.5)))
        phases.append(proposal.phase)
        obs.append(Observation(proposal.point, oracle.measure(proposal.point), trial_id=len(obs)))
    verdict = strategy.verdict(obs)
    assert verdict.status == "found" and verdict.top.point == oracle.culprit
    assert verdict.top.probability >= 0.99
    assert phases[0] == "reproduce" and "search" in phases and "verify" in phases


def test_posteriors_that_learn_the_levels_need_more_of_the_same_trials():
    """experiments/level_cost reads one oracle-placed trial sequence with five posteriors: each
    stops on its own, the told-everything one first, and the learned ones pay for the levels."""
    from experiments.level_cost import VARIANTS, run_case

    regime = _regime("decode_like")
    results = [run_case(regime, case) for case in range(6)]
    for result in results:
        assert set(result) == set(VARIANTS)
        assert all(trials < 400 for trials, _ in result.values())
        assert result["known"][0] <= result["sleuth"][0]
    assert all(result["known"][1] for result in results)
    mean = {name: np.mean([r[name][0] for r in results]) for name in VARIANTS}
    assert mean["known"] < mean["noise_told"] <= mean["learned"]


@pytest.mark.parametrize("n", seed_counts(400, few=40))
def test_endpoints_that_measure_alike_are_rarely_called_reversed(n):
    """The reversal check is repeated after every trial while a range reproduces; its level
    shrinks with each look so that over all of them a no-change range ends "reversed" at most
    1% of the time. A fixed 99% interval did so in 18 of these 400 seeded ranges."""
    outcomes = Counter()
    for seed in range(n):
        strategy = BisectStrategy(50)
        rng = np.random.default_rng((99, seed))
        obs: list[Observation] = []
        while strategy.reproduction is None and strategy.outcome is None:
            point = strategy.propose(obs, [], 1)[0].point
            obs.append(Observation(point, 19.0 * math.exp(0.05 * rng.standard_normal()),
                                   trial_id=len(obs)))
            strategy.verdict(obs)
        outcomes[strategy.outcome or "reproduced"] += 1
    assert outcomes["reversed"] <= max(1, n // 100), outcomes
    assert outcomes["not_reproducible"] > n // 2, outcomes


def test_a_stated_minimum_effect_refutes_a_lucky_reproduction_sooner():
    """With min_effect_pct=5 the user says a change under 5% does not matter: the lucky +4.5%
    start, under that floor, is never taken as a reproduction, and the endpoints' trials rule
    the range out against 5% (not against half of the lucky change): the run ends sooner,
    with the same answer."""
    plain, plain_obs = _lucky_start(3, None)
    assert plain.reproduction is not None  # the lucky start reproduced, then was refuted
    assert plain.verdict(plain_obs).status == "not_reproducible"
    stated, stated_obs = _lucky_start(3, 5.0)
    assert stated.reproduction is None  # under the stated floor: not a reproduction
    assert stated.verdict(stated_obs).status == "not_reproducible"
    assert len(stated_obs) < len(plain_obs), (len(stated_obs), len(plain_obs))


def test_a_long_not_reproducible_run_points_to_min_effect_pct():
    """A no-change range can take the whole reproduce budget (96 restarts) to rule out every
    change above 1%; the bisect command then says how a stated minimum ends such a run early."""
    from orchestrator.commands.bisect_notes import min_effect_hint
    from orchestrator.config.params import ExperimentParams

    regime = _regime("no_change")
    case = 0
    verdict, trials, _ = drive(BisectStrategy(N_COMMITS, max_trials=400),
                               VirtualOracle(regime, case), 1)
    assert verdict.status == "not_reproducible" and trials >= 20
    hint = min_effect_hint(verdict, ExperimentParams())
    assert hint is not None and f"took {trials} restarts" in hint
    assert "experiment.params.min_effect_pct=P" in hint
    assert min_effect_hint(verdict, ExperimentParams(min_effect_pct=10.0)) is None
    # Stated, the same range ends after a few restarts, and no hint is due.
    short, few, _ = drive(BisectStrategy(N_COMMITS, max_trials=400, min_effect_pct=20.0),
                          VirtualOracle(regime, case), 1)
    assert short.status == "not_reproducible" and few < 20
    assert min_effect_hint(short, ExperimentParams()) is None


def test_a_quiet_line_does_not_chase_remainders_within_the_min_effect():
    """On a quiet node (0.1% noise) a part reading +0.1% [-0.1%, +0.2%] has p under the
    suggestive level as often as a noisy part does; it cannot hold a change the answer would
    not call explained (within the run's min effect), so
    no anchor is measured for it. Ten releases with one 3x step: the endpoints, the search and
    the head-to-head, never an anchor of an unexplained part."""
    anchors = 0
    for seed in range(20):
        rng = np.random.default_rng((7, seed))
        strategy = BisectStrategy(10, confidence=0.99)
        obs: list[Observation] = []
        while proposals := strategy.propose(obs, [], 1):
            point = proposals[0].point
            anchors += "unexplained" in proposals[0].reason
            value = 20.0 * (3.0 if point >= 6 else 1.0) * math.exp(0.001 * rng.standard_normal())
            obs.append(Observation(point, value, trial_id=len(obs)))
        verdict = strategy.verdict(obs)
        assert verdict.status == "found" and [c.point for c in verdict.culprits] == [6]
    assert anchors == 0


def test_a_free_node_measures_the_search_point_ahead_of_the_reproduction():
    """Two nodes whose trials end one by one: when the good endpoint's second restart ends
    while the bad one's still runs, the free node starts the search's first point (the
    median), not a third good-endpoint restart that a x3 change never needed; once both
    endpoints hold their minimum the endpoints alternate again."""
    strategy = BisectStrategy(10, confidence=0.99)
    obs: list[Observation] = []

    def finish(point: int, value: float) -> None:
        obs.append(Observation(point, value, trial_id=len(obs)))

    assert [p.point for p in strategy.propose(obs, [], 2)] == [0, 9]
    finish(0, 20.0)
    assert [p.point for p in strategy.propose(obs, [9], 1)] == [0]
    finish(9, 60.0)
    assert [p.point for p in strategy.propose(obs, [0], 1)] == [9]
    finish(0, 20.1)
    ahead = strategy.propose(obs, [9], 1)
    assert [p.point for p in ahead] == [5] and "ahead of the reproduction" in ahead[0].reason
    # Nothing reproduced yet and the median already in flight: the endpoints again.
    assert [p.point for p in strategy.propose(obs, [9, 5], 1)] == [0]


def test_a_free_node_waits_for_the_head_to_head_in_flight():
    """Two nodes, a clear x3 step: once the culprit and its parent each have their fresh
    restart measured or running, the free node waits for them instead of starting a side's
    next restart (which the stress test makes unneeded for a step this clear); nor does the
    search spend it on a point whose side of the step is already certain."""
    strategy = BisectStrategy(10, confidence=0.99)
    obs: list[Observation] = []
    rng = np.random.default_rng(3)
    while True:
        proposal = strategy.propose(obs, [], 1)[0]
        if proposal.phase == "verify":
            break
        value = 20.0 * (3.0 if proposal.point >= 6 else 1.0) * math.exp(0.01 * rng.normal())
        obs.append(Observation(proposal.point, value, trial_id=len(obs)))
    parent = proposal.point
    obs.append(Observation(parent, 20.0, trial_id=len(obs)))
    culprit = strategy.propose(obs, [], 1)[0]
    assert (culprit.phase, culprit.point) == ("verify", 6)
    assert strategy.propose(obs, [6], 1) == []
    obs.append(Observation(6, 60.0, trial_id=len(obs)))
    assert strategy.verdict(obs).status == "found"


def test_a_range_under_half_the_chased_change_is_ruled_out_and_says_so():
    """Told the good level (a reference's or `was=`) 40% under both endpoints, a flat range
    is ruled out as soon as its change is confidently under half of that, and the decision
    is kept as made; a stated min effect is not a change being chased."""
    from orchestrator.strategies.bisect.verdict import chased_change_pct, chased_ruled_out

    def run(**kwargs) -> BisectStrategy:
        strategy = BisectStrategy(20, confidence=0.99, **kwargs)
        rng = np.random.default_rng(11)
        obs: list[Observation] = []
        while proposals := strategy.propose(obs, [], 1):
            obs.append(Observation(proposals[0].point, 19.0 * math.exp(0.02 * rng.normal()),
                                   trial_id=len(obs)))
        assert strategy.verdict(obs).status == "not_reproducible"
        return strategy

    chased = run(reference_value=19.0 / 1.4)
    assert chased_ruled_out(chased) and 30 < chased_change_pct(chased) < 50
    assert "this range holds less than half of it" in chased.verdict(chased._consumed).message
    stated = run(min_effect_pct=20.0)
    assert not chased_ruled_out(stated) and chased_change_pct(stated) is None
