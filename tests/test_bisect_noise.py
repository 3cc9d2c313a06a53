"""The bisect strategy on the noise real machines make (pure, no processes): outlier restarts,
drift and load steps, a system change mid-run, several culprits, steps both ways, a commit
graph, the no-change path. Each test drives the strategy through the same propose/verdict
loop the controller uses, on the localization benchmark's seeded cases."""

from __future__ import annotations

import math

import numpy as np
import pytest
from conftest import point_stats

from experiments.bench_localize import N_COMMITS, VirtualOracle, drive, judge, regime
from orchestrator.stats.effect import log_difference
from orchestrator.strategies import BisectStrategy, Observation
from orchestrator.strategies.bisect.history import History
from orchestrator.strategies.bisect.levels import fit_levels
from orchestrator.strategies.bisect.model import StageData, stage_posterior
from orchestrator.strategies.bisect.outliers import KEPT, OUTLIER, PENDING, flag_trials
from orchestrator.strategies.bisect.posterior import range_posterior


def _loop(strategy: BisectStrategy, measure, limit: int = 400) -> list[Observation]:
    """Drive a strategy one trial at a time; ``measure(point, trial_index)`` gives the
    observation's value and epoch."""
    obs: list[Observation] = []
    while len(obs) < limit:
        proposals = strategy.propose(obs, [], 1)
        if not proposals:
            break
        value, epoch = measure(proposals[0].point, len(obs))
        obs.append(Observation(proposals[0].point, value, trial_id=len(obs), epoch=epoch))
    return obs


def _run(name: str, case: int, k: int = 1):
    oracle = VirtualOracle(regime(name), case)
    strategy = BisectStrategy(N_COMMITS, max_trials=1500, parents=oracle.case.parents)
    verdict, trials, _ = drive(strategy, oracle, k)
    return strategy, verdict, oracle, trials


# ------------------------------------------------------------------------------- the model


def test_the_stage_model_is_the_single_change_point_posterior_on_clean_data():
    """One epoch, no drift, no culprit found yet: exactly the posterior the first benchmark
    validated, whether the chain is given as a chain or as a graph of single parents."""
    rng = np.random.default_rng(2)
    n, culprit = 40, 23
    points = np.concatenate([[0, 39] * 3, rng.integers(0, 40, 20)])
    values = rng.normal(0, 0.05, points.size) + 0.1 * (points >= culprit)
    stats = point_stats([list(values[points == p]) for p in range(n)])
    plain = range_posterior(0, n - 1, stats, np.zeros(n, bool), np.zeros(n), step_scale=3.0,
                            null_prior=0.1)
    data = StageData(points, values, np.zeros(points.size, int), np.zeros(points.size, int), (),
                     np.arange(1, n), np.zeros(n - 1), 0.1, 9.0, True)
    chain = stage_posterior(History(n), data)
    graph = stage_posterior(History(n, [()] + [(i - 1,) for i in range(1, n)]), data)
    np.testing.assert_allclose(chain.mass, plain.mass[1:], atol=1e-12)
    np.testing.assert_allclose(graph.mass, chain.mass, atol=1e-12)
    assert chain.null_mass == pytest.approx(plain.null_mass)


def test_a_drift_so_strong_that_no_drift_has_no_mass_left_is_not_a_crash():
    """Large block effects over many trials: the level fit's weight for ``r = 0`` underflows
    to exactly zero (the localization benchmark's drift regime reached it and the posterior
    raised on log(0)). A weightless hypothesis contributes nothing, so the posterior is the
    one over the remaining drift scales."""
    rng = np.random.default_rng(3)
    n, culprit = 600, 2
    points = rng.choice([0, 1, 2, 3], n)
    blocks, epochs = np.arange(n) // 6, np.zeros(n, int)
    values = (rng.normal(0, 0.005, n) + 0.08 * (points >= culprit)
              + rng.normal(0, 1.0, blocks.max() + 1)[blocks])
    fit = fit_levels(points, values, blocks, epochs)
    assert dict(fit.r_weights)[0.0] == 0.0 and fit.drift_weight > 0.5
    common = (points, values, blocks, epochs, (), np.arange(1, 4), np.zeros(3), 0.1, 9.0, True)
    post = stage_posterior(History(4), StageData(*common, r_weights=fit.r_weights))
    kept = tuple((r, w) for r, w in fit.r_weights if w > 0.0)
    same = stage_posterior(History(4), StageData(*common, r_weights=kept))
    np.testing.assert_allclose(post.mass, same.mass)
    assert post.best()[0] == culprit and math.isfinite(post.null_mass)


