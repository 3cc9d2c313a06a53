"""A power limit compared within one server lifetime, and a budget in node time, end to end:
the installed `sleuth` in a subprocess, real sim servers that apply a power limit set on the
running server (the simulated node re-reads its GPU state every batch), a real local Ray.

- `power_only`: since the reference the power limit went 600 -> 450 W from outside, nothing
  else. `sleuth isolate reference=RUN` names it within three restarts of its own (each
  lifetime measures both limits in interleaved blocks), and the paired interval holds the
  planted truth.
- the seed story on a modeled node whose restart takes ten minutes: `budget=2h` stops at the
  budget with the answer so far (exit 4), saying what finishing would still cost; the plan in
  GPU-hours comes before the first restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.run.blocks import lifetime_of
from orchestrator.store import RunStore

pytestmark = pytest.mark.e2e

SLEUTH = str(Path(sys.executable).parent / "sleuth")
FAST = ["target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "trial.ready_timeout_s=30"]


def _sleuth(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "1000"}
    return subprocess.run([SLEUTH, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=900)


def _reference(tmp_path: Path, preset: str, extra: list[str], commits: int = 20) -> dict:
    sc, runs = tmp_path / "sc", tmp_path / "runs"
    done = _sleuth(tmp_path, "scenario", f"out={sc}", f"preset={preset}", f"commits={commits}",
                   "seed=3")
    assert done.returncode == 0, done.stderr
    truth = json.loads((sc / "truth.json").read_text())
    for args in (["scenario", f"out={sc}", "apply=reference", f"runs_dir={runs}"],
                 ["trial", "target=sim", f"repo={sc}/repo", f"runs_dir={runs}",
                  f"commit={truth['good']}", "restarts=3", "run_id=reference", *extra],
                 ["scenario", f"out={sc}", "apply=now", f"runs_dir={runs}"]):
        done = _sleuth(tmp_path, *args)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return truth


def test_a_power_limit_alone_is_isolated_within_three_restarts(tmp_path):
    truth = _reference(tmp_path, "power_only", FAST)
    done = _sleuth(tmp_path, "isolate", "target=sim", f"repo={tmp_path}/sc/repo",
                   f"runs_dir={tmp_path}/runs", "reference=reference", "run_id=iso")
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "within one server lifetime" in out
    store = RunStore.open(tmp_path / "runs" / "iso" / "trials.db", readonly=True)
    try:
        rows = store.trials()
    finally:
        store.close()
    lifetimes = [r for r in rows if r.phase == "lifetime"]
    assert 1 <= len(lifetimes) <= 3, [(r.id, r.phase) for r in rows]
    # every other row of the isolate is a block of one of them: no restart of its own
    isolate_rows = [r for r in rows if r.phase not in ("compare", "lifetime")]
    assert all(lifetime_of(r.result.fingerprint) in {x.id for x in lifetimes}
               for r in isolate_rows)
    doc = json.loads((tmp_path / "runs" / "iso" / "findings-isolate.json").read_text())
    found = doc["findings"][0]
    assert found["id"] == "power_limit_w"
    planted = next(c for c in truth["system"]["changes"] if c["factor"] == "clock")
    lo, hi = found["effect_detail"]["verify_ms"]["ci"]
    assert lo - 0.5 <= planted["effect"]["verify_ms"]["pct"] <= hi + 0.5, (lo, hi)
    assert hi - lo < 3.0  # paired: the restart noise (2%) is not in it


def test_a_budget_in_node_time_stops_with_the_answer_so_far(tmp_path):
    slow = ["target.time_scale=0.002", "target.load_seconds=600", "bench.requests=2",
            "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
            "trial.ready_timeout_s=60"]
    truth = _reference(tmp_path, "seed_story", slow)
    done = _sleuth(tmp_path, "investigate", "target=sim", f"repo={tmp_path}/sc/repo",
                   f"runs_dir={tmp_path}/runs", "reference=reference",
                   f"bad={truth['bad'][:12]}", "evidence.kernels=false", "budget=2h",
                   "run_id=inv")
    out = done.stdout + done.stderr
    assert done.returncode in (3, 4), out[-4000:]  # a best guess 3, nothing decided 4
    lines = out.splitlines()
    plan = next(i for i, ln in enumerate(lines) if ln.startswith("plan: about"))
    first = next(i for i, ln in enumerate(lines) if ln.startswith("trial 1 started"))
    assert plan < first and "modeled GPU-h" in lines[plan], lines[plan]
    assert any(ln.startswith("budget: 2.0 h of node time") for ln in lines)
    assert "the budget of 2.0 h of node time was spent" in out
    answer = json.loads((tmp_path / "runs" / "inv" / "findings-investigate.json").read_text())
    answer = answer["answer"]
    assert answer["provisional"] and answer["budget"]["to_finish"]["restarts"] > 0
    assert "to finish: about" in answer["sentence"]
    store = RunStore.open(tmp_path / "runs" / "inv" / "trials.db", readonly=True)
    try:
        rows = store.trials()
    finally:
        store.close()
    from orchestrator.run.cost import trial_cost
    target = {"name": "sim", "time_scale": 0.002}
    costs = [c.total for r in rows if r.result is not None
             and lifetime_of(r.result.fingerprint) is None
             for c in [trial_cost(r.result, target)] if c is not None]
    # No restart starts once the next one's expected cost would pass the budget. What a restart
    # then costs is measured, and on the sim it is wall time over time_scale: on a busy host
    # the last one may cost more than expected (7,238 s of 7,200 in one loaded run).
    assert sum(costs[:-1]) <= 2 * 3600
