"""Whose are the processes NVML lists on a trial's GPUs? The server's own, across PID namespaces.

A trial is suspect when a foreign process runs on its GPUs, so the trial's own server must be
recognised among the processes NVML lists. NVML's process ids are the driver's: the host's PID
namespace on the drivers most nodes run (NVIDIA's container toolkit issue #1483, "the driver
does not support pid-namespaces"; newer open kernel modules translate them into the caller's
namespace). In a container, the usual way SGLang is deployed, the server's pids as sleuth sees
them (`/proc` of the container) are not the ones NVML lists, and without this module every
trial's own server counted as foreign: every trial suspect.

How a listed pid is told apart, without privileges:

- **the same pid**: a pid of the server's group (a translating driver, a node on the host, or a
  container sharing the host's namespace);
- **through `NSpid`**: `/proc/<pid>/status` lists a process's pid in every PID namespace from
  the one its procfs belongs to down to its own. Where a procfs of an outer namespace is
  readable (the host's `/proc` mounted into the container at `/host/proc`, read-only, as
  monitoring agents do; or sleuth on the host with the server in a namespace of its own), a
  listed pid whose innermost `NSpid` entry is one of the server's pids, and whose start time
  (`/proc/<pid>/stat` field 22, clock ticks since boot: the same in every namespace) is that
  process's, is the server's. The start time rules out another container's process that
  happens to have the same pid inside its own namespace;
- **unattributed**: in a nested namespace with no outer procfs, a listed pid that does not
  exist here cannot be attributed either way. It is recorded, and the trial is suspect only
  when there are more such processes than the server has (some of them cannot be its own).
  `doctor` and docs/gpu.md say how to make them attributable.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

# The initial PID namespace's inode (`PROC_PID_INIT_INO` in the kernel, a constant).
INIT_PID_NS = "pid:[4026531836]"
# Where a container may see the host's procfs (read-only bind mount), by convention.
HOST_PROC = Path("/host/proc")


@dataclass(frozen=True)
class ProcView:
    """One procfs (`/proc`, or an outer namespace's mounted elsewhere), read as files, so a
    test can hand it a tree of its own."""

    root: Path = Path("/proc")

    def _read(self, pid: int | str, name: str) -> str | None:
        try:
            return (self.root / str(pid) / name).read_text(errors="replace")
        except OSError:
            return None

    def exists(self, pid: int) -> bool:
        return (self.root / str(pid)).is_dir()

    def nspids(self, pid: int) -> tuple[int, ...]:
        """The process's pid in each namespace, outermost (this procfs's) first; `(pid,)` on a
        kernel without `NSpid` (before 4.1)."""
        for line in (self._read(pid, "status") or "").splitlines():
            if line.startswith("NSpid:"):
                try:
                    return tuple(int(x) for x in line.split()[1:])
                except ValueError:
                    break
        return (pid,) if self.exists(pid) else ()

    def start_time(self, pid: int) -> int | None:
        stat = self._read(pid, "stat")
        if not stat:
            return None
        try:
            return int(stat[stat.rindex(")") + 2:].split()[19])
        except (ValueError, IndexError):
            return None

    def pid_namespace(self) -> str | None:
        try:
            return os.readlink(self.root / "self" / "ns" / "pid")
        except OSError:
            return None

    def nested(self) -> bool:
        """This procfs belongs to a PID namespace other than the initial one (a container)."""
        ns = self.pid_namespace()
        return ns is not None and ns != INIT_PID_NS


class PidResolver:
    """Splits the pids NVML lists into the server's, foreign ones and unattributed ones."""

    def __init__(self, here: ProcView | None = None, outer: ProcView | None = None):
        self.here = here or ProcView()
        if outer is None and self.here.root == Path("/proc") and HOST_PROC.is_dir():
            outer = ProcView(HOST_PROC)
        self.outer = outer
        self._nested = self.here.nested()

    def own_ids(self, pids: Iterable[int]) -> set[int]:
        """The server's pids in every namespace this procfs shows (its `NSpid` entries)."""
        out: set[int] = set()
        for pid in pids:
            out.add(int(pid))
            out.update(self.here.nspids(int(pid)))
        return out

    def split(self, listed: Iterable[int], own: Collection[int],
              ) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(foreign, unattributed) among `listed` pids that are not in `own` (as given by
        `own_ids`)."""
        starts: dict[int, int | None] = {}
        foreign, unknown = [], []
        for pid in listed:
            if pid in own:
                continue
            if self.outer is not None and self._outer_is_own(pid, own, starts):
                continue
            if self._nested and self.outer is None and not self.here.exists(pid):
                unknown.append(pid)  # another namespace's pid, and nothing to map it through
            else:
                foreign.append(pid)
        return tuple(foreign), tuple(unknown)

    def _outer_is_own(self, pid: int, own: Collection[int], starts: dict) -> bool:
        ids = self.outer.nspids(pid)
        if not ids or ids[-1] not in own:
            return False
        inner = ids[-1]
        if inner not in starts:
            starts[inner] = self.here.start_time(inner)
        mine = starts[inner]
        return mine is not None and self.outer.start_time(pid) == mine
