"""A lifetime that measured several configurations becomes one row per configuration.

A trial with live levels (:mod:`orchestrator.runner.lifetime`) is one restart that measured
several candidates in interleaved blocks. The store keeps the restart as it ran (its row, phase
:data:`LIFETIME_PHASE`: its cost, states, log and every repetition; not evidence for any one
candidate, its repetitions being of several) and adds one *block row* per level: the candidate
with that level's clock policy, the repetitions measured at it, and a fingerprint that shows
the GPUs at that level and names the lifetime (`lifetime: {trial, level}`). So every reader
that reads a candidate's trials by its key (strategies, findings, the final check, the
answer) finds these measurements where they belong, and those that pair (the isolate, the
effects between two candidates: :mod:`orchestrator.stats.lifetimes`) know which values share a
lifetime. A block row has no time of its own (started = ended): the restart's cost is its
lifetime row's, counted once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from orchestrator.gpu.base import format_parts, parse_parts
from orchestrator.records import Candidate, TrialResult

LIFETIME_PHASE = "lifetime"


def level_candidate(candidate: Candidate, level: str) -> Candidate:
    """The candidate a lifetime of `candidate` measures at clock policy `level`."""
    parts = {**parse_parts(candidate.clock), **parse_parts(level)}
    return dataclasses.replace(candidate, clock=format_parts(parts))


def lifetime_of(fingerprint: Mapping | None) -> int | None:
    """The lifetime (its trial id) a block row's values were measured in, else None."""
    entry = (fingerprint or {}).get("lifetime")
    return int(entry["trial"]) if isinstance(entry, Mapping) and "trial" in entry else None


def block_results(lifetime_id: int, result: TrialResult) -> list[tuple[str, TrialResult]]:
    """(level, block result) per level of a finished lifetime: its repetitions at that level
    (a failed lifetime gives each level its outcome and no measurements)."""
    live = (result.fingerprint or {}).get("live") or {}
    levels = list(live.get("levels") or [])
    blocks = list(live.get("blocks") or [])
    snapshots = list(live.get("snapshots") or [])
    base = {k: v for k, v in (result.fingerprint or {}).items() if k != "live"}
    out = []
    for i, level in enumerate(levels):
        mine = tuple(dataclasses.replace(m, repetition=n, seconds=None) for n, m in enumerate(
            m for m, b in zip(result.measurements, blocks, strict=False) if b == i))
        fp = dict(base)
        if i < len(snapshots) and snapshots[i]:
            fp["gpu"] = snapshots[i]
        fp["clock_policy"] = format_parts({**parse_parts(str(base.get("clock_policy") or
                                                               "default")), **parse_parts(level)})
        fp["lifetime"] = {"trial": lifetime_id, "level": level, "levels": levels}
        out.append((level, dataclasses.replace(
            result, measurements=mine if result.outcome.measured else (), states=(),
            started_at=result.ended_at, ended_at=result.ended_at, fingerprint=fp,
            log_tail="")))
    return out


def recover(store) -> list[int]:
    """Block rows of lifetimes that finished as the controller stopped, between the lifetime's
    row and its blocks (two writes): written now from the lifetime's stored result, so a
    resumed run counts the restart it already paid for. Returns the rows written."""
    rows = store.trials()
    have = {lifetime_of(r.result.fingerprint) for r in rows if r.result is not None}
    out: list[int] = []
    for r in rows:
        live = ((r.result.fingerprint or {}).get("live") or {}) if r.result is not None else {}
        if live.get("levels") and r.id not in have and r.outcome is not None:
            out += record(store, r.id, r.candidate, tuple(live["levels"]), r.result, node=r.node,
                          phase=r.phase, attempt=r.attempt)
    return out


def record(store, lifetime_id: int, candidate: Candidate, live: tuple[str, ...],
           result: TrialResult, *, node: str, phase: str, attempt: int) -> list[int]:
    """Write the block rows of a finished lifetime (`result`, stored as trial `lifetime_id`)
    into `store`; returns their ids, one per level of `live`, in order. A lifetime that failed
    before its blocks gives each level its outcome."""
    if not (result.fingerprint or {}).get("live"):
        entry = {"levels": list(live), "blocks": []}
        result = dataclasses.replace(result, fingerprint={**(result.fingerprint or {}),
                                                          "live": entry})
    ids = []
    for level, block in block_results(lifetime_id, result):
        cid = store.candidate_id(level_candidate(candidate, level))
        tid = store.begin_trial(cid, node=node, phase=phase, attempt=attempt)
        store.finish_trial(tid, block)
        ids.append(tid)
    return ids
