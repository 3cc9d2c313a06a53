"""The fault matrix: each server misbehaviour is classified, retried, then untestable, never
"slow"; afterwards no process is left (conftest guard), clocks are restored, rows are final."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest

from orchestrator.commands import parts
from orchestrator.commands import trial as trial_cmd
from orchestrator.commands.parts import create_run
from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import as_dict
from orchestrator.control.controller import Controller
from orchestrator.records import Candidate, Outcome
from orchestrator.store import RunStore
from orchestrator.targets.sim import gpu_state
from orchestrator.util.process import group_members

FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=4", "trial.retries=1",
        "bench.request_timeout_s=2", "trial.grace_s=2", "clock=power:400"]


def _cfg(tmp_path: Path, repo: Path, *extra: str):
    return compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST, *extra])


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
    with Controller(parts.control(cfg), store, run_dir) as ctl:
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
    from orchestrator.runner.node import NodeRunner

    cfg = _cfg(tmp_path, tmp_path)
    node = tmp_path / "runs" / ".nodes" / "local-0"
    node.mkdir(parents=True)
    capped = gpu_state.default_state().with_all_gpus(power_limit_w=300)
    gpu_state.save(node / "gpu_state.json", capped)
    (node / "clock_restore.json").write_text(json.dumps([[g.index, None, 600] for g in capped.gpus]))
    runner = NodeRunner("local-0", str(node), as_dict(cfg.target),
                        as_dict(cfg.bench))
    assert runner.info()["clock_restored"] is True
    assert _power_limits(tmp_path) == {600}
    assert not (node / "clock_restore.json").exists()


# --------------------------------------------------------------- two runs on one runs_dir


def _wait_for_state(actor, state: str, timeout: float = 30) -> None:
    import ray

    deadline = time.monotonic() + timeout
    while ray.get(actor.status.remote()).get("state") != state:
        assert time.monotonic() < deadline, f"never reached {state}"
        time.sleep(0.1)


def test_a_second_run_on_the_same_runs_dir_refuses_and_leaves_the_first_alone(
        tmp_path, sim_repo, ray_session, capsys):
    import ray

    from orchestrator.cli import main

    repo, shas = sim_repo
    # The first run's trial is held mid-benchmark (its second measured request waits while the
    # barrier file exists) until the checks below are done, however slowly they run.
    barrier = tmp_path / "hold"
    barrier.touch()
    cfg = _cfg(tmp_path, repo, "bench.repetitions=3", f"target.fault=hold_from:2:{barrier}",
               "bench.request_timeout_s=600")
    run_dir, store = create_run(cfg)
    node = tmp_path / "runs" / ".nodes" / "local-0"
    with Controller(parts.control(cfg), store, run_dir) as ctl:
        ctl.submit(Candidate.make(shas[0], clock="power:400"))
        _wait_for_state(ctl._actors["local-0"], "benchmarking", timeout=300)
        server = json.loads((node / "server.json").read_text())
        holder = json.loads((node / "holder.json").read_text())
        assert holder["run_id"] == store.run_id and holder["pid"] and holder["start_time"]
        with pytest.raises(SystemExit) as exc:
            main(["trial", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST])
        err = capsys.readouterr().err.strip().splitlines()
        assert exc.value.code == 2  # refused before Ray, as bad input (a race ends in exit 1)
        assert len(err) == 1 and "held by another sleuth run" in err[0], err
        assert "another runs_dir=DIR" in err[0], err
        assert store.run_id in err[0] and f"pid {holder['pid']}" in err[0]
        assert ray.get(ctl._actors["local-0"].status.remote())["state"] == "benchmarking"
        assert group_members(server["pgid"]), "the second run killed the first run's server"
        assert _power_limits(tmp_path) == {400}  # the first run's policy, untouched
        barrier.unlink()
        (row,) = ctl.wait()
    assert row.outcome is Outcome.OK and row.attempt == 1 and not row.suspect
    runs = [p.name for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    assert runs == [run_dir.name]  # the refused run left nothing


def test_a_clock_set_from_outside_during_a_trial_marks_it_suspect(tmp_path, sim_repo, ray_session):
    repo, shas = sim_repo
    cfg = _cfg(tmp_path, repo, "bench.repetitions=6", "bench.output_len=64")
    run_dir, store = create_run(cfg)
    state = tmp_path / "runs" / ".nodes" / "local-0" / "gpu_state.json"
    with Controller(parts.control(cfg), store, run_dir) as ctl:
        ctl.submit(Candidate.make(shas[0]))
        _wait_for_state(ctl._actors["local-0"], "benchmarking")
        gpu_state.save(state, gpu_state.load(state).with_all_gpus(power_limit_w=450))
        (row,) = ctl.wait()
    assert row.outcome is Outcome.OK and row.suspect
    assert "not by this run" in row.result.suspect_reason
    assert "GPU 0 power_limit_w 600 -> 450" in row.result.suspect_reason


def test_node_state_belongs_to_the_actor_holding_it(tmp_path):
    from orchestrator.runner.node import NodeRunner

    cfg = _cfg(tmp_path, tmp_path)
    node = tmp_path / "runs" / ".nodes" / "local-0"
    node.mkdir(parents=True)
    stray = subprocess.Popen(["sleep", "300"], cwd=tmp_path, start_new_session=True)
    try:
        stat = Path(f"/proc/{stray.pid}/stat").read_text()
        (node / "server.json").write_text(json.dumps({
            "pgid": stray.pid, "port": 1, "start_time": stat[stat.rfind(")") + 2:].split()[19]}))
        args = ("local-0", str(node), as_dict(cfg.target),
                as_dict(cfg.bench))
        first = NodeRunner(*args, run_id="first")
        assert first.held_by is None and first.reaped == [stray.pid]  # its own leftover: reaped
        stray.wait(timeout=10)
        (node / "server.json").write_text(json.dumps({"pgid": 1, "port": 1, "start_time": "0"}))
        second = NodeRunner(*args, run_id="second")
        assert second.held_by["run_id"] == "first" and second.reaped == []
        assert (node / "server.json").exists()  # the holder's state is not touched
        assert "held by another run" in second.run(None).detail  # and it runs nothing
        del first
        import gc

        gc.collect()
    finally:
        if stray.poll() is None:
            stray.kill()
            stray.wait()


# --------------------------------------------------------------- a full disk


@pytest.fixture()
def tiny_disk(tmp_path):
    """A 24 MiB tmpfs (skipped where mounting is not allowed)."""
    mnt = tmp_path / "disk"
    mnt.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(mnt)],
                          capture_output=True)
    if done.returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    """Write `path` until the disk is full (unbuffered: nothing is left to flush at close)."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * (1 << 16))
        except OSError:
            pass