def test_the_level_fit_is_the_pooled_interval_without_drift_and_sees_a_load_step():
    rng = np.random.default_rng(1)
    points = rng.choice([0, 1, 2, 3], 60)
    values = rng.normal(0, 0.05, 60) + 0.08 * (points >= 2)
    blocks, epochs = np.arange(60) // 6, np.zeros(60, int)
    fit = fit_levels(points, values, blocks, epochs)
    pooled_ss = sum(((values[points == q] - values[points == q].mean()) ** 2).sum()
                    for q in (1, 2))
    plain = log_difference(values[points == 0], values[points == 3], 0.9, pooled_ss,
                           int(sum((points == q).sum() - 1 for q in (1, 2))))
    assert fit.r == 0.0 and fit.drift_weight < 0.5
    ours = fit.difference(0, 3, 0.9)
    assert ours.diff == pytest.approx(plain.diff) and ours.lo == pytest.approx(plain.lo)
    loaded = values.copy()
    loaded[10:40] += 0.10  # a neighbour's job for 30 trials: every point reads 10% slower
    fit = fit_levels(points, loaded, blocks, epochs)
    assert fit.drift_weight > 0.5
    between = fit.difference(0, 1, 0.9)  # two good commits still measure alike
    assert between.lo < 0.0 < between.hi


# -------------------------------------------------------------------------------- outliers


def test_a_restart_its_replicates_disagree_with_is_an_outlier_and_a_lone_far_reading_waits():
    rng = np.random.default_rng(0)
    points = np.array([0, 9, 0, 9, 0, 9, 0, 9, 4, 4, 4, 6])
    values = rng.normal(0, 0.05, points.size) + 0.08 * (points >= 5)
    values[2] += math.log(3.0)  # a 3x restart of the good endpoint
    values[10] += math.log(3.0)  # and of commit 4
    values[11] += math.log(3.0)  # commit 6, measured once: a bad restart or a new level?
    status, sigma = flag_trials(points, values)
    assert status[2] == OUTLIER and status[10] == OUTLIER and status[11] == PENDING
    assert (status[[0, 1, 3, 4, 5, 6, 7, 8, 9]] == KEPT).all()
    assert 0.02 < sigma < 0.1
    gaussian = np.random.default_rng(5)
    flagged = 0
    for _ in range(200):
        pts = np.concatenate([np.repeat([0, 255], 6), gaussian.integers(0, 256, 60)])
        status, _ = flag_trials(pts, gaussian.normal(0, 0.05, pts.size))
        flagged += int((status != KEPT).sum())
    assert flagged <= 2  # 14,400 clean restarts


def test_a_far_reading_is_measured_again_before_anything_else():
    strategy = BisectStrategy(64)
    obs = [Observation(p, v, trial_id=i) for i, (p, v) in enumerate(
        [(0, 19.0), (63, 21.0), (0, 19.2), (63, 20.8), (0, 18.9), (63, 21.1), (0, 19.1),
         (63, 20.9)])]
    point = strategy.propose(obs, [], 1)[0].point
    obs.append(Observation(point, 60.0, trial_id=len(obs)))  # 3x anything seen
    follow = strategy.propose(obs, [], 1)[0]
    assert follow.point == point and "surprising" in follow.reason
    assert [o.status for o in strategy.verdict(obs).outliers] == ["pending"]


@pytest.mark.parametrize("case", [0, 3, 5])
def test_outlier_restarts_are_flagged_and_the_culprit_named(case):
    strategy, verdict, oracle, trials = _run("outliers", case)
    assert verdict.status == "found" and verdict.top.point == oracle.culprit
    assert verdict.top.probability >= 0.99
    flagged = {o.trial_id for o in verdict.outliers}
    # Every planted 3x restart that the run measured is flagged (kept, not used).
    assert set(oracle.outlier_trials) <= flagged
    assert any("left out of the likelihood as outliers" in n for n in verdict.notes) == \
        bool(flagged)


