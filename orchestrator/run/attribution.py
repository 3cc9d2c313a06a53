"""The attribution of an isolate's named causes, from its stored trials.

Gathers every measured configuration's values (log scale) by the subset of differences it
applies, and hands them to :func:`orchestrator.answer.attribution.attribute`: each cause's
"restore this alone", "restore all", its share, and how causes overlap or interact.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

from orchestrator.answer import text as T
from orchestrator.answer.attribution import attribute
from orchestrator.answer.compose import cause_label
from orchestrator.records import NOT_EVIDENCE_PHASES, Candidate
from orchestrator.store import TrialRow


def subset_values(rows: Sequence[TrialRow], point_of: Callable[[Candidate], int | None],
                  subset: Callable[[int], frozenset[int]], metric: str
                  ) -> dict[frozenset[int], list[float]]:
    """Log values of `metric` per configuration (its subset of differences); suspect,
    failed and reference trials left out, as the strategy leaves them out."""
    values: dict[frozenset[int], list[float]] = {}
    for r in rows:
        if (r.outcome is None or not r.outcome.measured or r.suspect or r.result is None
                or r.phase in NOT_EVIDENCE_PHASES):
            continue
        v = r.result.value(metric)
        point = point_of(r.candidate)
        if v is None or not v > 0 or not math.isfinite(v) or point is None:
            continue
        values.setdefault(subset(point), []).append(math.log(v))
    return values


def isolate_attribution(rows: Sequence[TrialRow], point_of: Callable[[Candidate], int | None],
                        subset: Callable[[int], frozenset[int]], changes: Sequence,
                        culprits: Sequence, items: Sequence[dict], metric: str) -> dict | None:
    """The attribution document of an isolate's findings (`items`, in the order of
    `culprits` sorted by probability), or None without a cause or the configurations."""
    ordered = sorted(culprits, key=lambda c: -c.probability)
    if not ordered or len(ordered) != len(items):
        return None
    values = subset_values(rows, point_of, subset, metric)
    players = [frozenset(c.differences) for c in ordered]
    members = [(i, T.change_label(changes[i].label)) for p in players if len(p) > 1
               for i in sorted(p)]
    doc = attribute(players, values, [cause_label(item) for item in items],
                    bad=frozenset(range(len(changes))), members=members,
                    paired=paired_game(rows, point_of, subset, players, metric))
    if doc is not None:
        for cause, item in zip(doc["causes"], items, strict=True):
            cause["id"] = item["id"]
    return doc


def paired_game(rows: Sequence[TrialRow], point_of: Callable[[Candidate], int | None],
                subset: Callable[[int], frozenset[int]], players: Sequence[frozenset[int]],
                metric: str):
    """The split-plot contrast over the attribution's game (subsets of the named causes), when
    some lifetime measured more than one of its configurations (a cause set on the running
    server: :mod:`orchestrator.run.paired`); None otherwise."""
    from orchestrator.run.blocks import lifetime_of
    from orchestrator.stats.lifetimes import Cell, SplitPlot, components, kept

    union = frozenset().union(*players)
    found: dict[int, dict[frozenset[int], Cell]] = {}
    for r in rows:
        if (r.outcome is None or not r.outcome.measured or r.suspect or r.result is None
                or r.phase in NOT_EVIDENCE_PHASES):
            continue
        v, point = r.result.value(metric), point_of(r.candidate)
        if v is None or not v > 0 or not math.isfinite(v) or point is None:
            continue
        present = subset(point) & union
        if any(0 < len(p & present) < len(p) for p in players):
            continue
        key = frozenset(i for i, p in enumerate(players) if p <= present)
        lifetime = lifetime_of(r.result.fingerprint)
        cells = found.setdefault(lifetime if lifetime is not None else -r.id, {})
        if key in cells:  # two configurations of one game point in one lifetime: keep one
            continue
        logs = [math.log(x) for x in r.result.values(metric) if x > 0]
        spread = statistics.variance(logs) if len(logs) > 1 else None
        cells[key] = Cell(math.log(v), spread, len(logs))
    if not any(len(c) > 1 for c in found.values()):
        return None
    found, values = kept(found)
    return SplitPlot(found, components(found, values)).contrast
