"""Stored trials as the rest of sleuth reads them: `TrialRow` and the one query that builds
them (trials joined with their candidate and fingerprint, plus measurements and states)."""

from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass

from orchestrator.records import Candidate, Measurement, Outcome, TrialResult


@dataclass(frozen=True)
class TrialRow:
    """A stored trial with its candidate: what strategies and reports read."""

    id: int
    candidate_id: int
    candidate: Candidate
    node: str
    phase: str
    attempt: int
    state: str
    outcome: Outcome | None
    detail: str
    started_at: float | None
    ended_at: float | None
    log_path: str
    suspect: bool
    result: TrialResult | None  # None while unfinished

    @property
    def finished(self) -> bool:
        return self.outcome is not None


def read_trials(conn: sqlite3.Connection, where: str = "1", params: tuple = ()) -> list[TrialRow]:
    """Trials with their candidate, measurements, states and fingerprint, oldest first."""
    rows = conn.execute(
        "SELECT t.id, t.candidate_id, c.spec_json, t.node, t.phase, t.attempt, t.state,"
        " t.outcome, t.detail, t.started_at, t.ended_at, t.log_path, t.suspect,"
        " t.suspect_reason, f.json"
        " FROM trials t JOIN candidates c ON c.id = t.candidate_id"
        " LEFT JOIN fingerprints f ON f.trial_id = t.id"
        f" WHERE {where} ORDER BY t.id",
        params,
    ).fetchall()
    meas: dict[int, dict[int, dict[str, float]]] = {}
    states: dict[int, list[tuple[str, float]]] = {}
    seconds: dict[tuple[int, int], float] = {}
    ids = [r[0] for r in rows]
    if ids:
        marks = ",".join("?" * len(ids))
        for tid, rep, metric, value in conn.execute(
            f"SELECT trial_id, repetition, metric, value FROM measurements"
            f" WHERE trial_id IN ({marks}) ORDER BY trial_id, repetition", ids
        ):
            meas.setdefault(tid, {}).setdefault(rep, {})[metric] = value
        for tid, state, at in conn.execute(
            f"SELECT trial_id, state, at FROM trial_states WHERE trial_id IN ({marks})"
            " ORDER BY rowid", ids
        ):
            states.setdefault(tid, []).append((state, at))
        for tid, rep, secs in conn.execute(
            f"SELECT trial_id, repetition, seconds FROM repetition_times"
            f" WHERE trial_id IN ({marks})", ids
        ):
            seconds[(tid, rep)] = secs
    out = []
    for (tid, cid, spec, node, phase, attempt, state, outcome, detail, started, ended,
         log_path, suspect, suspect_reason, fp) in rows:
        result = None
        if outcome is not None:
            result = TrialResult(
                outcome=Outcome(outcome),
                detail=detail or "",
                measurements=tuple(
                    Measurement(rep, metrics, seconds.get((tid, rep)))
                    for rep, metrics in sorted(meas.get(tid, {}).items())
                ),
                states=tuple(states.get(tid, ())),
                started_at=started or 0.0,
                ended_at=ended or 0.0,
                node=node or "",
                fingerprint=json.loads(fp) if fp else {},
                suspect=bool(suspect),
                suspect_reason=suspect_reason or "",
            )
        out.append(TrialRow(
            id=tid, candidate_id=cid, candidate=Candidate.from_json(json.loads(spec)),
            node=node or "", phase=phase or "", attempt=attempt, state=state,
            outcome=Outcome(outcome) if outcome else None, detail=detail or "",
            started_at=started, ended_at=ended, log_path=log_path or "",
            suspect=bool(suspect), result=result,
        ))
    return out
