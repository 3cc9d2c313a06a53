"""Process-group launch and teardown with real processes."""

from __future__ import annotations

import socket
import sys
import time

from orchestrator.runner.process import (
    free_port,
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
    t0 = time.monotonic()
    report = proc.teardown(grace_s=0.5)
    assert report.signal_used == "SIGKILL"
    assert report.clean
    assert time.monotonic() - t0 < 8
    assert not port_in_use("127.0.0.1", proc.port)


def test_port_in_use_sees_a_listener():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert port_in_use("127.0.0.1", s.getsockname()[1])
    assert not port_in_use("127.0.0.1", free_port())