# ------------------------------------------------------------------------ drift and epochs


@pytest.mark.parametrize("case", [1, 2, 8])
def test_a_load_step_does_not_create_a_culprit(case):
    strategy, verdict, oracle, _ = _run("drift", case)
    assert verdict.status == "found" and verdict.top.point == oracle.culprit, verdict.message
    assert verdict.top.effect_ci[0] > 0  # the head-to-head shows the step by itself


def test_a_system_change_mid_run_is_a_new_epoch_and_the_culprit_is_measured_again():
    """Every reading 15% slower from trial 8 on (a power limit lowered from outside): the
    levels are compared within each system, the culprit found on the old one is measured
    again on the new one, and the verdict says so."""
    rng = np.random.default_rng(4)
    n, culprit = 100, 61
    strategy = BisectStrategy(n)

    def measure(point: int, index: int) -> tuple[float, int]:
        epoch = int(index >= 8)
        level = 19.0 * (1.2 if point >= culprit else 1.0) * (1.15 if epoch else 1.0)
        return level * math.exp(0.03 * rng.standard_normal()), epoch

    obs = _loop(strategy, measure)
    verdict = strategy.verdict(obs)
    assert verdict.status == "found" and verdict.top.point == culprit
    top = verdict.top
    assert top.latest_effect_pct is not None and top.latest_effect_ci[0] > 5.0
    later = [o for o in obs if o.epoch == 1 and o.point in (culprit, *top.parents)]
    assert len(later) >= 4
    assert any("system changed during the run" in note for note in verdict.notes)
    assert "on the system as it is now" in verdict.message


# ------------------------------------------------------------------------ several culprits


def _telescopes(strategy, verdict) -> None:
    """The named steps and the remainders add up to the endpoints' change (log scale)."""
    total = strategy.evidence.compare(0, strategy.n - 1, 0.9).diff
    steps = sum(math.log1p(c.effect_pct / 100.0) * strategy.sign for c in verdict.culprits)
    rest = sum(math.log1p(u.effect_pct / 100.0) * strategy.sign for u in verdict.unexplained
               if u.kind == "remainder")
    assert steps + rest == pytest.approx(total, abs=1e-9)


@pytest.mark.parametrize("case", [0, 1, 5])
def test_two_culprits_are_both_named_and_the_rest_accounted_for(case):
    strategy, verdict, oracle, _ = _run("two_culprits", case)
    result = judge(verdict, oracle.case, "sleuth", 0, 0, 0)
    assert result.correct and {c.point for c in verdict.culprits} == set(oracle.case.culprits)
    assert verdict.message.startswith("Found 2 culprits")
    _telescopes(strategy, verdict)


def test_a_later_partial_fix_is_named_as_a_step_the_other_way():
    strategy, verdict, oracle, _ = _run("up_down", 0)
    up, down = oracle.case.culprits
    named = {c.point: c for c in verdict.culprits}
    assert set(named) == {up, down}, verdict.message
    assert named[up].effect_pct > 30 and named[down].effect_pct < -15
    assert "a step the other way" in verdict.message
    _telescopes(strategy, verdict)


@pytest.mark.parametrize("case", [8, 9])
def test_a_staircase_never_names_a_wrong_step_and_states_what_it_leaves(case):
    """Three +6% steps in 5% noise: each step it names is a true one, and each it does not
    name lies in a part of the range whose stated interval either shows it (unexplained) or
    does not rule it out. (How often its effect intervals hold the truth is the benchmark's.)"""
    strategy, verdict, oracle, _ = _run("staircase", case)
    result = judge(verdict, oracle.case, "sleuth", 0, 0, 0)
    assert verdict.status == "found" and not result.wrong_confident, verdict.message
    assert result.steps_named >= 1
    assert result.steps_named + result.steps_covered + result.steps_not_ruled_out == 3
    _telescopes(strategy, verdict)


