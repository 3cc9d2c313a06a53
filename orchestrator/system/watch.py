"""Notice when a node's system state changes between the trials of one run.

Strategies compare trials of different candidates as if the node under them stayed the same:
a bisect reuses every finished trial of a commit, a resumed run reuses the trials of the day
before. If the driver was upgraded, the power limit lowered or a package reinstalled in between,
trials before and after measure different systems, and a posterior that mixes them can name
the wrong commit with high confidence. Telemetry marks a trial *suspect* when its GPUs change
*during* the trial; this watch compares each trial's fingerprint with the previous trial's on the
same node, so a change *between* trials (or across an interruption) is reported too.

Only settled state counts: driver, CUDA and NCCL versions, GPU model, memory, maximum clock,
persistence mode, uncorrected ECC errors, the power limit and clock locks (compared only between
trials that asked for the same clock policy, since a policy is a factor a trial sets), installed
packages (but not one either trial pinned: an overlay is a factor too), the kernel and the
interpreter. Readings that move on their own (the current PCIe
link generation drops at idle, foreign processes come and go, the boot id changes with a reboot
that changes nothing else) are left out: telemetry and the suspect mark cover those.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.records import NOT_EVIDENCE_PHASES
from orchestrator.store import TrialRow
from orchestrator.system.fingerprint import system_read
from orchestrator.system.fingerprint_diff import Difference, diff
from orchestrator.util.pins import canonical

# fingerprint_diff categories that describe the node rather than the candidate.
_SYSTEM_CATEGORIES = {"driver", "nccl", "clock", "gpu", "package", "kernel"}
# GPU readings that are None (or "") only when NVML could not read them: a gap, not a change.
# (An unset clock lock is None too, so `sm_clock_locked_mhz` is not among them.)
_READINGS = {"driver_version", "cuda_driver_version", "nccl_version", "power_limit_w",
             "applications_clock_sm_mhz", "sm_clock_max_mhz", "persistence_mode", "ecc_errors",
             "name", "memory_total_mib"}


@dataclass(frozen=True)
class SystemChange:
    """The node's state changed between trial ``before`` and trial ``after`` (store ids)."""

    node: str
    before: int
    after: int
    differences: tuple[Difference, ...]

    @property
    def summary(self) -> str:
        shown = "; ".join(d.label for d in self.differences[:4])
        more = len(self.differences) - 4
        return shown + (f"; and {more} more" if more > 0 else "")

    @property
    def message(self) -> str:
        return (f"the system on {self.node} changed between trials {self.before} and "
                f"{self.after} ({self.summary}): trials before and after measure different "
                "systems, and the answer assumes they do not")

    @property
    def warning(self) -> str:
        return f"warning: {self.message}"

    def to_json(self) -> dict:
        return {"node": self.node, "before_trial": self.before, "after_trial": self.after,
                "differences": [d.to_json() for d in self.differences],
                "summary": self.summary}


def _comparable(fingerprint: Mapping, with_gpu: bool) -> dict:
    """The settled system part of a fingerprint, in the shape :func:`diff` reads: of the host,
    only the kernel (the boot id and hostname say nothing about performance by themselves)."""
    host = fingerprint.get("host", {}) or {}
    return {
        "gpu": (fingerprint.get("gpu", {}) or {}) if with_gpu else {},
        "packages": fingerprint.get("packages", {}) or {},
        "host": {"kernel": host.get("kernel")},
    }


def _unread(difference: Difference) -> bool:
    return difference.key in _READINGS and (difference.reference in (None, "")
                                            or difference.now in (None, ""))


def system_differences(before: Mapping, after: Mapping) -> list[Difference]:
    """Settled system differences between two trial fingerprints of one node. GPU state is
    compared only when both trials could read it, field by field (a failed read is not a
    change)."""
    with_gpu = bool(before.get("gpu")) and bool(after.get("gpu"))
    out = [d for d in diff(_comparable(before, with_gpu), _comparable(after, with_gpu))
           if d.category in _SYSTEM_CATEGORIES and not _unread(d)]
    if before.get("python") and after.get("python") and before["python"] != after["python"]:
        out.append(Difference("package", "python", before["python"], after["python"]))
    return out


