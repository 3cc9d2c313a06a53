"""End to end on the sim: with request-level noise far above restart-level noise, the bisect
raises its repetitions per restart, says so, names the planted commit, and spends fewer modeled
GPU-minutes than the same bisect with a fixed `bench.repetitions=3`."""

from __future__ import annotations

import json

import pytest

from orchestrator.commands import bisect
from orchestrator.config.compose import compose_settings
from orchestrator.sim_scenarios.generate import generate_scenario
from orchestrator.store import RunStore
from tests.test_bisect_e2e import FAST, _bisect

# The soak lane (`pytest -m soak`): a statistical claim about cost (adaptive repetitions read
# the noise split and spend fewer GPU-minutes) on two full bisects, 50 s, and its noise split
# rests on the few restarts a short bisect takes (a restart sd read at 8% for a true 0.2% once,
# idle). experiments/bench_cost.py measures the same claim over many cases.
pytestmark = [pytest.mark.e2e, pytest.mark.soak]

NOISY_REQUESTS = ["target.noise_request_cv=1.2", "target.noise_restart_cv=0.002",
                  "target.load_seconds=60", "bench.repetitions=3"]


def test_request_noise_raises_repetitions_and_saves_gpu_minutes(tmp_path, ray_session, capsys):
    scenario = generate_scenario(tmp_path / "sc", 20, 3, "one_culprit")
    (planted,) = scenario.truth["culprits"]
    code, doc, _ = _bisect(tmp_path / "adaptive", scenario, *NOISY_REQUESTS)
    printed = capsys.readouterr().out
    assert code == 0, doc["message"]
    assert doc["findings"][0]["id"] == planted["sha"]
    reps = doc["repetitions"]
    assert reps["adaptive"] and reps["final"] > 3, reps
    assert "3 -> " in reps["changes"][0] and "a restart costs" in reps["changes"][0]
    assert "then chosen per restart in 1..32" in printed  # stated in the run's first lines
    assert "repetitions per restart: " in printed  # each change is said when it happens
    assert "GPU-min" in printed or "GPU-h" in printed
    noise = reps["noise"]
    assert noise["repetition_sd_pct"] > 3 * noise["restart_sd_pct"]

    # A second run on the same runs_dir starts from the first one's noise and costs: it
    # chooses its repetitions before its first restart (a short run: 4 restarts).
    first = {p.name for p in (tmp_path / "adaptive" / "runs").iterdir()}
    truth = scenario.truth
    again = compose_settings("bisect", [f"repo={scenario.repo}",
                                      f"runs_dir={tmp_path / 'adaptive' / 'runs'}",
                                      f"good={truth['good']}", f"bad={truth['bad']}",
                                      "metric=verify_ms", "nodes=2", "max_trials=4", *FAST,
                                      *NOISY_REQUESTS])
    bisect.run(again)
    printed = capsys.readouterr().out
    assert "noise prior: 1 earlier run(s) of this server and benchmark" in printed, printed
    assert "after 0 trials: 3 -> " in printed, printed
    (second,) = [p for p in (tmp_path / "adaptive" / "runs").iterdir() if p.name not in first]
    store = RunStore.open(second / "trials.db", readonly=True)
    counts = [len(r.result.measurements) for r in store.trials() if r.result is not None]
    store.close()
    assert counts and all(n > 3 for n in counts), counts
    assert json.loads((second / "findings.json").read_text())["repetitions"]["prior_runs"]

    code, fixed, _ = _bisect(tmp_path / "fixed", scenario, *NOISY_REQUESTS,
                             "bench.adaptive_repetitions=false")
    assert code == 0, fixed["message"]
    assert fixed["findings"][0]["id"] == planted["sha"]
    assert fixed["repetitions"]["final"] == 3 and not fixed["repetitions"]["changes"]
    assert reps["gpu_minutes"] < fixed["repetitions"]["gpu_minutes"], (reps, fixed["repetitions"])
