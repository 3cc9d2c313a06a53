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
    assert fp["gpu_visibility"] == {"node": assignment, "handed": assignment,
                                    "server": assignment}
    assert fp["env"]["server"]["CUDA_VISIBLE_DEVICES"] == assignment


def test_a_trial_that_would_hand_its_server_other_gpus_than_the_node_s_is_env_mismatch(
        monkeypatch):
    """Ray changed the actor's variable and nothing put it back: the trial refuses before it
    launches anything (a launch on no GPU would only fail, as the candidate's fault)."""
    from orchestrator.runner import trial as trial_mod
    from orchestrator.runner.trial_checks import TrialFailure

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    t = trial_mod._Trial(None, None, "n0", None, None, None, node_gpus="0,1")
    t.env = {"CUDA_VISIBLE_DEVICES": ""}
    with pytest.raises(TrialFailure) as refused:
        trial_mod._check_gpus(t, {})
    assert refused.value.outcome is Outcome.ENV_MISMATCH
    detail = refused.value.detail
    assert detail.startswith("this node actor's CUDA_VISIBLE_DEVICES is '' (no GPU at all")
    assert "node n0's is '0,1'" in detail
    assert t.fp["gpu_visibility"] == {"node": "0,1", "handed": ""}
    # The run sets it itself: its own request, which `env_mismatches` holds the server to.
    t = trial_mod._Trial(None, None, "n0", None, None, None, node_gpus="0,1")
    trial_mod._check_gpus(t, {"CUDA_VISIBLE_DEVICES": "1"})
    assert "gpu_visibility" not in t.fp
    # On the way, a launcher may choose (recorded); hiding every GPU is refused.
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    t = trial_mod._Trial(None, None, "n0", None, None, None, node_gpus=None)
    trial_mod._check_gpus(t, {})
    trial_mod._check_gpus(t, {}, {"CUDA_VISIBLE_DEVICES": "3"})
    assert t.fp["gpu_visibility"] == {"node": None, "handed": None, "server": "3"}
    with pytest.raises(TrialFailure):
        trial_mod._check_gpus(t, {}, {"CUDA_VISIBLE_DEVICES": ""})


def test_a_launcher_that_chooses_the_server_s_gpus_is_recorded(tmp_path, sim_repo,
                                                                ray_session):
    """A wrapper between the node and the server that sets the variable (a node's own GPU
    choice, as the simulated node's shell does): the trial runs, and its fingerprint says
    what the node had, what sleuth handed on and what the server got."""
    repo, shas = sim_repo
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST,
                                     f"commit={shas[0]}", "target.tp_size=1",
                                     "target.launcher=[env,'CUDA_VISIBLE_DEVICES=1']"])
    assert trial_cmd.run(cfg) == 0
    runs = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(runs[0] / "trials.db").trials()
    assert row.outcome is Outcome.OK, row.detail
    node = os.environ.get("CUDA_VISIBLE_DEVICES")  # the session's local Ray: this process's
    assert row.result.fingerprint["gpu_visibility"] == {"node": node, "handed": node,
                                                        "server": "1"}


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


@pytest.mark.e2e
def test_a_node_whose_own_environment_hides_every_gpu_is_refused(tmp_path, sim_repo):
    repo, shas = sim_repo
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "trial", f"repo={repo}",
                           f"commit={shas[0]}", f"runs_dir={tmp_path / 'runs'}", *FAST],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("sleuth: error: node local-0's CUDA_VISIBLE_DEVICES is ''"), line
    assert "its servers would see no GPU" in line
    runs = tmp_path / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]