class SystemWatch:
    """Feed it finished trials in store order; it returns the changes it sees.

    A trial is compared with the last trial on the same node that asked for the same clock
    policy for clocks and power limits (a policy sets those on purpose), and with the last trial
    on the node for everything else. Trials without a read fingerprint are skipped: those that
    failed before the server was prepared have none, and one stopped between launch and the
    read (a full disk, Ctrl-C) keeps only what its teardown wrote, whose missing package listing
    would read as every package newly installed. Reference trials are skipped too: they measure
    the node as it was then on purpose, and no strategy takes them as evidence.
    """

    def __init__(self) -> None:
        self._last_with_policy: dict[tuple[str, str], tuple[int, Mapping]] = {}
        self._last_on_node: dict[str, tuple[int, Mapping, tuple[str, ...]]] = {}
        self.changes: list[SystemChange] = []

    def feed(self, row: TrialRow) -> SystemChange | None:
        result = row.result
        if (result is None or not system_read(result.fingerprint)
                or row.phase in NOT_EVIDENCE_PHASES):
            return None
        fingerprint = result.fingerprint
        key = (row.node, row.candidate.clock)
        previous = self._last_on_node.get(row.node)
        same_policy = self._last_with_policy.get(key)
        self._last_with_policy[key] = (row.id, fingerprint)
        self._last_on_node[row.node] = (row.id, fingerprint, tuple(row.candidate.package_dict))
        if previous is None:
            return None
        pinned = set(row.candidate.package_dict) | set(previous[2])
        found = [d for d in system_differences(previous[1], fingerprint) if d.category != "clock"
                 and not (d.category in ("package", "nccl") and canonical(d.key) in pinned)]
        before = previous[0]
        if same_policy is not None:
            clocks = [d for d in system_differences(same_policy[1], fingerprint)
                      if d.category == "clock"]
            if clocks and not found:
                before = same_policy[0]
            found += clocks
        if not found:
            return None
        change = SystemChange(row.node, before, row.id, tuple(found))
        self.changes.append(change)
        return change

    @classmethod
    def primed(cls, rows: Iterable[TrialRow]) -> SystemWatch:
        """A watch that has seen the finished ``rows`` (a run's stored trials, in store order):
        what it is fed next is compared with each node's last of them."""
        watch = cls()
        for row in rows:
            if row.finished:
                watch.feed(row)
        return watch


# The last run's changes (`system_changes` of one tuple of rows): a report asks for them
# from several views (the ranking, the fingerprint tables, the epochs of its posterior), and
# each pass diffs every trial's fingerprint against its node's previous one (about a second
# for 500 trials).
_LAST: list[tuple[tuple, list[SystemChange]]] = []


def system_changes(rows: Sequence[TrialRow]) -> list[SystemChange]:
    """Every change between consecutive finished trials of each node, in store order."""
    if isinstance(rows, tuple) and _LAST and _LAST[0][0] is rows:
        return list(_LAST[0][1])
    changes = SystemWatch.primed(rows).changes
    if isinstance(rows, tuple):  # immutable: the same tuple always has the same changes
        _LAST[:] = [(rows, changes)]
    return list(changes)


def epochs(rows: Sequence[TrialRow]) -> list[list[TrialRow]]:
    """The rows split by system epoch, oldest first (one list when no node changed): the
    epochs count the changes seen between consecutive trials, as the strategies number them
    (``orchestrator.control.drive.Epochs``)."""
    watch, out = SystemWatch(), [[]]
    for row in rows:
        if row.finished and watch.feed(row) is not None:
            out.append([])
        out[-1].append(row)
    return out


def latest_epoch(rows: Sequence[TrialRow]) -> list[TrialRow]:
    """The trials of the node's latest system epoch, all of them when no node changed, so an
    answer compares one system with itself."""
    return epochs(rows)[-1]
