"""Process-group launch and teardown with real processes."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from orchestrator.util import process
from orchestrator.util.process import (
    free_port,
    group_exists,
    group_members,
    launch,
    port_in_use,
    read_environ,
)

# A "server" that forks a worker (like tensor-parallel ranks), listens, and ignores SIGTERM when
# asked to, so teardown has to escalate to SIGKILL.
SERVER = r"""
import os, signal, socket, sys, time
if sys.argv[2] == "stubborn":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() == 0:
    if sys.argv[2] == "stubborn":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
    os._exit(0)
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen()
print("listening", flush=True)
time.sleep(600)
"""


def _start(tmp_path, mode):
    port = free_port()
    proc = launch([sys.executable, "-c", SERVER, str(port), mode], cwd=tmp_path,
                  env={"SLEUTH_TEST_VAR": "42", "PATH": "/usr/bin:/bin"},
                  log_path=tmp_path / "server.log", host="127.0.0.1", port=port)
    deadline = time.monotonic() + 10
    while not port_in_use("127.0.0.1", port):
        assert time.monotonic() < deadline, "test server did not listen"
        time.sleep(0.05)
    return proc


def test_polite_server_torn_down_with_sigterm(tmp_path):
    proc = _start(tmp_path, "polite")
    assert len(group_members(proc.pgid)) == 2  # leader + forked worker
    assert read_environ(proc.pid)["SLEUTH_TEST_VAR"] == "42"
    report = proc.teardown(grace_s=5)
    assert report.signal_used == "SIGTERM"
    assert report.clean and not group_members(proc.pgid)
    assert "listening" in (tmp_path / "server.log").read_text()


def test_stubborn_group_killed_after_grace(tmp_path):
    proc = _start(tmp_path, "stubborn")
    report = proc.teardown(grace_s=0.5)
    # SIGKILL used is the proof that the grace ran out and was not waited past: a group that
    # ignores SIGTERM would otherwise still be there (no wall-clock bound, as on a busy host)
    assert report.signal_used == "SIGKILL"
    assert report.clean
    assert not port_in_use("127.0.0.1", proc.port)


def test_port_in_use_sees_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use("127.0.0.1", s.getsockname()[1])
    assert not port_in_use("127.0.0.1", free_port())


def test_group_members_answers_an_empty_group_without_a_scan(monkeypatch, tmp_path):
    proc = _start(tmp_path, "polite")
    members = group_members(proc.pgid)
    assert proc.pid in members and len(members) == 2  # the server and its forked worker
    proc.teardown(grace_s=5)
    assert group_members(proc.pgid) == []  # (an orphaned zombie worker may keep the scan)

    proc = launch(["sleep", "600"], cwd=tmp_path, env={"PATH": "/usr/bin:/bin"},
                  log_path=tmp_path / "sleep.log", host="127.0.0.1", port=free_port())
    assert group_members(proc.pgid) == [proc.pid]
    assert proc.teardown(grace_s=5).clean

    def no_scan(*_a, **_k):
        raise AssertionError("an empty group needs no scan of /proc")

    monkeypatch.setattr(process.os, "scandir", no_scan)
    assert group_members(proc.pgid) == []
    assert not group_exists(proc.pgid)


# Launches `sleep` through `launch` (as a node does), prints its pid, then waits to be killed.
LAUNCHER = r"""
import sys
from pathlib import Path
from orchestrator.util import process
if sys.argv[1] == "fallback":
    process._setpriv.cache_clear()
    process._setpriv = lambda: None
proc = process.launch(["sleep", "600"], cwd=Path("."), env={"PATH": "/usr/bin:/bin"},
                      log_path=Path(sys.argv[2]), host="127.0.0.1", port=1)
print(proc.pid, flush=True)
sys.stdin.read()
"""


@pytest.mark.parametrize("how", ["setpriv", "fallback"])
def test_a_server_dies_with_the_process_that_launched_it(tmp_path, how):
    if how == "setpriv" and process._setpriv() is None:
        pytest.skip("util-linux setpriv with --pdeathsig is not installed")
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, how, str(tmp_path / "log")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    server = int(launcher.stdout.readline())
    assert process.start_time(server) is not None
    time.sleep(0.2)  # the server is past its exec
    launcher.kill()  # SIGKILL: no cleanup code runs in the launcher
    launcher.wait()
    deadline = time.monotonic() + 10
    while process.group_members(server) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.group_members(server) == []


def test_the_death_signal_wrapper_leaves_an_unrunnable_command_to_popen(tmp_path):
    argv, preexec = process.dying_with_parent(["./no-such-bench"], tmp_path, {"PATH": "/bin"})
    assert argv == ["./no-such-bench"] and preexec is not None
    with pytest.raises(FileNotFoundError):
        launch(["./no-such-bench"], cwd=tmp_path, env={"PATH": "/bin"},
               log_path=tmp_path / "log", host="127.0.0.1", port=1)
    if process._setpriv() is not None:
        argv, preexec = process.dying_with_parent(["sleep", "1"], tmp_path, {"PATH": "/bin"})
        assert argv[:4] == [process._setpriv(), "--pdeathsig", "KILL", "--"]
        assert argv[4:] == ["sleep", "1"] and preexec is None
