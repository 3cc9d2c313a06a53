"""Two noise levels, what trials cost, and the repetitions chosen from both (pure parts)."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

from orchestrator.control.repetitions import RepetitionDesign, RepetitionSettings, components_of
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.run.cost import cost_model, describe_cost, gpus_of, time_scale_of, trial_cost
from orchestrator.stats.repetition_plan import CostModel, efficiency, plan_repetitions
from orchestrator.stats.variance import variance_components
from orchestrator.store import RunStore
from orchestrator.strategies.base import Observation
from orchestrator.strategies.bisect.evidence import Evidence
from orchestrator.strategies.bisect.levels import fit_levels


def _data(rng: random.Random, sd_r: float, sd_e: float, commits: int, restarts: int,
          reps) -> list[list[list[float]]]:
    out = []
    for c in range(commits):
        level = 0.1 * c
        out.append([[level + r + rng.gauss(0, sd_e) for _ in range(reps(rng))]
                    for r in (rng.gauss(0, sd_r) for _ in range(restarts))])
    return out


@pytest.mark.parametrize("sd_r,sd_e", [(0.02, 0.005), (0.005, 0.03), (0.01, 0.01)])
def test_components_recover_known_levels_and_cover(sd_r, sd_e):
    rng = random.Random(7)
    hits_r = hits_e = 0
    est_r, est_e = [], []
    runs = 300
    for _ in range(runs):
        comp = variance_components(_data(rng, sd_r, sd_e, 3, 6, lambda g: g.choice((2, 3, 5))))
        est_r.append(comp.restart.raw)
        est_e.append(comp.repetition.var)
        hits_r += comp.restart.lo <= sd_r**2 <= comp.restart.hi
        hits_e += comp.repetition.lo <= sd_e**2 <= comp.repetition.hi
    # Unbiased by moments (before the restart estimate is clamped at zero).
    assert np.mean(est_e) == pytest.approx(sd_e**2, rel=0.05)
    assert np.mean(est_r) == pytest.approx(sd_r**2, abs=0.2 * sd_r**2 + 0.03 * sd_e**2)
    # 90% intervals: the repetition one is exact, the restart one approximate.
    assert 0.86 <= hits_e / runs <= 0.94
    assert 0.84 <= hits_r / runs <= 0.99


def test_components_need_within_restart_replication():
    assert variance_components([[[1.0], [1.1]]]) is None
    comp = variance_components([[[1.0, 1.01]]])
    assert comp is not None and comp.restart.df == 0 and math.isinf(comp.restart.hi)


def test_planner_follows_the_dominant_level_and_says_why():
    rng = random.Random(3)
    cost = CostModel(restart_s=480.0, repetition_s=30.0, gpus=8)
    reps_dominate = variance_components(_data(rng, 0.003, 0.03, 4, 8, lambda g: 3))
    plan = plan_repetitions(reps_dominate, cost, current=3)
    assert plan.changed and plan.repetitions >= 10
    assert plan.reason.startswith(f"3 -> {plan.repetitions} repetitions per restart: "
                                  "a repetition scatters")
    assert "a restart costs 16x a repetition" in plan.reason
    restarts_dominate = variance_components(_data(rng, 0.03, 0.003, 4, 8, lambda g: 3))
    plan = plan_repetitions(restarts_dominate, cost, current=3)
    assert plan.repetitions == 1 and "a restart scatters" in plan.reason


def test_planner_keeps_the_count_until_measured():
    cost = CostModel(480.0, 30.0, 8)
    assert not plan_repetitions(None, cost, 3).changed
    few = variance_components([[[0.0, 0.1, 0.2], [0.05, 0.0, 0.1]]])
    assert plan_repetitions(few, cost, 3).repetitions == 3
    assert plan_repetitions(few, None, 3).reason.startswith("the cost")


def test_efficiency_optimum_is_sqrt_rho_k():
    rho, k = 16.0, 16.0
    best = max(range(1, 100), key=lambda n: efficiency(n, rho, k))
    assert best == 16  # sqrt(16 * 16)


def test_trial_cost_split_and_store_round_trip(tmp_path):
    store = RunStore.create(tmp_path / "run.db", run_id="r", command="bisect", config_yaml="")
    cand = Candidate.make("abc")
    tid = store.begin_trial(store.candidate_id(cand), node="n0", phase="search")
    states = (("preparing", 100.0), ("launching", 101.0), ("waiting_ready", 101.5),
              ("warming_up", 131.0), ("benchmarking", 136.0), ("tearing_down", 142.0),
              ("done", 143.0))
    result = TrialResult(Outcome.OK, measurements=(Measurement(0, {"m": 1.0}, 2.0),
                                                   Measurement(1, {"m": 1.1}, 4.0)),
                         states=states, started_at=100.0, ended_at=143.0, node="n0",
                         fingerprint={"gpu": {"gpus": [{"index": i} for i in range(8)]}})
    store.finish_trial(tid, result)
    row = store.trial(tid)
    assert [m.seconds for m in row.result.measurements] == [2.0, 4.0]
    cost = trial_cost(row.result, {"name": "sglang"})
    assert cost.launch_to_ready == 30.0 and cost.warmup == 5.0
    assert cost.repetitions == (2.0, 4.0) and cost.restart == 37.0 and cost.gpus == 8
    assert cost.gpu_minutes == pytest.approx(43.0 * 8 / 60)
    model = cost_model([row], {"name": "sglang"})
    assert model == CostModel(37.0, 3.0, 8)
    # Against the simulator wall time is scaled: the cost is stated in modeled time.
    assert time_scale_of({"name": "sim", "time_scale": 0.05}) == 0.05
    assert trial_cost(row.result, {"name": "sim", "time_scale": 0.5}).total == 86.0
    assert gpus_of(TrialResult(Outcome.OK), {"tp_size": 4}) == 4
    comp = components_of([row, row], "m")  # the same candidate twice: restarts agree exactly
    assert comp.restarts == 2 and comp.repetition.df == 2
    store.close()


def test_progress_states_the_measured_cost_the_closing_line_states(tmp_path):
    """The progress shows the stored trials' measured GPU time (the figure the run's closing
    `cost:` line gives), not a model's estimate; the simulator's is called modeled."""
    store = RunStore.create(tmp_path / "run.db", run_id="r", command="bisect", config_yaml="")
    cand = store.candidate_id(Candidate.make("abc"))
    for start in (100.0, 200.0):
        tid = store.begin_trial(cand, node="n0", phase="search")
        store.finish_trial(tid, TrialResult(
            Outcome.OK, measurements=(Measurement(0, {"m": 1.0}, 2.0),
                                      Measurement(1, {"m": 1.1}, 4.0)),
            states=(("launching", start), ("done", start + 43.0)), started_at=start,
            ended_at=start + 43.0, node="n0",
            fingerprint={"gpu": {"gpus": [{"index": i} for i in range(8)]}}))
    rows = store.trials()
    store.close()
    real = RepetitionDesign(RepetitionSettings(adaptive=False), {"name": "sglang"}, "m")
    real.update(rows)
    assert real.spent == pytest.approx(2 * 43.0 * 8 / 60)
    assert real.spent_line() == "11.5 GPU-min spent, 3 repetitions per restart"
    assert real.line(rows) == "2 restarts, 11.5 GPU-min"
    real.tally(rows[:1])  # after each result, not only when repetitions are chosen
    assert real.spent_line() == "5.7 GPU-min spent, 3 repetitions per restart"
    sim = RepetitionDesign(RepetitionSettings(adaptive=False), {"name": "sim", "time_scale": 1},
                           "m")
    sim.update(rows)
    assert sim.spent_line().startswith("11.5 modeled GPU-min spent")
    assert sim.line(rows) == "2 restarts, 11.5 modeled GPU-min"
    assert describe_cost(1410.0, modeled=True) == "23.5 modeled GPU-h"
    assert describe_cost(1410.0) == "23.5 GPU-h"


def _observations(rng: random.Random, reps_of, n: int = 40) -> list[Observation]:
    out = []
    for i in range(n):
        point = i % 2
        reps = reps_of(i)
        level = math.log(100.0) + (0.1 if point else 0.0) + rng.gauss(0, 0.01)
        vals = [math.exp(level + rng.gauss(0, 0.04)) for _ in range(reps)]
        logs = [math.log(v) for v in vals]
        spread = float(np.var(logs, ddof=1)) if reps > 1 else None
        out.append(Observation(point, float(np.mean(vals)), trial_id=i, repetitions=reps,
                               spread=spread))
    return out


def test_equal_repetitions_keep_the_plain_model_exactly():
    rng = random.Random(1)
    ev = Evidence(2, 1.0)
    for o in _observations(rng, lambda i: 3):
        ev.add(o)
    assert ev.kept_weights() is None
    plain = Evidence(2, 1.0)
    for o in _observations(random.Random(1), lambda i: 3):
        plain.add(Observation(o.point, o.value, trial_id=o.trial_id))
    assert ev.compare(0, 1, 0.9) == plain.compare(0, 1, 0.9)


def test_trials_of_more_repetitions_weigh_more():
    rng = random.Random(2)
    ev = Evidence(2, 1.0)
    for o in _observations(rng, lambda i: 1 if i < 20 else 12):
        ev.add(o)
    w = ev.kept_weights()
    assert w is not None and (w == 1.0).sum() >= 18 and (w < 0.5).sum() >= 18
    # The weighted fit's level is the precision-weighted mean of each point's trials.
    points, values, blocks, epochs = ev.kept()
    fit = fit_levels(points, values, blocks, epochs, weights=w)
    at = points == 1
    expected = float((w[at] * values[at]).sum() / w[at].sum())
    assert fit.beta[fit.index(1)] == pytest.approx(expected, abs=1e-9)
