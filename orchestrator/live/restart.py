"""Stopping the running server, and leaving the node as it was found.

`stop` sends SIGTERM to the server and its workers (its process group when it leads one, as a
launcher-started server does; else the process and its descendants), waits up to the grace
period, then SIGKILLs what is left, and checks that nothing of it remains and its port is free.
`relaunch` starts the original command again, exactly as it was (argv, working directory, the
whole environment), detached in a session of its own so it outlives sleuth, its output
appended to the log file the original wrote to (when that was a file), and waits until it
answers again. Only a server on this machine whose process sleuth could read is ever touched.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

import httpx

from orchestrator.live import proc
from orchestrator.live.attach import LiveServer
from orchestrator.util.process import port_in_use


@dataclass(frozen=True)
class Stopped:
    """How the running server ended."""

    signal_used: str  # SIGTERM | SIGKILL
    clean: bool  # nothing of it left, its port free
    detail: str = ""


def _alive(pids: list[int]) -> list[int]:
    out = []
    for pid in pids:
        fields = None
        try:
            fields = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        state = fields[fields.rfind(")") + 2:].split()[0]
        if state != "Z":
            out.append(pid)
    return out


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            continue


def stop(server: LiveServer, grace_s: float) -> Stopped:
    """SIGTERM the server and its workers, SIGKILL what remains after `grace_s`."""
    assert server.pid is not None
    pids = [server.pid, *proc.descendants(server.pid)]
    group = proc.process_group(server.pid)
    used = "SIGTERM"
    if group == server.pid:  # a group leader: every worker is in its group
        try:
            os.killpg(group, signal.SIGTERM)
        except ProcessLookupError:
            pass
    _signal(pids, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while _alive(pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    left = _alive(pids)
    if left:
        used = "SIGKILL"
        _signal(left, signal.SIGKILL)
        deadline = time.monotonic() + 10.0
        while _alive(left) and time.monotonic() < deadline:
            time.sleep(0.05)
    parsed = urlparse(server.url)
    host, port = parsed.hostname or "127.0.0.1", int(parsed.port or 80)
    deadline = time.monotonic() + 10.0
    while port_in_use(host, port) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _alive(pids)
    free = not port_in_use(host, port)
    detail = "" if not left and free else (f"left: pids {left}" if left else "") + \
        ("" if free else f" port {port} still in use")
    return Stopped(used, not left and free, detail.strip())


@dataclass(frozen=True)
class Relaunched:
    """The original command, running again (or why not)."""

    pid: int | None
    ready: bool
    detail: str


def relaunch(server: LiveServer, ready_timeout_s: float) -> Relaunched:
    """Start the original command again, detached, and wait for it to answer."""
    if not server.restartable:
        return Relaunched(None, False, "its command could not be read")
    log = server.log_path
    try:
        out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - closed below
    except OSError:
        out = subprocess.DEVNULL
    try:
        popen = subprocess.Popen(list(server.argv), cwd=server.cwd, env=dict(server.env),
                                 stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
    except OSError as exc:
        return Relaunched(None, False, f"the original command did not start: {exc}")
    finally:
        if out is not subprocess.DEVNULL:
            out.close()
    deadline = time.monotonic() + ready_timeout_s
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            return Relaunched(popen.pid, False, f"the relaunched server exited"
                              f" ({popen.returncode}); see {log or 'its output'}")
        try:
            if httpx.get(f"{server.url}/health", timeout=2.0).status_code == 200:
                return Relaunched(popen.pid, True, "")
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    return Relaunched(popen.pid, False, f"relaunched (pid {popen.pid}) but not ready within"
                      f" {ready_timeout_s:.0f} s")
