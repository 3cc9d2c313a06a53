"""What differed between the environments a report compares (no drawing here).

Split from :mod:`orchestrator.ui.report.series`: the differences an experiment listed, the two
sides of the run, and every change of a node's system between two of its trials.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.records import Candidate
from orchestrator.store import TrialRow
from orchestrator.system import fingerprint_diff
from orchestrator.system.fingerprint import system_read
from orchestrator.system.fingerprint_diff import Difference
from orchestrator.system.watch import system_changes
from orchestrator.ui.report.collect import RunData
from orchestrator.ui.report.series import finding_candidates

# -- fingerprint diff ---------------------------------------------------------------------------

@dataclass(frozen=True)
class FingerprintDiff:
    """Ranked differences (most plausible cause first) between two trial environments."""

    title: str
    differences: tuple[Difference, ...]


def _fingerprinted(rows: Sequence[TrialRow], key: str | None = None) -> list[TrialRow]:
    return [r for r in rows if r.result and system_read(r.result.fingerprint)
            and (key is None or r.candidate.key == key)]


def fingerprint_sides(data: RunData) -> tuple[Candidate, Candidate] | None:
    """Which two candidates to diff: a bisect's endpoints, else the top finding's pair, else the
    first and the last candidate the run fingerprinted."""
    if data.plan:
        return data.plan.candidates[0], data.plan.candidates[-1]
    for f in data.ranked.get("findings", [])[:1]:
        cands = finding_candidates(data, f)
        if cands:
            return cands
    seen = list({r.candidate.key: r.candidate for r in _fingerprinted(data.rows)}.values())
    return (seen[0], seen[-1]) if len(seen) >= 2 else None


_DIFFERENCE_FIELDS = ("category", "key", "reference", "now", "detail", "controllable")


def _reported(data: RunData) -> list[FingerprintDiff]:
    """Differences an experiment already listed: compare's reference run vs now (its document's
    `differences`, or the `difference` of each finding)."""
    out = []
    for doc in data.docs:
        if doc.get("experiment") != "compare":
            continue
        listed = doc.get("differences") or [f.get("difference") for f in doc.get("findings", [])]
        diffs = [Difference(**{k: v for k, v in d.items() if k in _DIFFERENCE_FIELDS})
                 for d in listed if isinstance(d, Mapping) and {"category", "key"} <= d.keys()]
        if diffs:
            name = (doc.get("reference") or {}).get("name", "reference")
            out.append(FingerprintDiff(f"compare: {name} vs now", tuple(diffs)))
    return out


def fingerprint_diffs(data: RunData) -> list[FingerprintDiff]:
    """What differed between the environments the report compares.

    Views, each only when it has something to say: what an experiment listed itself, the two
    sides of the run (bisect endpoints or the top finding's pair), and every change of a node's
    settled system state between two of its trials (:mod:`orchestrator.system.watch`): the drift
    that turns "same code" into a different result, the seed's situation.
    """
    out = _reported(data)
    sides = fingerprint_sides(data)
    if sides:
        before, after = (_fingerprinted(data.rows, c.key) for c in sides)
        if before and after:
            diffs = fingerprint_diff.diff(before[0].result.fingerprint,
                                          after[-1].result.fingerprint)
            if diffs:
                out.append(FingerprintDiff(f"{sides[0].label} vs {sides[1].label}", tuple(diffs)))
    for change in system_changes(data.rows):
        out.append(FingerprintDiff(f"during the run, on {change.node}: trial {change.before} vs"
                                   f" trial {change.after}", change.differences))
    return out
