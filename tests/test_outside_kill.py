"""A server killed from outside is the machine's doing, never the candidate's: the trial is
`interrupted` and runs again without using up a retry; a crash or an OOM kill still counts."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from orchestrator.commands import parts
from orchestrator.commands.parts import create_run
from orchestrator.config.compose import compose_settings
from orchestrator.control.controller import Controller
from orchestrator.records import Candidate, Outcome
from orchestrator.runner.exits import killed_from_outside, oom_kills
from orchestrator.util.process import group_members

FAST = ["target=sim", "target.time_scale=0.02", "bench.requests=2", "bench.output_len=32",
        "bench.input_len=32", "bench.warmup_requests=1", "bench.repetitions=2",
        "bench.request_timeout_s=10", "trial.grace_s=2", "trial.retries=0"]


def test_exit_statuses_are_told_apart(tmp_path):
    assert killed_from_outside(-signal.SIGTERM, None, None) == "SIGTERM"
    assert killed_from_outside(-signal.SIGHUP, 3, 3) == "SIGHUP"
    assert killed_from_outside(-signal.SIGINT, 3, 4) == "SIGINT"
    # A crash is the server's own: an exit code, SIGSEGV, SIGABRT.
    for code in (1, 0, -signal.SIGSEGV, -signal.SIGABRT, -signal.SIGBUS, None, -999):
        assert killed_from_outside(code, 3, 3) is None
    # SIGKILL: from outside only when the kernel's OOM killer did not act meanwhile, and only
    # when that can be read at all.
    assert killed_from_outside(-signal.SIGKILL, 3, 3) == "SIGKILL"
    assert killed_from_outside(-signal.SIGKILL, 3, 4) is None
    assert killed_from_outside(-signal.SIGKILL, None, 4) is None
    vmstat = tmp_path / "vmstat"
    vmstat.write_text("nr_free_pages 1\noom_kill 7\npgfault 9\n")
    assert oom_kills(vmstat) == 7
    vmstat.write_text("nr_free_pages 1\n")
    assert oom_kills(vmstat) is None
    assert oom_kills(tmp_path / "missing") is None


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_server_killed_while_it_loads_is_interrupted_and_runs_again(tmp_path, sim_repo,
                                                                      ray_session, sig):
    import ray

    if sig is signal.SIGKILL and oom_kills() is None:
        pytest.skip("no OOM-kill counter here: a SIGKILL is kept as the candidate's failure")
    repo, shas = sim_repo
    # The server stays in its loading phase while `barrier` exists (the sim's hold_loading
    # fault), so it is caught loading however busy the host; once the barrier is gone the
    # attempt that runs again loads in its usual time.
    barrier = tmp_path / "loading"
    barrier.touch()
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST,
                                   "target.load_seconds=5", f"target.fault=hold_loading:{barrier}",
                                   "trial.ready_timeout_s=120"])
    run_dir, store = create_run(cfg)
    pidfile = tmp_path / "runs" / ".nodes" / "local-0" / "server.json"
    with Controller(parts.control(cfg), store, run_dir) as ctl:
        ctl.submit(Candidate.make(shas[0]))
        actor = ctl._actors["local-0"]
        deadline = time.monotonic() + 60
        while ray.get(actor.status.remote()).get("state") != "waiting_ready" \
                or not pidfile.exists():
            assert time.monotonic() < deadline, "the server never started loading"
            time.sleep(0.1)
        server = json.loads(pidfile.read_text())
        os.kill(server["pgid"], sig)  # as a user's `kill PID` would
        barrier.unlink()
        (final,) = ctl.wait()
    rows = store.trials()
    assert rows[0].outcome is Outcome.INTERRUPTED, rows[0].detail
    assert f"killed from outside ({sig.name})" in rows[0].detail
    # Not the candidate's doing: measured on the next attempt although trial.retries=0.
    assert final.outcome is Outcome.OK and final.id == rows[1].id and final.attempt == 1
    assert len(rows) == 2
    deadline = time.monotonic() + 10
    while group_members(server["pgid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not group_members(server["pgid"])


def test_a_server_that_dies_by_itself_while_loading_is_still_launch_failed(
        tmp_path: Path, sim_repo, ray_session):
    from orchestrator.commands import trial as trial_cmd

    repo, _ = sim_repo
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST,
                                   "target.fault=exit_at_start", "target.load_seconds=5",
                                   "trial.ready_timeout_s=30"])
    assert trial_cmd.run(cfg) == 1
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    from orchestrator.store import RunStore

    (row,) = RunStore.open(run / "trials.db").trials()
    assert row.outcome is Outcome.LAUNCH_FAILED and "killed from outside" not in row.detail
