"""Kernel evidence after the answer: profile each named cause's two sides and diff them.

Runs on the controller (it submits trials; it never touches Ray itself). Each side gets
`evidence.restarts` server restarts, interleaved before/after so drift falls on both sides,
each a normal trial that takes a profile after its repetitions (phase `kernels`). A resumed
run reuses the profiled restarts it already has. The statistics are in `kernels.py`; this
module only gathers traces and hands them over.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from orchestrator.evidence import kernels as K
from orchestrator.evidence.plan import KERNELS_PHASE
from orchestrator.evidence.sides import restored_differences, sides, system_sides
from orchestrator.evidence.trace import PassProfile, TraceError, read_profile
from orchestrator.records import Candidate, Outcome


def _profile_of(row) -> PassProfile | None:
    if row.outcome is not Outcome.OK or row.result is None:
        return None
    prof = (row.result.fingerprint or {}).get("profile") or {}
    if not prof.get("trace"):
        return None
    path = Path(row.log_path).parent / str(prof["trace"])
    try:
        return read_profile(path.read_bytes(), source=str(row.id))
    except (OSError, TraceError):
        return None


def _run_sides(ctl, before: Candidate, after: Candidate, restarts: int
               ) -> tuple[list[PassProfile], list[PassProfile], list[int]]:
    """Profiles of each side: the stored ones first, then new restarts, interleaved, until each
    side has `restarts` profiles that are no outlier restarts (`kernels.outlier_restarts`), with
    at most `restarts` extra restarts a side for lost profiles and outliers."""
    got: dict[str, list[PassProfile]] = {before.key: [], after.key: []}
    ids: list[int] = []
    for row in ctl.store.trials():
        if row.phase == KERNELS_PHASE and row.candidate.key in got:
            p = _profile_of(row)
            if p is not None:
                got[row.candidate.key].append(p)
                ids.append(row.id)
    launched = {before.key: 0, after.key: 0}

    def missing(key: str) -> int:
        good = len(got[key]) - len(K.outlier_restarts(got[key]))
        return min(max(0, restarts - good), 2 * restarts - launched[key])

    while True:
        need = {c.key: missing(c.key) for c in (before, after)}
        if not any(need.values()):
            break
        queue = []
        for i in range(max(need.values())):
            queue += [c for c in (before, after) if i < need[c.key]]
        running = 0
        while queue or running:
            while queue and ctl.idle_nodes():
                cand = queue.pop(0)
                # one repetition: it warms the server up for the profile; the measurement it
                # gives is not what these restarts are for
                ctl.submit(cand, phase=KERNELS_PHASE, repetitions=1)
                launched[cand.key] += 1
                running += 1
            for row in ctl.wait():
                running -= 1
                p = _profile_of(row)
                if p is not None:
                    got[row.candidate.key].append(p)
                    ids.append(row.id)
    return got[before.key], got[after.key], ids


def _groups(causes: Sequence[Mapping], attribution: Mapping | None) -> list[list[Mapping]]:
    """The causes to profile, most probable first: one group per cause, except causes the
    attribution relates (they overlap, or hurt only together), which are one group of two,
    placed where the first of them stands."""
    ids = [str(c.get("id")) for c in (attribution or {}).get("causes", [])]
    paired: dict[str, str] = {}
    for rel in (attribution or {}).get("relations", []):
        pair = rel.get("causes") or []
        if len(pair) == 2 and rel.get("kind") in ("overlap", "synergy"):
            if max(pair) >= len(ids):
                continue
            a, b = ids[pair[0]], ids[pair[1]]
            if a not in paired and b not in paired:
                paired[a], paired[b] = b, a
    groups: list[list[Mapping]] = []
    seen: set[str] = set()
    for c in causes:
        cid = str(c.get("id"))
        if cid in seen:
            continue
        mate = next((m for m in causes if str(m.get("id")) == paired.get(cid)), None)
        group = [c] if mate is None else [c, mate]
        seen.update(str(m.get("id")) for m in group)
        groups.append(group)
    return groups


def _relation(attribution: Mapping | None, group: Sequence[Mapping]) -> Mapping:
    ids = [str(c.get("id")) for c in (attribution or {}).get("causes", [])]
    want = {str(c.get("id")) for c in group}
    for rel in (attribution or {}).get("relations", []):
        if {ids[i] for i in rel.get("causes", []) if i < len(ids)} == want:
            return rel
    return {}


def for_causes(ctl, causes: Sequence[Mapping], bad: Candidate, good: Candidate,
               docs: Sequence[Mapping | None], resolve: Callable[[str], str], *,
               restarts: int, max_causes: int, say: Callable[[str], None],
               attribution: Mapping | None = None) -> list[dict[str, Any]]:
    """One evidence entry per named cause (up to `max_causes` profiled sides, most probable
    first): its line, table and numbers. Causes that overlap or hurt only together share one
    entry (restore both vs. now); a cause past the limit gets a line that says so."""
    out = []
    restored = restored_differences(causes, docs)
    groups = _groups(causes, attribution)
    for n, group in enumerate(groups):
        labels = [str(c.get("label") or c.get("id")) for c in group]
        label = " + ".join(labels)
        entry: dict[str, Any] = {"cause": label, "kind": group[0].get("kind"),
                                 "id": group[0].get("id")}
        if len(group) > 1:
            rel = _relation(attribution, group)
            entry.update(ids=[c.get("id") for c in group], relation=rel.get("kind"),
                         relation_words=rel.get("words"))
        if n >= max_causes:
            entry["line"] = (f"kernels: not profiled (evidence.max_causes={max_causes}: the"
                             f" {max_causes} most probable were; evidence.max_causes="
                             f"{len(groups)} profiles this one too)")
            out.append(entry)
            continue
        if len(group) > 1:
            pair = system_sides(group, good, docs, resolve, restored)
            how = entry["relation_words"] or ("they overlap" if entry["relation"] == "overlap"
                                              else "they hurt more together than apart")
            entry["sides_rule"] = f"restore both vs. now ({how})"
        else:
            pair = sides(group[0], bad, good, docs, resolve, restored)
        if isinstance(pair, str):
            entry["line"] = f"kernels: not profiled ({pair})"
            out.append(entry)
            continue
        before, after = pair
        say(f"profiling {label}: {restarts} restarts of each side")
        pb, pa, ids = _run_sides(ctl, before, after, restarts)
        entry.update(before=before.label, after=after.label, trials=ids)
        if len(pb) < 2 or len(pa) < 2:
            entry["line"] = (f"kernels: too few profiles to compare ({len(pb)} before, "
                             f"{len(pa)} after; two a side needed)")
        else:
            d = K.diff(pb, pa)
            entry.update(K.to_json(d), table=K.table(d))
            if entry.get("sides_rule"):
                entry["line"] += f" (profiled together: {entry['sides_rule']})"
        out.append(entry)
    return out
