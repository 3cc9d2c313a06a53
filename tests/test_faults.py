"""The fault matrix: each server misbehaviour is classified, retried, then untestable, never
"slow"; afterwards no process is left (conftest guard), clocks are restored, rows are final."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.commands import trial as trial_cmd
from orchestrator.config.compose import compose_config
from orchestrator.controller import Controller
from orchestrator.records import Candidate, Outcome
from orchestrator.rundir import create_run
from orchestrator.runner.process import group_members
from orchestrator.store import RunStore
from orchestrator.targets.sim import gpu_state

FAST = ["target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=4", "trial.retries=1",
        "bench.request_timeout_s=2", "trial.grace_s=2", "clock=power:400"]


def _cfg(tmp_path: Path, repo: Path, *extra: str):
    return compose_config("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST, *extra])


def _store(tmp_path: Path) -> RunStore:
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    return RunStore.open(run / "trials.db")


def _power_limits(tmp_path: Path) -> set[int]:
    state = gpu_state.load(tmp_path / "runs" / ".nodes" / "local-0" / "gpu_state.json")
    return {g.power_limit_w for g in state.gpus}


@pytest.mark.parametrize("fault, outcome", [
    ("exit_at_start", Outcome.LAUNCH_FAILED),
    ("refuse_bind", Outcome.LAUNCH_FAILED),
    ("never_ready", Outcome.NOT_READY),
    ("crash_after:1", Outcome.CRASHED),
    ("hang_mid_stream:1", Outcome.HUNG),
])
def test_fault_is_classified_retried_and_cleaned_up(tmp_path, sim_repo, ray_session, fault, outcome):
    repo, _ = sim_repo
    assert trial_cmd.run(_cfg(tmp_path, repo, f"target.fault={fault}")) == 1
    rows = _store(tmp_path).trials()
    assert [r.attempt for r in rows] == [1, 2]  # retried once, then untestable
    for r in rows:
        assert r.outcome is outcome, r.detail
        assert r.result.measurements == () and r.result.value("verify_ms") is None
        assert r.state == "done" and r.ended_at
        assert Path(r.log_path).exists()
    assert _power_limits(tmp_path) == {600}  # the clock policy was restored each time


def test_leftover_server_from_an_earlier_controller_is_stopped(tmp_path, sim_repo, ray_session):
    repo, _ = sim_repo
    node = tmp_path / "runs" / ".nodes" / "local-0"
    node.mkdir(parents=True)
    stray = subprocess.Popen(["sleep", "300"], cwd=tmp_path, start_new_session=True)
    start = Path(f"/proc/{stray.pid}/stat").read_text()
    start_time = start[start.rfind(")") + 2:].split()[19]
    (node / "server.json").write_text(json.dumps({"pgid": stray.pid, "port": 1,
                                                  "start_time": start_time}))
    try:
        assert trial_cmd.run(_cfg(tmp_path, repo)) == 0
        stray.wait(timeout=10)
        assert not group_members(stray.pid)
        assert not (node / "server.json").exists()
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


def test_node_actor_killed_mid_trial(tmp_path, sim_repo, ray_session):
    import ray

    repo, shas = sim_repo
    cfg = _cfg(tmp_path, repo, "bench.repetitions=6", "bench.output_len=64")
    run_dir, store = create_run(cfg)
    with Controller(cfg, store, run_dir) as ctl:
        ctl.submit(Candidate.make(shas[0]))
        actor = ctl._actors["local-0"]
        deadline = time.monotonic() + 30
        while ray.get(actor.status.remote()).get("state") != "benchmarking":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        server = json.loads((tmp_path / "runs" / ".nodes" / "local-0" / "server.json").read_text())
        ray.kill(actor)
        (final,) = ctl.wait()
    rows = store.trials()
    # Not the candidate's fault: recorded (never evidence), run again on a fresh actor without
    # using up trial.retries.
    assert rows[0].outcome is Outcome.INTERRUPTED and "lost" in rows[0].detail
    assert final.attempt == 1 and final.outcome is Outcome.OK and final.id == rows[1].id
    deadline = time.monotonic() + 10
    while group_members(server["pgid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_members(server["pgid"])  # the dead actor's server did not survive it
    assert _power_limits(tmp_path) == {600}  # restored: by the dead actor's successor if needed


def test_new_node_actor_restores_a_clock_policy_left_applied(tmp_path):
    from omegaconf import OmegaConf

    from orchestrator.runner.node import NodeRunner

    cfg = _cfg(tmp_path, tmp_path)
    node = tmp_path / "runs" / ".nodes" / "local-0"
    node.mkdir(parents=True)
    capped = gpu_state.default_state().with_all_gpus(power_limit_w=300)
    gpu_state.save(node / "gpu_state.json", capped)
    (node / "clock_restore.json").write_text(json.dumps([[g.index, None, 600] for g in capped.gpus]))
    runner = NodeRunner("local-0", str(node), OmegaConf.to_container(cfg.target),
                        OmegaConf.to_container(cfg.bench))
    assert runner.info()["clock_restored"] is True
    assert _power_limits(tmp_path) == {600}
    assert not (node / "clock_restore.json").exists()
