"""The sweep experiment without servers: budget, pruning, failures, confirmation, resume, grid.

Driven by the virtual oracle (the sim's own model plus restart noise), exactly as the command
drives it from the controller: `propose(k)` for k idle nodes, `record(work, value)` per result.
"""

from __future__ import annotations

import math
from collections import Counter, deque

import optuna
import pytest
from optuna.trial import TrialState

from orchestrator.records import Candidate
from orchestrator.sim_scenarios.sweep_oracle import SimOracle
from orchestrator.strategies.sweep.noise import prune_decision, restart_sd
from orchestrator.strategies.sweep.search import SweepSearch, SweepSettings, Work
from orchestrator.strategies.sweep.space import SearchSpace
from orchestrator.strategies.sweep.study import make_sampler, open_study

TARGET = {"name": "sim", "model_path": "m", "host": "127.0.0.1", "tp_size": 8,
          "speculative_algorithm": "EAGLE3", "speculative_draft_model_path": "d",
          "speculative_num_steps": 2, "speculative_eagle_topk": 1,
          "speculative_num_draft_tokens": 3, "cuda_graph_max_bs": None,
          "disable_cuda_graph": False, "time_scale": 0.05, "noise_restart_cv": 0.02,
          "noise_request_cv": 0.01, "load_seconds": 20.0, "seed": None, "fault": None,
          "gpu_state": "", "extra_args": [], "launcher": [], "env": {}}
BENCH = {"input_len": 128, "output_len": 64}
BASE = Candidate.make("b" * 40)
SMALL = {"name": "small", "params": {
    "NCCL_PROTO": {"values": [None, "LL", "Simple"]},
    "NCCL_P2P_LEVEL": {"values": [None, "LOC", "SYS"]},
    "NCCL_ALGO": {"values": [None, "Tree", "NVLS"]},  # NVLS cannot all-reduce on PCIe: fails
}}


def _search(space_conf=SMALL, *, storage=None, name="t", **kw) -> SweepSearch:
    space = SearchSpace.from_conf(space_conf)
    settings = SweepSettings(**{"budget": 16, "maximize": True, "confirm_rounds": 3, **kw})
    sampler = make_sampler(settings.sampler, space, seed=settings.seed,
                           budget=settings.budget,
                           startup=settings.startup)
    study = open_study(name=name, storage=storage, sampler=sampler, maximize=True)
    return SweepSearch(space, study, BASE, TARGET, settings)


def _drive(search: SweepSearch, oracle: SimOracle, nodes: int = 2, stop_after: int | None = None,
           log: list | None = None) -> list[Work]:
    """Run like the controller does; returns the works still in flight when stopped early."""
    in_flight: deque[Work] = deque()
    finished = 0
    while not search.done:
        in_flight.extend(search.propose(nodes - len(in_flight)))
        if not in_flight or (stop_after is not None and finished >= stop_after):
            break
        work = in_flight.popleft()
        value = oracle.measure(work.candidate)
        search.record(work, value)
        finished += 1
        if log is not None:
            log.append((work.phase, work.candidate, value, False))
    return list(in_flight)


def test_budget_baseline_first_and_interleaved_confirmation():
    search = _search(seed=1)
    log: list = []
    _drive(search, SimOracle(TARGET, BENCH, seed=1), log=log)
    phases = [p for p, *_ in log]
    assert phases[0] == "sweep/baseline"
    assert sum(1 for p in phases if not p.startswith("sweep/confirm")) == 16
    confirm = [(p, c.key) for p, c, *_ in log if p.startswith("sweep/confirm")]
    rounds = Counter(p for p, _ in confirm)
    assert len(rounds) >= 3 and set(rounds.values()) == {2}  # baseline + best in every round
    first = [k for p, k in confirm if p == "sweep/confirm/0"]
    second = [k for p, k in confirm if p == "sweep/confirm/1"]
    assert first == second[::-1]  # the order rotates between rounds
    result = search.result()
    assert result.best is not None and result.best.config.key != search.baseline.key
    assert result.n_trials == len(log)
    trials = search.study.get_trials()
    assert any(t.user_attrs.get("baseline") for t in trials)


def test_untestable_levels_fail_and_are_never_counted_slow():
    search = _search(seed=4, budget=24, sampler="random")
    _drive(search, SimOracle(TARGET, BENCH, seed=4))
    failed = [c for c in search.configs.values() if c.failed]
    assert failed and all(c.assignment.get("NCCL_ALGO") == "NVLS" for c in failed)
    assert all(not c.search for c in failed)
    states = Counter(t.state for t in search.study.get_trials()
                     if t.params.get("NCCL_ALGO") == "NVLS")
    assert set(states) == {TrialState.FAIL}
    # each failing configuration cost one restart; asking for it again costs none
    assert all(c.restarts == 1 for c in failed)
    assert search.result().best.config.assignment.get("NCCL_ALGO") != "NVLS"


