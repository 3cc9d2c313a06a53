"""Reference strategies of the localization benchmark, and the benchmark module itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from orchestrator.strategies import Observation
from orchestrator.strategies.baselines import (
    BayesectStrategy,
    BetaBernoulliBisector,
    ThresholdBisectStrategy,
)

REPO = Path(__file__).resolve().parents[1]


def _run(strategy, culprit: int, effect: float, cv: float, seed: int, broken=()):
    rng = np.random.default_rng(seed)
    observations: list[Observation] = []
    while len(observations) < 2000:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        point = proposals[0].point
        value = None if point in broken else 10 * (1 + effect * (point >= culprit)) * (
            1 + cv * rng.standard_normal()
        )
        observations.append(Observation(point, value))
    return strategy.verdict(observations), observations


def test_classic_bisect_takes_log2_steps_and_trusts_every_reading() -> None:
    verdict, observations = _run(ThresholdBisectStrategy(256), 100, 0.5, 0.01, seed=1)
    assert verdict.status == "found" and verdict.top is not None and verdict.top.point == 100
    assert len(observations) == 2 + 8
    # One unlucky reading in heavy noise sends it to the wrong place, with full confidence.
    wrong = 0
    for seed in range(20):
        verdict, _ = _run(ThresholdBisectStrategy(256), 100, 0.05, 0.05, seed=seed)
        wrong += verdict.top is not None and verdict.top.point != 100
    assert wrong >= 10


def test_classic_bisect_skips_untestable_midpoints() -> None:
    verdict, observations = _run(
        ThresholdBisectStrategy(64), 30, 0.5, 0.01, seed=2, broken={31, 32, 29}
    )
    assert verdict.status == "found"
    assert verdict.top is not None and verdict.top.point in (30, 33)
    assert sum(o.value is None for o in observations) <= 3


def test_bayesect_finds_the_culprit_on_thresholded_trials() -> None:
    verdict, observations = _run(BayesectStrategy(64, endpoint_trials=2), 40, 0.5, 0.05, seed=3)
    assert verdict.status == "found" and verdict.top is not None and verdict.top.point == 40
    assert verdict.top.probability >= 0.99
    assert [o.point for o in observations[:4]] == [0, 63, 0, 63]


def test_port_matches_the_git_bayesect_package() -> None:
    package = pytest.importorskip("git_bayesect")
    rng = np.random.default_rng(4)
    prior = np.ones(50)
    prior[7] = 3.0
    ours, theirs = BetaBernoulliBisector(prior), package.Bisector(prior.copy())
    with np.errstate(divide="ignore", invalid="ignore"):
        for _ in range(40):
            index = int(rng.integers(0, 50))
            result = bool(rng.random() < (0.8 if index <= 20 else 0.2))
            ours.record(index, result)
            theirs.record(index, result)
            assert ours.select() == theirs.select()
        np.testing.assert_allclose(ours.distribution, theirs.distribution, rtol=1e-9)


def test_benchmark_module_runs_and_writes_its_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = {**os.environ, "CASES": "20", "REGIMES": "seed_verify", "BENCH_OUT": str(out)}
    completed = subprocess.run(
        [sys.executable, "-m", "experiments.bench_localize"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "seed_verify" in completed.stdout and "K=4 needs" in completed.stdout
    report = json.loads(out.read_text())
    methods = report["seed_verify"]
    assert set(methods) == {"sleuth", "sleuth_k4", "bisect", "bayesect"}
    for row in methods.values():
        assert {"accuracy", "mean_trials", "p90_trials", "mean_rounds"} <= set(row)
        assert row["cases"] == 20
    assert methods["sleuth"]["accuracy"] == 1.0
    assert methods["sleuth"]["mean_trials"] < methods["bayesect"]["mean_trials"]
    assert methods["sleuth"]["mean_rounds"] >= 2.2 * methods["sleuth_k4"]["mean_rounds"]
    assert methods["bisect"]["mean_trials"] == 10.0
