"""Acceptance of `sleuth sweep` (issue: planted optimum, <= 40 trials, confirmed, importance).

The sim's NCCL model (`orchestrator/targets/sim/comm.py`) plants an optimum away from NCCL's
defaults (LL, Tree, 4 channels, P2P through the CPU, 1 MiB buffers, 32 connections) and makes
NCCL_P2P_LEVEL the parameter that matters most (levels that turn P2P off cost ~5%). The truth is
computed from the sim's pure model over all 7056 configurations of `space=nccl_pcie`; each sweep
runs the real experiment code against restart noise of 2% (the sim's default), two trials in
flight, 40 search trials. Seeds are fixed, so the rates below are exact for this code; the same
measurement over 40 seeds is in docs/benchmarks.md (`python -m experiments.bench_sweep`).
"""

from __future__ import annotations

import pytest
from conftest import seed_counts

from experiments import bench_sweep as benchmark
from orchestrator.config import sweep as setup
from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import as_dict
from orchestrator.sim_scenarios.sweep_oracle import SimOracle

SEEDS = range(12)


@pytest.fixture(scope="module")
def truth_and_cfg():
    cfg = compose_settings("sweep", benchmark.DEFAULTS)
    target = as_dict(cfg.target)
    space = setup.space(cfg, target)
    oracle = SimOracle(target, as_dict(cfg.bench),
                       metric="output_throughput")
    return benchmark.truth(space, oracle, target, maximize=True), cfg


def test_planted_optimum_and_important_parameter(truth_and_cfg):
    truth, _ = truth_and_cfg
    assert truth.size >= 200
    assert truth.important == "NCCL_P2P_LEVEL"
    assert truth.best_value / truth.baseline_value > 1.03  # worth finding
    assert "NCCL_PROTO=LL " in truth.best_label + " "


@pytest.mark.parametrize("n", seed_counts(12, few=4))
def test_sweeps_find_confirm_and_rank(truth_and_cfg, n):
    """12 seeds fail below 10 within 2% / 9 confirmed / 10 ranked first; the first 4 seeds
    (all 4 within 2%, confirmed and ranked first when this was written) below 3 of each."""
    truth, cfg = truth_and_cfg
    outcomes = [benchmark.score(benchmark.run_virtual(cfg, seed), truth, True)
                for seed in SEEDS[:n]]
    n = len(outcomes)
    within = [o for o in outcomes if o.gap_pct is not None and o.gap_pct <= 2.0]
    confirmed = [o for o in outcomes if o.result.status == "found"]
    ranked = [o for o in outcomes if o.top_param == truth.important]
    search = [o.result.n_trials - len(o.result.baseline.confirm)
              - sum(len(c.config.confirm) for c in o.result.confirmed) for o in outcomes]
    assert max(search) <= 40
    assert len(within) >= n * 10 // 12, [round(o.gap_pct, 2) for o in outcomes]
    assert len(confirmed) >= n * 9 // 12, [o.result.message for o in outcomes]
    assert len(ranked) >= n * 10 // 12, [o.top_param for o in outcomes]
    for o in confirmed:  # a confirmed configuration really is faster than the baseline
        assert o.chosen_truth > truth.baseline_value
        assert o.result.best.effect.ci[0] > 0
    assert n == len(outcomes)
