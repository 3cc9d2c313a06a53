"""The noise prior from a node's earlier runs, and precision weights in the epoch check."""

from __future__ import annotations

import math
import random

import pytest
from omegaconf import OmegaConf

from orchestrator.config.schema import BenchConf
from orchestrator.control.repetitions import RepetitionDesign, RepetitionSettings
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.run.cost import PRIOR_TRIALS, TrialCost, cost_model
from orchestrator.run.noise_prior import (
    PRIOR_BETWEEN_DF,
    PRIOR_WITHIN_DF,
    NoisePrior,
    host_of,
    load_noise_prior,
)
from orchestrator.stats.effect import log_difference, weighted_log_difference
from orchestrator.stats.variance import noise_stats, variance_components
from orchestrator.store import RunStore
from orchestrator.strategies.base import Observation
from orchestrator.strategies.bisect.evidence import Evidence

TARGET = {"name": "sglang", "model_path": "m", "tp_size": 8}
BENCH = {"repetitions": 3, "requests": 4}


def _data(rng: random.Random, sd_r: float, sd_e: float, commits: int, restarts: int,
          reps: int) -> list[list[list[float]]]:
    return [[[0.1 * c + r + rng.gauss(0, sd_e) for _ in range(reps)]
             for r in (rng.gauss(0, sd_r) for _ in range(restarts))] for c in range(commits)]


def test_stats_add_like_pooled_data():
    rng = random.Random(3)
    a, b = _data(rng, 0.01, 0.04, 3, 4, 3), _data(rng, 0.01, 0.04, 2, 5, 6)
    both = noise_stats(a + b)
    added = noise_stats(a) + noise_stats(b)
    for field in ("ss_within", "df_within", "ss_between", "df_between", "inv_n"):
        assert getattr(added, field) == pytest.approx(getattr(both, field))
    pooled, joint = variance_components(a, prior=noise_stats(b)), variance_components(a + b)
    for part in ("repetition", "restart"):
        mine, theirs = getattr(pooled, part), getattr(joint, part)
        assert (mine.var, mine.lo, mine.hi, mine.df) == pytest.approx(
            (theirs.var, theirs.lo, theirs.hi, theirs.df))


def test_discounted_prior_keeps_its_estimates_and_caps_its_weight():
    rng = random.Random(4)
    stats = noise_stats(_data(rng, 0.02, 0.05, 4, 10, 5))
    small = stats.discounted(PRIOR_WITHIN_DF, PRIOR_BETWEEN_DF)
    assert small.df_within == pytest.approx(PRIOR_WITHIN_DF)
    assert small.df_between == pytest.approx(PRIOR_BETWEEN_DF)
    full = variance_components([], prior=stats)
    cut = variance_components([], prior=small)
    assert cut.repetition.var == pytest.approx(full.repetition.var)
    assert cut.restart.raw == pytest.approx(full.restart.raw)
    # Fewer degrees of freedom: wider intervals, the run's own data can move it.
    assert cut.repetition.hi - cut.repetition.lo > full.repetition.hi - full.repetition.lo
    # A prior already under the caps is unchanged.
    tiny = noise_stats(_data(rng, 0.02, 0.05, 1, 2, 3))
    assert tiny.discounted(PRIOR_WITHIN_DF, PRIOR_BETWEEN_DF) == tiny


def _cost(restart: float = 480.0, rep: float = 30.0) -> TrialCost:
    return TrialCost(restart + 3 * rep, 400.0, 60.0, (rep, rep, rep), 8)


def test_a_prior_chooses_from_the_first_restart_and_the_run_updates_it():
    rng = random.Random(5)
    earlier = noise_stats(_data(rng, 0.001, 0.10, 4, 6, 5))  # repetitions dominate
    prior = NoisePrior(earlier.discounted(PRIOR_WITHIN_DF, PRIOR_BETWEEN_DF),
                       tuple(_cost() for _ in range(4)), ("earlier",))
    with_prior = RepetitionDesign(RepetitionSettings(), TARGET, "m", prior=prior)
    assert with_prior.update([]) > 3  # before any trial of its own
    assert with_prior.changes and "repetitions per restart" in with_prior.changes[0]
    assert with_prior.summary([])["prior_runs"] == ["earlier"]
    assert RepetitionSettings.from_conf(BenchConf(noise_prior=False)).prior is False
    without = RepetitionDesign(RepetitionSettings(), TARGET, "m")
    assert without.update([]) == 3 and not without.changes
    # Costs: the earlier runs' decide first; at most PRIOR_TRIALS of them weigh.
    assert cost_model([], TARGET, [_cost(600.0)] * 20).restart_s == 600.0
    assert cost_model([], TARGET, [_cost(600.0)] * 20 + [_cost(60.0)] * PRIOR_TRIALS
                      ).restart_s == 60.0


