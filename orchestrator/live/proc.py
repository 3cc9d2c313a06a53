"""What /proc says of a running process (Linux): the facts a live server is read from.

Everything here reads; nothing signals or writes. A process of another user refuses some of it
(its environment, its file descriptors): the caller says so in one line.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Iterable
from pathlib import Path

_LISTEN = "0A"  # TCP state LISTEN in /proc/net/tcp


def exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").is_dir()


def cmdline(pid: int) -> list[str]:
    """The process's argv as it was started (after any exec: a wrapper that execs the server
    leaves the server's argv)."""
    raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]



def cwd(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/cwd")
    except OSError:
        return None


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2:].split()


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields and len(fields) > 1 else None


def process_group(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[2]) if fields and len(fields) > 2 else None


def started_at(pid: int) -> float | None:
    """When the process started (epoch seconds): its start time in clock ticks since boot
    (`/proc/<pid>/stat`, field 22) after the boot time (`btime` in /proc/stat)."""
    fields = _stat(pid)
    if not fields or len(fields) < 20:
        return None
    try:
        ticks = int(fields[19])
        boot = next(int(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines()
                    if line.startswith("btime "))
    except (OSError, StopIteration, ValueError):
        return None
    return boot + ticks / os.sysconf("SC_CLK_TCK")


def descendants(pid: int) -> list[int]:
    """The process's children, their children, ... (a server's workers), from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        ppid = parent(int(entry.name))
        if ppid is not None:
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], list(children.get(pid, []))
    while todo:
        p = todo.pop()
        out.append(p)
        todo += children.get(p, [])
    return sorted(out)


def rss_bytes(pids: Iterable[int]) -> int | None:
    """Resident memory of the processes together (VmRSS), None when none could be read."""
    total, seen = 0, False
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
                    seen = True
                    break
        except (OSError, ValueError):
            continue
    return total if seen else None


def _socket_inodes(pid: int) -> set[str]:
    out = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                out.add(target[8:-1])
    except OSError:
        pass
    return out


def _listening() -> dict[str, int]:
    """inode -> port of every listening TCP socket (IPv4 and IPv6)."""
    found = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            parts = line.split()
            if len(parts) > 9 and parts[3] == _LISTEN:
                found[parts[9]] = int(parts[1].rsplit(":", 1)[1], 16)
    return found


def listening_ports(pids: Iterable[int]) -> list[int]:
    """The TCP ports the processes listen on."""
    listening = _listening()
    ports = {listening[i] for pid in pids for i in _socket_inodes(pid) if i in listening}
    return sorted(ports)


def pid_on_port(port: int) -> int | None:
    """The process listening on `port` on this machine (the lowest pid of those that do: the
    parent of forked workers), None when none is found (or none readable)."""
    inodes = {i for i, p in _listening().items() if p == port}
    if not inodes:
        return None
    owners = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _socket_inodes(int(entry.name)) & inodes:
            owners.append(int(entry.name))
    return min(owners) if owners else None


def output_file(pid: int) -> str | None:
    """The regular file the process writes its stderr (else stdout) to: its log, when it was
    started with its output redirected to one."""
    for fd in (2, 1):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/") and Path(target).is_file():
            return target
    return None


def is_local(host: str) -> bool:
    """Whether `host` is this machine (loopback, its name, or one of its addresses)."""
    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", "::", socket.gethostname()):
        return True
    try:
        addresses = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None)}
        return host in addresses or host.startswith("127.")
    except OSError:
        return host.startswith("127.")


def uptime_text(seconds: float | None) -> str:
    """`3 d 4 h`, `2 h 5 min`, `41 s`."""
    if seconds is None:
        return "an unknown time"
    seconds = max(0.0, seconds)
    if seconds >= 86400:
        return f"{int(seconds // 86400)} d {int(seconds % 86400 // 3600)} h"
    if seconds >= 3600:
        return f"{int(seconds // 3600)} h {int(seconds % 3600 // 60)} min"
    if seconds >= 60:
        return f"{int(seconds // 60)} min {int(seconds % 60)} s"
    return f"{seconds:.0f} s"


def now() -> float:
    return time.time()
