"""Server processes: launch in their own process group, tear down, and prove they are gone.

Why process groups: a real SGLang server forks tensor-parallel workers; killing only the
launcher would leave workers holding GPU memory and the port, and the next trial would measure
a contended GPU. Every server is started as the leader of a new session (`start_new_session`),
teardown signals the whole group, and `verify_gone` checks the process table and the port.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    """A port that nothing listens on right now (the kernel picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def port_in_use(host: str, port: int) -> bool:
    """True when something accepts connections or holds the port bound.

    Connections the server closed first linger in TIME_WAIT on its port for a minute; they hold
    nothing (a new server binds with SO_REUSEADDR, as uvicorn does), so the bind probe sets
    SO_REUSEADDR too and only a live socket counts."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        if s.connect_ex((host, port)) == 0:
            return True
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            return exc.errno == errno.EADDRINUSE
    return False


def group_exists(pgid: int) -> bool:
    """Whether any process (a zombie too) is in group `pgid`: one signal-0 system call.

    The kernel answers ESRCH for a group nobody is in; that is the common case (a server or
    bench that has exited and been reaped) and costs nothing like a scan of /proc."""
    if pgid <= 0:
        return False
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process is in it: it exists
    return True


def _stat_fields(pid: str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the parenthesised command name, or None."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
    except OSError:
        return None
    try:
        stat = os.read(fd, 1024)
    except OSError:
        return None
    finally:
        os.close(fd)
    return stat[stat.rfind(b")") + 2:].split()


def group_members(pgid: int) -> list[int]:
    """PIDs whose process group is `pgid` (from /proc; zombies excluded: they hold nothing).

    An empty group (the usual answer once a server is gone) is known from one system call; only
    a group with someone in it needs the scan of every process's `stat`."""
    if not group_exists(pgid):
        return []
    want = str(pgid).encode()
    members = []
    with os.scandir("/proc") as it:
        for entry in it:
            if not entry.name.isdigit():
                continue
            # Fields after the command name: state ppid pgrp ...
            fields = _stat_fields(entry.name)
            if fields and len(fields) >= 3 and fields[2] == want and fields[0] != b"Z":
                members.append(int(entry.name))
    return members


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, from /proc): with the pid, it tells a
    process from a later one that reused its pid. None when there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def read_environ(pid: int) -> dict[str, str]:
    """The environment a process was started with, from /proc/<pid>/environ."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env = {}
    for item in raw.split(b"\0"):
        if b"=" in item:
            key, _, value = item.partition(b"=")
            env[key.decode(errors="replace")] = value.decode(errors="replace")
    return env


@dataclass(frozen=True)
class TeardownReport:
    """What teardown found: `clean` only if no group member is left and the port is free."""

    pgid: int
    exit_code: int | None
    signal_used: str  # "none" (already exited) | "SIGTERM" | "SIGKILL"
    leftover_pids: tuple[int, ...]
    port_free: bool

    @property
    def clean(self) -> bool:
        return not self.leftover_pids and self.port_free


class ServerProcess:
    """A live server process group. Owned by exactly one trial."""

    def __init__(self, popen: subprocess.Popen, host: str, port: int, log_path: Path):
        self.popen = popen
        self.host = host
        self.port = port
        self.log_path = log_path
        self.pgid = popen.pid  # session leader: its pid is the group id

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def poll(self) -> int | None:
        return self.popen.poll()

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _signal_group(self, sig: int) -> bool:
        try:
            os.killpg(self.pgid, sig)
            return True
        except ProcessLookupError:
            return False

    def _wait_group(self, deadline: float) -> bool:
        delay = 0.002  # a server that exits on SIGTERM is usually gone within milliseconds
        while time.monotonic() < deadline:
            self.popen.poll()  # reap the leader so it does not linger as a zombie
            if not group_members(self.pgid):
                return True
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
        self.popen.poll()
        return not group_members(self.pgid)

    def teardown(self, grace_s: float = 10.0, port_wait_s: float = 5.0) -> TeardownReport:
        """SIGTERM the group, SIGKILL what remains after `grace_s`, then verify it is gone."""
        used = "none"
        if group_members(self.pgid):
            used = "SIGTERM"
            self._signal_group(signal.SIGTERM)
            if not self._wait_group(time.monotonic() + grace_s):
                used = "SIGKILL"
                self._signal_group(signal.SIGKILL)
                self._wait_group(time.monotonic() + 5.0)
        try:
            code = self.popen.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            code = None
        deadline = time.monotonic() + port_wait_s
        port_free = not port_in_use(self.host, self.port)
        while not port_free and time.monotonic() < deadline:
            time.sleep(0.1)
            port_free = not port_in_use(self.host, self.port)
        return TeardownReport(self.pgid, code, used, tuple(group_members(self.pgid)), port_free)


_PR_SET_PDEATHSIG = 1
try:  # resolved once in the parent: the child must not load libraries between fork and exec
    _LIBC = ctypes.CDLL(None, use_errno=True)
except OSError:  # pragma: no cover
    _LIBC = None


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask the kernel to SIGKILL the server when the process that launched it dies, so a
    SIGKILLed controller or node actor cannot leave a server holding the GPUs."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL))


@functools.cache
def _setpriv() -> str | None:
    """util-linux's `setpriv`, if it is here and can set the parent-death signal (2.33+)."""
    path = shutil.which("setpriv")
    if path is None:
        return None
    try:
        ok = subprocess.run([path, "--pdeathsig", "KILL", "--", "true"], capture_output=True,
                            timeout=10).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return path if ok else None


def _executable(argv: Sequence[str], cwd: Path | str, env: Mapping[str, str]) -> bool:
    """Whether argv[0] names an executable the way `Popen` would find it (cwd, env's PATH)."""
    if not argv:
        return False
    prog = str(argv[0])
    if os.sep in prog:
        return os.access(os.path.join(cwd, prog), os.X_OK)
    return shutil.which(prog, path=os.pathsep.join(os.get_exec_path(env))) is not None


def dying_with_parent(argv: Sequence[str], cwd: Path | str, env: Mapping[str, str]
                      ) -> tuple[list[str], Callable[[], None] | None]:
    """(argv, preexec_fn) for a child that the kernel SIGKILLs when its launcher dies.

    Through `setpriv --pdeathsig KILL` when it is installed: the child then starts by vfork and
    exec. A `preexec_fn` (the fallback) makes Python fork the whole launcher instead, and a Ray
    worker, with its threads and its address space, takes 10-20 ms to fork where a vfork takes
    under 1: on a 10 ms bench that was the largest part of sleuth's cost per repetition. Either
    way the server dies with the thread that launched it, as before. A command that cannot be
    executed is not wrapped, so `Popen` still raises for it as it always did."""
    setpriv = _setpriv()
    if setpriv is not None and _executable(argv, cwd, env):
        return [setpriv, "--pdeathsig", "KILL", "--", *map(str, argv)], None
    return list(argv), _die_with_parent


def launch(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    log_path: Path,
    host: str,
    port: int,
) -> ServerProcess:
    """Start `argv` (a list: never a shell string) as a new process group, output to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    argv, preexec = dying_with_parent(argv, cwd, env)
    with open(log_path, "ab") as log:
        popen = subprocess.Popen(
            argv,
            cwd=cwd,
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=preexec,
        )
    return ServerProcess(popen, host, port, log_path)