def _run(root, name: str, *, target=TARGET, bench=BENCH, metric: str = "m",
         node: str = "box-1a2b3c4d", levels=((0, 1.0), (0, 1.02), (1, 1.5), (1, 1.45)),
         sd: float = 0.05, seed: int = 0):
    run_dir = root / name
    run_dir.mkdir()
    conf = {"metric": metric, "target": dict(target), "bench": dict(bench), "run_id": name}
    (run_dir / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(conf)))
    store = RunStore.create(run_dir / "trials.db", run_id=name, command="bisect",
                            config_yaml="")
    rng = random.Random(seed)
    for i, (commit, level) in enumerate(levels):
        tid = store.begin_trial(store.candidate_id(Candidate.make(f"c{commit}")), node=node,
                                phase="search")
        t0 = 1000.0 * (i + 1)
        meas = tuple(Measurement(j, {metric: level * math.exp(rng.gauss(0, sd))}, 30.0)
                     for j in range(4))
        states = (("launching", t0), ("warming_up", t0 + 400.0), ("benchmarking", t0 + 460.0),
                  ("done", t0 + 600.0))
        store.finish_trial(tid, TrialResult(Outcome.OK, measurements=meas, states=states,
                                            started_at=t0, ended_at=t0 + 600.0, node=node))
    store.close()
    return run_dir


def test_load_prior_takes_like_runs_on_this_host_only(tmp_path):
    _run(tmp_path, "same", seed=1)
    _run(tmp_path, "same-other-repetitions", bench={**BENCH, "repetitions": 9}, seed=2)
    _run(tmp_path, "other-model", target={**TARGET, "model_path": "other"})
    _run(tmp_path, "other-workload", bench={**BENCH, "requests": 64})
    _run(tmp_path, "other-metric", metric="x")
    _run(tmp_path, "other-host", node="elsewhere-99999999")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(
        {"metric": "m", "target": TARGET, "bench": BENCH})))
    (broken / "trials.db").write_bytes(b"not a database")
    current = _run(tmp_path, "current", levels=())
    prior = load_noise_prior(current, nodes=["box-99887766"], metric="m")
    assert sorted(prior.runs) == ["same", "same-other-repetitions"]
    # 2 runs x 4 trials x 3 within df; 2 runs x 2 candidates x 1 between df: under the caps.
    assert prior.stats.df_within == pytest.approx(24.0)
    assert prior.stats.df_between == pytest.approx(4.0)
    assert len(prior.costs) == 8 and prior.costs[0].restart == pytest.approx(480.0)
    assert "2 earlier run(s)" in prior.describe() and "a restart 8.0 min" in prior.describe()
    assert load_noise_prior(current, nodes=["new-00000000"], metric="m").runs == ()
    assert "none" in load_noise_prior(tmp_path / "nowhere", nodes=[], metric="m").describe()
    assert host_of("gpu-box-3f2a9c1d") == "gpu-box"


def test_weighted_difference_is_the_plain_one_with_equal_weights():
    before, after = [0.0, 0.02, -0.01], [0.1, 0.12, 0.09, 0.11]
    plain = log_difference(before, after, 0.9, 0.004, 5)
    same = weighted_log_difference(before, after, [1.0] * 3, [1.0] * 4, 0.9, 0.004, 5)
    assert same.diff == pytest.approx(plain.diff) and same.lo == pytest.approx(plain.lo)
    assert same.se == pytest.approx(plain.se)
    with pytest.raises(ValueError):
        weighted_log_difference(before, after, [1.0, 1.0], [1.0] * 4)


def test_weighted_difference_covers_with_unequal_precision():
    rng = random.Random(8)
    hits = 0
    trials = 400
    for _ in range(trials):
        w_b = [1.0, 1.0, 0.25, 0.25]
        w_a = [0.25, 1.0, 0.25]
        before = [rng.gauss(0.0, 0.05 / math.sqrt(w)) for w in w_b]
        after = [rng.gauss(0.1, 0.05 / math.sqrt(w)) for w in w_a]
        d = weighted_log_difference(before, after, w_b, w_a, 0.9)
        hits += d.lo <= 0.1 <= d.hi
    assert 0.85 <= hits / trials <= 0.95


def test_epoch_difference_weighs_trials_of_more_repetitions():
    ev = Evidence(2, 1.0)
    rng = random.Random(9)
    for i in range(24):
        point, reps = i % 2, (1 if i < 12 else 10)
        level = (0.1 if point else 0.0) + rng.gauss(0, 0.005)
        logs = [level + rng.gauss(0, 0.05) for _ in range(reps)]
        spread = sum((v - sum(logs) / reps) ** 2 for v in logs) / (reps - 1) if reps > 1 else None
        ev.add(Observation(point, math.exp(sum(logs) / reps), trial_id=i, repetitions=reps,
                           spread=spread))
    weights = ev.kept_weights()
    assert weights is not None
    weighted = ev.epoch_difference(0, 1, ev.latest_epoch, 0.9)
    points, values, _, epochs = ev.kept()
    now = epochs == ev.latest_epoch
    plain = ev.pooled_difference(values[(points == 0) & now].tolist(),
                                 values[(points == 1) & now].tolist(), 0.9)
    assert weighted.diff != pytest.approx(plain.diff)
    assert weighted.hi - weighted.lo < plain.hi - plain.lo  # the precise trials count more