def test_obviously_bad_configurations_stop_after_one_restart():
    search = _search(seed=2, budget=30, restarts=2, sampler="random")
    _drive(search, SimOracle(TARGET, BENCH, seed=2, restart_cv=0.005))
    pruned = [c for c in search.configs.values() if c.pruned]
    assert pruned, "a P2P level that disables P2P (LOC) costs ~5% and must be pruned"
    assert all(len(c.search) == 1 for c in pruned)
    assert all(c.assignment.get("NCCL_P2P_LEVEL") == "LOC" for c in pruned)
    states = {t.state for t in search.study.get_trials() if t.user_attrs.get("candidate")
              in {c.key for c in pruned}}
    assert states == {TrialState.PRUNED}
    kept = [c for c in search.configs.values() if c.search and not c.pruned and not c.failed]
    assert any(len(c.search) >= 2 for c in kept)


def test_prune_rule_numbers():
    incumbent = [100.0, 102.0]
    sd = restart_sd([incumbent, [99.0, 101.0]], prior_cv=0.02)
    assert 0.01 < sd < 0.03
    assert prune_decision(90.0, incumbent, sd, maximize=True, sigmas=2).prune
    assert not prune_decision(99.0, incumbent, sd, maximize=True, sigmas=2).prune
    # minimizing a latency: a much higher value is the bad one
    assert prune_decision(112.0, incumbent, sd, maximize=False, sigmas=2).prune
    assert not prune_decision(90.0, incumbent, sd, maximize=False, sigmas=2).prune
    assert not prune_decision(50.0, [], sd, maximize=True, sigmas=2).prune


def test_grid_measures_every_distinct_configuration_once():
    conditional = {"name": "cond", "params": {
        "NCCL_MAX_NCHANNELS": {"values": [None, 2]},
        "NCCL_MIN_NCHANNELS": {"values": [None, 16], "when": {"NCCL_MAX_NCHANNELS": [None]}},
        "NCCL_PROTO": {"values": [None, "LL"]},
    }}
    search = _search(conditional, sampler="grid", budget=40, restarts=1, intensify=0.0)
    assert search.space.size() == 6  # 3 channel settings x 2 protocols, not 2 x 2 x 2
    log: list = []
    _drive(search, SimOracle(TARGET, BENCH, seed=0), log=log)
    searched = Counter(c.key for p, c, *_ in log if p.startswith("sweep/search"))
    assert len(searched) == 5 and set(searched.values()) == {1}  # + the baseline = all six
    assert any("every configuration of the grid" in e for e in search.events)