@pytest.mark.parametrize("case", [13, 34])
def test_a_staircase_step_left_in_a_barely_measured_part_is_now_named_or_reported(case):
    """Seeded staircase cases that ended with a +6% step inside a part "not distinguishable
    from no change" whose anchors held 2-4 restarts (case 34 stopped after 31 trials with one
    of three steps). The whole unexplained change is now measured until its interval excludes
    zero or rules out a further step as large as the smallest one named.

    How the old settings failed on these seeds is history, not asserted: it rested on the
    exact floating-point path (another CPU's BLAS draws the same case differently), and a test
    must hold on any x86-64 machine. What is asserted holds whatever the path."""
    strategy, verdict, oracle, _ = _run("staircase", case)
    result = judge(verdict, oracle.case, "sleuth", 0, 0, 0)
    assert result.correct and not result.wrong_confident, verdict.message
    _telescopes(strategy, verdict)


@pytest.mark.parametrize(("name", "case"), [("decode_like", 0), ("decode_like", 3),
                                            ("seed_verify", 7)])
def test_a_run_ends_only_once_what_it_leaves_is_shown_or_bounded(name, case):
    """The end condition of the resolution rule: the whole unexplained change excludes zero,
    or its interval lies within a step as large as the one named, or its anchors are measured
    up to the cap."""
    from orchestrator.strategies.bisect.later import resolution
    from orchestrator.strategies.bisect.remainders import contrast_weights, unexplained_total

    strategy, verdict, oracle, _ = _run(name, case)
    assert verdict.status == "found"
    cfg = strategy.settings
    whole = unexplained_total(strategy, cfg.verify_confidence)
    res = resolution(strategy)
    assert whole is not None and res is not None
    anchors = contrast_weights(strategy, whole.lo, whole.hi)
    capped = min(strategy.evidence.count(p) for p in anchors) >= cfg.remainder_max_per_endpoint
    assert whole.flagged or (-res < whole.diff.lo and whole.diff.hi < res) or capped


def test_a_significant_whole_remainder_with_no_significant_part_is_said_unexplained():
    """The sentence for a "total" part: the size with its interval, and that it is not pinned
    to one sub-range, beside the parts that are each not distinguishable from no change."""
    from orchestrator.strategies.base import Culprit, Unexplained
    from orchestrator.strategies.bisect.verdict import _parts_sentence

    parts = [Unexplained(0, 99, 3.1, (-0.8, 7.2), False),
             Unexplained(100, 255, 3.4, (-0.6, 7.6), False),
             Unexplained(0, 255, 6.5, (1.1, 12.2), True, "total")]
    text = _parts_sentence(parts, [Culprit(point=100, probability=0.995)])
    assert text.startswith("Part of the change is unexplained: +6.5% [+1.1%, +12.2%] beyond the "
                           "named steps in all, between points 0 and 255")
    assert "Its parts are not distinguishable from no change at this precision (+3.1%" in text


# ------------------------------------------------------------------------- naming a culprit


@pytest.mark.parametrize(("name", "case"), [("subtle", 184), ("dag", 64), ("dag", 15),
                                           ("drift", 120)])
def test_a_lucky_head_to_head_does_not_name_a_wrong_commit(name, case):
    """Benchmark cases that named a wrong commit at P >= 0.99 after 14-27 trials when one fresh
    restart a side was enough (subtle-184 named point 53, dag-64 point 3), and two that the
    stress test at a 99% bound named wrong again (dag-15 the merge 240 for 135, drift-120 point
    220 for 183): the first restarts happened to read close together, the noise estimate was a
    fraction of the true 5%, and the posterior's first pass over 0.99 was luck. Naming now
    waits for three more fresh restarts a side after that pass, with the posterior still above
    the confidence, unless it holds with sigma at its upper 99.9% bound.

    That the old settings failed is not asserted: it rested on the exact floating-point path
    (on another CPU's BLAS the same seed drew another case), and a test must hold on any
    x86-64 machine."""
    strategy, verdict, oracle, _ = _run(name, case)
    result = judge(verdict, oracle.case, "sleuth", 0, 0, 0)
    assert not result.wrong_confident and result.correct, verdict.message