@pytest.mark.e2e
def test_a_full_disk_interrupts_the_run_and_resume_finishes_it(tmp_path, tiny_disk):
    import sqlite3
    import sys

    from tests.conftest import make_sim_repo

    repo = tmp_path / "repo"
    shas = make_sim_repo(repo, [{}] * 5 + [{"verify_mult": 1.5}] * 3)
    runs = tiny_disk / "runs"
    args = [sys.executable, "-m", "orchestrator", "bisect", f"repo={repo}", f"runs_dir={runs}",
            f"good={shas[0]}", f"bad={shas[-1]}", "run_id=full", "metric=verify_ms",
            *[o for o in FAST if not o.startswith(("clock=", "trial.ready_timeout_s"))],
            "trial.ready_timeout_s=30"]
    db = runs / "full" / "trials.db"
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        before: dict[int, str] = {}
        while len(before) < 3:
            assert time.monotonic() < deadline and proc.poll() is None, proc.communicate()
            time.sleep(0.3)
            if db.exists():
                store = RunStore.open(db, readonly=True)
                before = {r.id: r.outcome.value for r in store.trials() if r.finished}
                store.close()
        _fill(tiny_disk / "filler")
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
    assert proc.returncode == 1, out[-2000:] + err[-2000:]
    errors = [ln for ln in err.splitlines() if ln.startswith("sleuth:")]
    assert len(errors) == 1 and "no space left on device" in errors[0], err[-3000:]
    assert "sleuth resume full" in errors[0] and "Traceback" not in err, err[-3000:]
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    assert conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    rows = dict(conn.execute("SELECT id, outcome FROM trials").fetchall())
    conn.close()
    assert None not in rows.values()  # every trial has an outcome ...
    assert all(rows[i] == before[i] for i in before)  # ... every finished one is kept as it was
    # The disk, not a candidate: nothing became untestable because of it.
    assert not {"prepare_failed", "launch_failed", "error"} & set(rows.values()), rows

    (tiny_disk / "filler").unlink()
    done = subprocess.run([sys.executable, "-m", "orchestrator", "resume", "full",
                           f"runs_dir={runs}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    doc = json.loads((runs / "full" / "findings.json").read_text())
    assert doc["findings"][0]["id"] == shas[5]


# --------------------------------------------------------------- Ctrl-C at a terminal


def _spawn_on_terminal(args: list[str], cwd: Path) -> tuple[subprocess.Popen, int]:
    """Start `args` as the foreground job of a new pseudo-terminal: a Ctrl-C typed there
    reaches its whole foreground process group, as at a real terminal."""
    import fcntl
    import pty
    import termios

    master, slave = pty.openpty()

    def controlling_terminal() -> None:  # runs in the child, a new session's leader
        fcntl.ioctl(slave, termios.TIOCSCTTY, 0)

    proc = subprocess.Popen(args, cwd=cwd, stdin=slave, stdout=slave, stderr=slave,
                            start_new_session=True, preexec_fn=controlling_terminal)
    os.close(slave)
    return proc, master


def _read_until(master: int, needle: bytes, timeout: float) -> bytes:
    import select

    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen:
        left = deadline - time.monotonic()
        assert left > 0, seen.decode(errors="replace")[-3000:]
        ready, _, _ = select.select([master], [], [], min(left, 1.0))
        if ready:
            try:
                seen += os.read(master, 65536)
            except OSError:  # the terminal closed: the process is gone
                break
    return seen


@pytest.mark.e2e
def test_a_double_ctrl_c_at_a_terminal_exits_130(tmp_path, sim_repo):
    import sys

    repo, shas = sim_repo
    args = [sys.executable, "-m", "orchestrator", "trial", f"repo={repo}",
            f"runs_dir={tmp_path / 'runs'}",
            *[o for o in FAST if not o.startswith(("bench.repetitions=", "bench.output_len="))],
            "bench.repetitions=40", "bench.output_len=64"]
    proc, master = _spawn_on_terminal(args, tmp_path)
    try:
        seen = _read_until(master, b"started on local-0", 120)
        time.sleep(1.0)
        os.write(master, b"\x03")  # what the terminal sends for Ctrl-C
        time.sleep(0.5)  # the second while the first is being acted on (the stop is under way)
        os.write(master, b"\x03")
        code = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        os.close(master)
    text = seen.decode(errors="replace")
    assert code == 130, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    (run,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    store = RunStore.open(run / "trials.db", readonly=True)
    assert store.status() == "interrupted"
    assert [r.outcome for r in store.trials()] == [Outcome.INTERRUPTED]


HOLDER = r"""
import fcntl, json, os, socket, sys, time
from orchestrator.util.process import start_time
node, controller = sys.argv[1], json.loads(sys.argv[2])
fd = os.open(os.path.join(node, "node.lock"), os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
with open(os.path.join(node, "holder.json"), "w") as f:
    json.dump({"pid": os.getpid(), "start_time": start_time(os.getpid()), "run_id": "old",
               "host": socket.gethostname(), "controller": controller}, f)
print("holding", flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("controller_alive", [True, False])
def test_a_node_held_by_an_orphan_is_taken_over(tmp_path, monkeypatch, controller_alive):
    """An actor whose controller was SIGKILLed still holds the node for a moment: a resumed run
    waits for it (and ends it if it lingers), while a live run's node is refused at once."""
    import socket
    import sys

    from orchestrator.runner import node as node_mod
    from orchestrator.util.process import start_time

    monkeypatch.setattr(node_mod, "ORPHAN_WAIT_S", 0.5)
    cfg = _cfg(tmp_path, tmp_path)
    node = tmp_path / "runs" / ".nodes" / "local-0"
    node.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    controller = ({"pid": os.getpid(), "start_time": start_time(os.getpid())} if controller_alive
                  else {"pid": gone.pid, "start_time": "1"})
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(node),
         json.dumps({**controller, "host": socket.gethostname()})],
        cwd=tmp_path, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        runner = node_mod.NodeRunner("local-0", str(node), as_dict(cfg.target),
                                     as_dict(cfg.bench), run_id="new")
        if controller_alive:
            assert runner.held_by["run_id"] == "old" and holder.poll() is None
        else:
            assert runner.held_by is None and holder.wait(timeout=10) == -9
            assert json.loads((node / "holder.json").read_text())["run_id"] == "new"
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


@pytest.mark.e2e
def test_a_node_lost_before_its_first_answer_is_one_line_and_a_resumable_run(tmp_path):
    """A node actor that dies while it starts (here its constructor fails: the node's state
    path is a file) was a 40-line Ray traceback and a `failed` run. Now: one line naming the
    node and why, the run kept `interrupted`, and `sleuth resume` finishes it once the node
    can start."""
    import sqlite3
    import sys

    from tests.conftest import make_sim_repo

    repo = tmp_path / "repo"
    shas = make_sim_repo(repo, [{}] * 3 + [{"verify_mult": 1.5}] * 2)
    runs = tmp_path / "runs"
    (runs / ".nodes").mkdir(parents=True)
    (runs / ".nodes" / "local-0").write_text("not a directory\n")
    args = [f"repo={repo}", f"runs_dir={runs}", f"good={shas[0]}", f"bad={shas[-1]}",
            "run_id=lost", "metric=verify_ms", "nodes=1",
            *[o for o in FAST if not o.startswith(("clock=", "trial.ready_timeout_s"))],
            "trial.ready_timeout_s=30"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-m", "orchestrator", "bisect", *args],
                          capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "File \"" not in done.stderr, done.stderr
    errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert len(errors) == 1, done.stderr
    line = errors[0]
    assert line.startswith("sleuth: error: node local-0 was lost before its first trial"), line
    assert "FileExistsError" in line and "run lost is interrupted" in line, line
    assert line.endswith("when the nodes are back, sleuth resume lost"), line
    with sqlite3.connect(f"file:{runs / 'lost' / 'trials.db'}?mode=ro", uri=True) as conn:
        assert conn.execute("SELECT status FROM runs").fetchone()[0] == "interrupted"
    (runs / ".nodes" / "local-0").unlink()
    again = subprocess.run([sys.executable, "-m", "orchestrator", "resume", "lost",
                            f"runs_dir={runs}"], capture_output=True, text=True, timeout=600,
                           env=env, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-2000:]
    assert shas[3][:10] in again.stdout
