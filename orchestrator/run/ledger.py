"""One ledger of measurements per run: a restart counts for every step that needs its
configuration on the same system epoch.

The store is the ledger: every trial row is a candidate's measurement, whichever step ran it
(a lifetime that measured several candidates is one block row each:
:mod:`orchestrator.run.blocks`). Every reader takes a candidate's trials by its key from
all of the run's rows, so the compare's restarts of the reference's configuration are the
isolate's "now" side and the bisect's good end, the isolate's and the bisect's are the final
check's terms, and no step measures again what another already measured. Restarts from before
a change of the node's system (:mod:`orchestrator.system.watch`) are another epoch: never
pooled with the new state's, which is measured again.

This module says so as it happens: which earlier steps' restarts a step starts from (on the
latest epoch), and what each step spent, counting restarts (not block rows).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from orchestrator.records import NOT_EVIDENCE_PHASES
from orchestrator.run.blocks import lifetime_of
from orchestrator.store import TrialRow
from orchestrator.system.watch import latest_epoch


def step_of(row_id: int, marks: Mapping[str, int]) -> str:
    """The step a trial ran in: the last step whose first trial id is at most its id."""
    found = ""
    for step, first in sorted(marks.items(), key=lambda kv: kv[1]):
        if first <= row_id:
            found = step
    return found or "before"


def spent(rows: Sequence[TrialRow], marks: Mapping[str, int]) -> Counter:
    """Restarts per step (a lifetime once, its block rows not at all)."""
    out: Counter = Counter()
    for r in rows:
        if r.result is not None and lifetime_of(r.result.fingerprint) is not None:
            continue
        out[r.phase if r.phase in ("final", "kernels") else step_of(r.id, marks)] += 1
    return out


def reused(rows: Sequence[TrialRow], keys: Iterable[str], marks: Mapping[str, int],
           step: str) -> Counter:
    """Measured restarts of these candidates, by the earlier step that ran them, on the
    latest system epoch: what `step` starts from without a restart of its own."""
    first = marks.get(step)
    keys = set(keys)
    out: Counter = Counter()
    for r in latest_epoch(list(rows)):
        if (r.candidate.key in keys and r.outcome is not None and r.outcome.measured
                and r.phase not in NOT_EVIDENCE_PHASES and (first is None or r.id < first)):
            out[step_of(r.id, marks)] += 1
    return out


def reuse_line(rows: Sequence[TrialRow], keys: Iterable[str], marks: Mapping[str, int],
               step: str, what: str) -> str | None:
    """`ledger: the bisect starts from 15 measurements of its good end (compare 3, isolate
    12)`, or None when nothing is reused."""
    found = reused(rows, keys, marks, step)
    if not found:
        return None
    parts = ", ".join(f"{s} {n}" for s, n in found.items())
    return (f"ledger: the {step} starts from {sum(found.values())} measurement(s) of {what}"
            f" already made on this system ({parts})")