# ------------------------------------------------------------------------------ the graph


@pytest.mark.parametrize("case", [0, 2, 4])
def test_graph_bisection_names_the_culprit_and_verifies_it_against_its_parents(case):
    strategy, verdict, oracle, _ = _run("dag", case)
    assert verdict.status == "found" and verdict.top.point == oracle.culprit, verdict.message
    assert verdict.top.parents == oracle.case.parents[oracle.culprit]


# ------------------------------------------------------------------------------ no change


def test_a_run_that_would_cost_far_more_than_its_budget_stops_and_says_so():
    """+3% in 8% noise over 256 commits with a budget of 100: the forecast keeps saying far
    more than that, so the run stops early with its best guess instead of spending it all."""
    rng = np.random.default_rng(3)
    strategy = BisectStrategy(256, max_trials=100)
    obs = _loop(strategy, lambda point, _: (
        19.0 * (1.03 if point >= 140 else 1.0) * math.exp(0.08 * rng.standard_normal()), 0))
    verdict = strategy.verdict(obs)
    assert verdict.done and len(obs) <= 100
    if strategy.reproduction is not None and strategy.stopped_early:
        assert "far exceeds the budget of 100" in verdict.message + " ".join(verdict.notes)


def test_a_reference_level_sets_the_change_being_chased():
    """The reference run measured 19 ms; the bad endpoint measures 29 ms now and so does the
    good one: the range does not hold the +53% being chased, which is said after a few
    restarts instead of ruling out every change above 1%."""
    rng = np.random.default_rng(0)

    def run(reference: float | None) -> tuple[str, int]:
        strategy = BisectStrategy(100, reference_value=reference)
        obs = _loop(strategy, lambda *_: (29.0 * math.exp(0.05 * rng.standard_normal()), 0))
        return strategy.verdict(obs).status, len(obs)

    told, told_trials = run(19.0)
    assert told == "not_reproducible" and told_trials <= 12
    plain, plain_trials = run(None)
    assert plain == "not_reproducible" and plain_trials > told_trials


@pytest.mark.parametrize("seed", [1, 3])
def test_outlier_restarts_among_the_first_do_not_withdraw_a_real_change(seed):
    """+8% in 5% noise; the bad endpoint's first two restarts (among the first seven trials)
    read 3x, so the change reproduces at about +200%. Before, "no change" was then tested
    against half of that and the real change withdrawn as "not reproducible" (every one of 8
    seeds). The refutation now tests against the change with the flagged restarts left out."""
    rng = np.random.default_rng(seed)
    n, culprit, hits = 64, 30, [0]
    strategy = BisectStrategy(n, max_trials=600)

    def measure(point: int, index: int) -> tuple[float, int]:
        value = 10.0 * (1.08 if point >= culprit else 1.0) * math.exp(0.05 * rng.standard_normal())
        if index < 7 and point == n - 1 and hits[0] < 2:
            hits[0] += 1
            value *= 3.0
        return value, 0

    obs = _loop(strategy, measure, limit=600)
    verdict = strategy.verdict(obs)
    assert hits[0] == 2 and strategy.reproduction.diff > math.log(2.0)
    assert verdict.status == "found" and verdict.top.point == culprit


def test_few_differences_do_not_flag_an_ordinary_reading_but_still_flag_a_3x_restart():
    """Four restarts at each endpoint (six differences): the robust sigma of the readings of
    no_change_drift case 1 is 1.6% in 5% noise, and at a plain 4.5 sigma the endpoint's
    reading 9% below its others was flagged (the rest then "reproduced" +7%). Widened for
    the few differences it is kept; a 3x restart among the same readings is still flagged."""
    points = np.array([0, 255] * 4)
    values = np.log([18.13, 17.27, 18.52, 19.75, 18.54, 19.71, 18.02, 19.53])
    status, _ = flag_trials(points, values)
    assert (status == KEPT).all()
    values[3] = math.log(3.0 * 19.75)
    status, _ = flag_trials(points, values)
    assert status[3] == OUTLIER and (np.delete(status, 3) == KEPT).all()