def test_resume_reuses_finished_restarts_and_open_evaluations(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    oracle = SimOracle(TARGET, BENCH, seed=9)
    first = _search(storage=storage, name="run", seed=9, restarts=2, budget=20)
    log: list = []
    lost = _drive(first, oracle, nodes=3, stop_after=9, log=log)
    assert lost, "the interruption must leave restarts in flight"
    open_before = [t.number for t in first.study.get_trials(states=(TrialState.RUNNING,))]
    assert open_before
    # a new process: the study from its database, the measurements from the store
    second = _search(storage=storage, name="run", seed=9, restarts=2, budget=20)
    second.replay(log)
    assert second.spent == 9
    assert not second.study.get_trials(states=(TrialState.RUNNING,))  # closed, not re-run
    more: list = []
    _drive(second, oracle, nodes=3, log=more)
    searched = [p for p, *_ in log + more if not p.startswith("sweep/confirm")]
    assert len(searched) == 20  # the budget, not 20 + what was lost or repeated
    assert sum(1 for p in searched if p == "sweep/baseline") == 2
    result = second.result()
    assert result.best is not None and result.n_trials == len(log) + len(more)


def test_resume_during_confirmation_keeps_its_plan(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    oracle = SimOracle(TARGET, BENCH, seed=5)
    first = _search(storage=storage, name="run", seed=5)
    log: list = []
    _drive(first, oracle, stop_after=19, log=log)
    assert first.search_over and not first.done
    second = _search(storage=storage, name="run", seed=5)
    second.replay(log)
    assert second.search_over
    assert second.confirmation.plan() == first.confirmation.plan()
    more: list = []
    _drive(second, oracle, log=more)
    assert all(p.startswith("sweep/confirm") for p, *_ in more)
    done = Counter((p, c.key) for p, c, *_ in log + more if p.startswith("sweep/confirm"))
    assert set(done.values()) == {1}  # no confirmation restart ran twice


def test_oracle_matches_the_sim_model_and_refuses_bad_nccl():
    oracle = SimOracle(TARGET, BENCH, restart_cv=0.0, trial_cv=0.0)
    base = oracle.truth(BASE)
    assert base == oracle.measure(BASE)
    assert 85 < base < 95  # calibrated: ~94 tok/s decode, minus the prefill of each request
    faster = oracle.truth(Candidate.make("b" * 40, env={"NCCL_PROTO": "LL"}))
    assert faster > base
    assert oracle.truth(Candidate.make("b" * 40, env={"NCCL_ALGO": "NVLS"})) is None
    deeper = Candidate.make("b" * 40, server={"speculative_num_steps": 3})
    assert oracle.truth(deeper) != base
    # a clock policy is applied to the node's GPU state as the sim's GPU control does:
    # locked at 60% of 2430 MHz, verify goes 19 -> ~29 ms (the seed investigation's signature)
    verify = SimOracle(TARGET, BENCH, metric="verify_ms", restart_cv=0.0, trial_cv=0.0)
    assert verify.truth(BASE) == pytest.approx(19.0, abs=0.05)
    locked = verify.truth(Candidate.make("b" * 40, clock="locked:1458"))
    assert locked == pytest.approx(28.9, abs=0.2)


@pytest.mark.parametrize("maximize", [True, False])
def test_direction_decides_the_winner(maximize):
    space = SearchSpace.from_conf({"name": "one", "params": {"NCCL_P2P_LEVEL": {
        "values": [None, "LOC", "SYS"]}}})
    settings = SweepSettings(budget=10, maximize=maximize, confirm_rounds=3, sampler="grid")
    sampler = make_sampler("grid", space, seed=0, budget=10)
    study = optuna.create_study(sampler=sampler,
                                direction="maximize" if maximize else "minimize")
    search = SweepSearch(space, study, BASE, TARGET, settings)
    metric = "output_throughput" if maximize else "verify_ms"
    _drive(search, SimOracle(TARGET, BENCH, metric=metric, seed=3, restart_cv=0.002,
                             trial_cv=0.0))
    best = search.result().best
    assert best.config.assignment["NCCL_P2P_LEVEL"] == "SYS"  # faster both ways
    assert search.result().status == "found"
    assert math.isfinite(best.effect.pct)


QUICK = {"name": "quick", "params": {"NCCL_PROTO": {"values": [None, "LL", "LL128", "Simple"]},
                                     "NCCL_ALGO": {"values": [None, "Ring", "Tree"]}}}


@pytest.mark.parametrize("nodes", [1, 3])
@pytest.mark.parametrize("budget", [12, 17])
def test_a_grid_runs_every_point_once_before_any_repeat(nodes, budget):
    """`sampler=grid trials=12` on a 12-point space measures all 12 (the baseline is one of
    them), none twice; a larger budget re-measures leaders (up to `intensify`'s share) only
    after the last new point.
    The answer counts what ran."""
    search = _search(QUICK, sampler="grid", budget=budget, restarts=1)  # default intensify
    assert search.space.size() == 12
    log: list = []
    _drive(search, SimOracle(TARGET, BENCH, seed=0), nodes=nodes, log=log)
    order = [c.key for p, c, *_ in log if not p.startswith("sweep/confirm")]
    assert 12 <= len(order) <= budget
    assert len(set(order[:12])) == 12, "a point was repeated before every point ran once"
    assert set(order) == set(order[:12])
    assert search.result().n_configurations == 12


def test_a_sweep_stopped_mid_search_says_its_leading_configuration_so_far():
    """Interrupted before its confirmation, a sweep used to store nothing; its answer so far
    is the search's leading configuration against the baseline, said as not confirmed (a
    better setting, never a cause), and marked provisional."""
    from types import SimpleNamespace

    from orchestrator.commands.sweep import stopped_findings

    search = _search(seed=3)
    _drive(search, SimOracle(TARGET, BENCH, seed=3), stop_after=8)
    assert not search.search_over and search.ranking()
    ctl = SimpleNamespace(store=SimpleNamespace(trials=list, run_id="t"))
    doc = stopped_findings(ctl, search, "output_throughput", "interrupted after 8 restarts",
                           0.99)
    answer = doc["answer"]
    assert answer["status"] == "provisional" and not answer["explains"]
    assert doc["provisional"]["why"] == "interrupted after 8 restarts"
    lead = search.ranking()[0]
    change = 100.0 * (lead.mean() / search.baseline.mean() - 1.0)
    assert answer["sentence"] == (
        f"so far (interrupted after 8 restarts): leading configuration of the search:"
        f" {lead.label}: output_throughput {change:+.1f}% against the baseline"
        f" ({len(lead.search)} and {len(search.baseline.search)} search restarts, not"
        " confirmed)")
    assert answer["causes"] == []
