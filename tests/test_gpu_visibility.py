"""The GPUs a trial's server sees are the GPUs its node was given.

Ray 2.40-2.55 set `CUDA_VISIBLE_DEVICES=""` for an actor that asks for no GPU, which sleuth's
node actors do; the installed Ray (2.60) does the same when `RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1`
turns that behaviour back on, which is how the end-to-end test below reproduces those releases
with the real Ray: a `sleuth trial` whose node was started with `CUDA_VISIBLE_DEVICES=7,6,...`
must launch its server with exactly that.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands import trial as trial_cmd
from orchestrator.config.compose import compose_settings
from orchestrator.records import Outcome
from orchestrator.runner import visibility
from orchestrator.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "trial.ready_timeout_s=60", "trial.retries=0", "bench.repetitions=1"]


def test_the_node_s_gpus_are_read_from_its_raylet_not_from_what_ray_left_the_actor():
    raylet = {"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/bin"}
    seen = visibility.of_node({"CUDA_VISIBLE_DEVICES": ""}, parent=41,
                              read_environ=lambda pid: raylet if pid == 41 else None,
                              is_raylet=lambda pid: pid == 41)
    assert seen.meant == "2,3" and seen.found == "" and seen.changed
    assert "raylet" in seen.source
    env = {"CUDA_VISIBLE_DEVICES": ""}
    visibility.restore(seen, env)
    assert env == {"CUDA_VISIBLE_DEVICES": "2,3"}
    # A raylet started without it: every GPU; the blank Ray put there goes.
    unset = visibility.of_node({"CUDA_VISIBLE_DEVICES": ""}, parent=41,
                               read_environ=lambda pid: {"PATH": "/bin"},
                               is_raylet=lambda pid: True)
    assert unset.meant is None and unset.changed
    visibility.restore(unset, env)
    assert "CUDA_VISIBLE_DEVICES" not in env
    # Not under a raylet (an in-process node): this process's own value.
    alone = visibility.of_node({"CUDA_VISIBLE_DEVICES": "0"}, parent=1,
                               is_raylet=lambda pid: False)
    assert alone.meant == "0" and not alone.changed


def test_a_server_that_sees_other_gpus_is_one_line():
    assert visibility.problem("n0", "0,1", "0,1") == ""
    assert visibility.problem("n0", None, None) == ""
    line = visibility.problem("n0", None, "")
    assert "no GPU at all" in line and "node n0's is unset (every GPU)" in line
    assert "'1'" in visibility.problem("n0", "0", "1") and "\n" not in line


def test_doctor_says_what_the_installed_ray_does_to_gpu_visibility():
    assert visibility.ray_note("2.45.0", {}).startswith("sets CUDA_VISIBLE_DEVICES=''")
    assert visibility.ray_note("2.60.0", {}).startswith("leaves CUDA_VISIBLE_DEVICES")
    old = visibility.ray_note("2.60.0", {visibility.OVERRIDE_ON_ZERO: "1"})
    assert old.startswith("sets") and "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1" in old
    assert visibility.ray_note("2.60.0", {visibility.OVERRIDE_ON_ZERO: "0"}).startswith("leaves")
    assert visibility.NOSET in old


@pytest.mark.e2e
def test_the_server_sees_the_node_s_gpus_even_where_ray_would_hide_them(tmp_path, sim_repo):
    """Through the installed command, with Ray's hiding turned back on in the environment the
    node (the local Ray's raylet) is started from."""
    repo, shas = sim_repo
    assignment = "7,6,5,4,3,2,1,0"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": assignment,
           visibility.OVERRIDE_ON_ZERO: "1"}
    env.pop(visibility.NOSET, None)
    done = subprocess.run([sys.executable, "-m", "orchestrator", "trial", f"repo={repo}",
                           f"commit={shas[0]}", f"runs_dir={tmp_path / 'runs'}", "run_id=vis",
                           *FAST], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    with sqlite3.connect(tmp_path / "runs" / "vis" / "trials.db") as conn:
        outcome, fp = conn.execute("SELECT t.outcome, f.json FROM trials t JOIN fingerprints f"
                                   " ON f.trial_id = t.id").fetchone()
    assert outcome == "ok"
    fp = json.loads(fp)
    assert fp["gpu_visibility"] == {"node": assignment, "server": assignment}
    assert fp["env"]["server"]["CUDA_VISIBLE_DEVICES"] == assignment


def test_a_server_moved_to_other_gpus_on_the_way_is_env_mismatch(tmp_path, sim_repo,
                                                                  ray_session, monkeypatch):
    """A launcher that changes the variable between the node and the server (a wrapper script,
    a scheduler's prolog): the server starts, on other GPUs than the node's; the trial says so
    and measures nothing."""
    repo, shas = sim_repo
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST,
                                     f"commit={shas[0]}", "target.tp_size=1",
                                     "target.launcher=[env,'CUDA_VISIBLE_DEVICES=1']"])
    assert trial_cmd.run(cfg) == 1
    runs = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(runs[0] / "trials.db").trials()
    assert row.outcome is Outcome.ENV_MISMATCH, row.detail
    assert "the server's CUDA_VISIBLE_DEVICES is '1'" in row.detail
    assert "it would run on other GPUs than the node's" in row.detail
    assert row.result.measurements == ()
    assert row.result.fingerprint["gpu_visibility"]["server"] == "1"


@pytest.mark.e2e
def test_doctor_reports_the_ray_version_and_what_a_node_actor_sees(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": "3,1",
           visibility.OVERRIDE_ON_ZERO: "1"}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "doctor",
                           f"runs_dir={tmp_path / 'runs'}"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    (line,) = [ln for ln in done.stdout.splitlines() if ln.split()[1:2] == ["gpus"]]
    import ray

    assert line.split()[0] == "ok", line
    assert f"Ray {ray.__version__} sets CUDA_VISIBLE_DEVICES=''" in line  # as 2.40-2.55 do
    assert "measured: a node actor sees CUDA_VISIBLE_DEVICES as this shell does ('3,1')" in line
