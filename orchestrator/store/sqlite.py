"""SQLite run store (`runs/<run-id>/trials.db`, WAL mode).

Why SQLite: one file per run that survives a SIGKILL of the controller mid-write (WAL +
transactions), that a resumed run reopens as-is, and that a user can query with `sqlite3`.
Only the controller writes to it; node actors return records and never touch the database.

Schema (version 1)
------------------
meta(key TEXT PRIMARY KEY, value TEXT)
    schema_version, run_id, command (trial|bisect|...), created_at.
runs(id TEXT PRIMARY KEY, command TEXT, status TEXT, created_at REAL, updated_at REAL,
     config_yaml TEXT, summary_json TEXT)
    One row. status: running | done | inconclusive | interrupted | failed.
candidates(id INTEGER PRIMARY KEY, key TEXT UNIQUE, spec_json TEXT, label TEXT)
    A candidate is an assignment of factor levels (commit, patches, env, clock); `key` is its
    stable hash, so a resumed run finds the same candidate again.
trials(id INTEGER PRIMARY KEY, candidate_id INTEGER, node TEXT, phase TEXT, attempt INTEGER,
       state TEXT, outcome TEXT NULL, detail TEXT, created_at REAL, started_at REAL,
       ended_at REAL, log_path TEXT, suspect INTEGER, suspect_reason TEXT)
    Written (state=pending, outcome NULL) *before* the trial is dispatched, finished after
    teardown. outcome: ok | prepare_failed | launch_failed | not_ready | env_mismatch | crashed |
    hung | bench_failed | teardown_failed | interrupted | error. A row with outcome NULL belongs
    to a trial that was running when the controller died; resume marks it interrupted.
trial_states(trial_id INTEGER, state TEXT, at REAL)
    Each step the trial reached (preparing, launching, waiting_ready, ...), with its time.
measurements(trial_id INTEGER, repetition INTEGER, metric TEXT, value REAL,
             PRIMARY KEY (trial_id, repetition, metric))
    One row per metric per benchmark repetition (long form: new metrics need no migration).
fingerprints(trial_id INTEGER PRIMARY KEY, json TEXT)
    The environment the trial ran in (git SHA, env, versions, GPU state ...).
trial_flags(trial_id INTEGER, kind TEXT, detail TEXT, PRIMARY KEY (trial_id, kind))
    What an experiment concluded about a finished trial without discarding it, e.g. kind
    `outlier`: a restart its commit's other restarts disagree with, left out of the bisect's
    likelihood. Created on first use, so stores written before it stay readable.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult

SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE IF NOT EXISTS runs(
    id TEXT PRIMARY KEY, command TEXT NOT NULL, status TEXT NOT NULL,
    created_at REAL NOT NULL, updated_at REAL NOT NULL, config_yaml TEXT, summary_json TEXT);
CREATE TABLE IF NOT EXISTS candidates(
    id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL, spec_json TEXT NOT NULL, label TEXT);
CREATE TABLE IF NOT EXISTS trials(
    id INTEGER PRIMARY KEY, candidate_id INTEGER NOT NULL REFERENCES candidates(id),
    node TEXT, phase TEXT, attempt INTEGER NOT NULL DEFAULT 1, state TEXT NOT NULL,
    outcome TEXT, detail TEXT, created_at REAL NOT NULL, started_at REAL, ended_at REAL,
    log_path TEXT, suspect INTEGER NOT NULL DEFAULT 0, suspect_reason TEXT);
CREATE TABLE IF NOT EXISTS trial_states(
    trial_id INTEGER NOT NULL REFERENCES trials(id), state TEXT NOT NULL, at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS measurements(
    trial_id INTEGER NOT NULL REFERENCES trials(id), repetition INTEGER NOT NULL,
    metric TEXT NOT NULL, value REAL, PRIMARY KEY (trial_id, repetition, metric));
CREATE TABLE IF NOT EXISTS fingerprints(
    trial_id INTEGER PRIMARY KEY REFERENCES trials(id), json TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS trials_by_candidate ON trials(candidate_id);
"""
_FLAGS_SCHEMA = """CREATE TABLE IF NOT EXISTS trial_flags(
    trial_id INTEGER NOT NULL REFERENCES trials(id), kind TEXT NOT NULL, detail TEXT,
    PRIMARY KEY (trial_id, kind))"""


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


class RunStore:
    """The run's database. Open with `create` (new run) or `open` (existing run)."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        self._conn = conn
        self.path = path

    # -- lifecycle ---------------------------------------------------------------------------
    @classmethod
    def create(cls, path: Path, *, run_id: str, command: str, config_yaml: str) -> RunStore:
        """A new store, built under a temporary name and renamed into place: a reader (a
        report, a resume, a watching test) never finds a file without its schema."""
        if path.exists():
            raise UserError(f"{path} already exists: refusing to overwrite a run's store")
        tmp = path.with_name(f".{path.name}.creating")
        for leftover in (tmp, Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            leftover.unlink(missing_ok=True)
        conn = cls._connect(tmp)
        now = time.time()
        try:
            with conn:
                conn.executescript(_SCHEMA)
                conn.executemany(
                    "INSERT INTO meta(key, value) VALUES (?, ?)",
                    [("schema_version", str(SCHEMA_VERSION)), ("run_id", run_id),
                     ("command", command), ("created_at", str(now))],
                )
                conn.execute(
                    "INSERT INTO runs(id, command, status, created_at, updated_at, config_yaml)"
                    " VALUES (?, ?, 'running', ?, ?, ?)",
                    (run_id, command, now, now, config_yaml),
                )
            conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            conn.close()
        tmp.replace(path)
        for side in (Path(f"{tmp}-wal"), Path(f"{tmp}-shm")):
            side.unlink(missing_ok=True)
        return cls(cls._connect(path), path)

    @classmethod
    def open(cls, path: Path) -> RunStore:
        """Open an existing store; a missing, unreadable or foreign file is a UserError."""
        if not path.is_file():
            raise UserError(f"no run store at {path}")
        try:
            conn = cls._connect(path)
            version = conn.execute(
                "SELECT value FROM meta WHERE key='schema_version'"
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            raise UserError(f"{path} is not a readable sleuth run store ({exc})") from exc
        if version is None or int(version[0]) != SCHEMA_VERSION:
            conn.close()
            raise UserError(f"{path} has an unknown schema version: not a sleuth run store")
        return cls(conn, path)

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def close(self) -> None:
        self._conn.close()

    @contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield self._conn
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    # -- run ---------------------------------------------------------------------------------
    def meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return row[0] if row else None

    @property
    def run_id(self) -> str:
        return self.meta("run_id") or ""

    @property
    def command(self) -> str:
        return self.meta("command") or ""

    def status(self) -> str:
        return self._conn.execute("SELECT status FROM runs").fetchone()[0]

    def config_yaml(self) -> str:
        return self._conn.execute("SELECT config_yaml FROM runs").fetchone()[0] or ""

    def set_status(self, status: str, summary: dict | None = None) -> None:
        with self._tx() as c:
            c.execute(
                "UPDATE runs SET status=?, updated_at=?, summary_json=COALESCE(?, summary_json)",
                (status, time.time(), json.dumps(summary) if summary is not None else None),
            )

    def summary(self) -> dict:
        row = self._conn.execute("SELECT summary_json FROM runs").fetchone()
        return json.loads(row[0]) if row and row[0] else {}

    # -- trial flags -------------------------------------------------------------------------
    def set_trial_flags(self, kind: str, flags: dict[int, str]) -> None:
        """Replace every flag of ``kind`` with ``flags`` (trial id -> detail), atomically."""
        with self._tx() as c:
            c.execute(_FLAGS_SCHEMA)
            c.execute("DELETE FROM trial_flags WHERE kind=?", (kind,))
            c.executemany("INSERT INTO trial_flags(trial_id, kind, detail) VALUES (?, ?, ?)",
                          [(int(t), kind, d) for t, d in sorted(flags.items())])

    def trial_flags(self, kind: str | None = None) -> dict[int, dict[str, str]]:
        """``{trial id: {kind: detail}}`` (empty for a store that never had flags)."""
        exists = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type='table' AND name='trial_flags'").fetchone()
        if not exists:
            return {}
        query, params = "SELECT trial_id, kind, detail FROM trial_flags", ()
        if kind is not None:
            query, params = query + " WHERE kind=?", (kind,)
        out: dict[int, dict[str, str]] = {}
        for trial_id, k, detail in self._conn.execute(query, params).fetchall():
            out.setdefault(int(trial_id), {})[k] = detail or ""
        return out

    # -- candidates --------------------------------------------------------------------------
    def candidate_id(self, cand: Candidate) -> int:
        """The candidate's id, inserting it on first sight."""
        with self._tx() as c:
            c.execute(
                "INSERT OR IGNORE INTO candidates(key, spec_json, label) VALUES (?, ?, ?)",
                (cand.key, json.dumps(cand.to_json(), sort_keys=True), cand.label),
            )
            return c.execute("SELECT id FROM candidates WHERE key=?", (cand.key,)).fetchone()[0]

    def candidate(self, candidate_id: int) -> Candidate:
        row = self._conn.execute(
            "SELECT spec_json FROM candidates WHERE id=?", (candidate_id,)
        ).fetchone()
        if row is None:
            raise KeyError(candidate_id)
        return Candidate.from_json(json.loads(row[0]))

    # -- trials ------------------------------------------------------------------------------
    def begin_trial(self, candidate_id: int, *, node: str = "", phase: str = "",
                    attempt: int = 1) -> int:
        """Write the trial row before anything runs, so a crash leaves a trace of it."""
        now = time.time()
        with self._tx() as c:
            cur = c.execute(
                "INSERT INTO trials(candidate_id, node, phase, attempt, state, created_at)"
                " VALUES (?, ?, ?, ?, 'pending', ?)",
                (candidate_id, node, phase, attempt, now),
            )
            trial_id = int(cur.lastrowid)
            c.execute("INSERT INTO trial_states VALUES (?, 'pending', ?)", (trial_id, now))
        return trial_id

    def set_log_path(self, trial_id: int, log_path: str) -> None:
        with self._tx() as c:
            c.execute("UPDATE trials SET log_path=? WHERE id=?", (log_path, trial_id))

    def finish_trial(self, trial_id: int, result: TrialResult) -> None:
        """Record the outcome, the step history, measurements and fingerprint in one transaction."""
        with self._tx() as c:
            row = c.execute("SELECT outcome FROM trials WHERE id=?", (trial_id,)).fetchone()
            if row is None:
                raise KeyError(trial_id)
            if row[0] is not None:
                raise ValueError(f"trial {trial_id} is already finished ({row[0]})")
            c.execute(
                "UPDATE trials SET state='done', outcome=?, detail=?, node=COALESCE(NULLIF(?, ''), node),"
                " started_at=?, ended_at=?, suspect=?, suspect_reason=? WHERE id=?",
                (result.outcome.value, result.detail, result.node, result.started_at,
                 result.ended_at, int(result.suspect), result.suspect_reason, trial_id),
            )
            c.executemany(
                "INSERT INTO trial_states VALUES (?, ?, ?)",
                [(trial_id, s, at) for s, at in result.states],
            )
            c.executemany(
                "INSERT INTO measurements VALUES (?, ?, ?, ?)",
                [
                    (trial_id, m.repetition, k, float(v))
                    for m in result.measurements
                    for k, v in m.metrics.items()
                    if v is not None
                ],
            )
            if result.fingerprint:
                c.execute(
                    "INSERT OR REPLACE INTO fingerprints VALUES (?, ?)",
                    (trial_id, json.dumps(result.fingerprint, sort_keys=True, default=str)),
                )

    def interrupt_unfinished(self, detail: str = "controller stopped before the trial ended") -> list[int]:
        """Mark trials left without an outcome (controller died) as interrupted; return their ids."""
        with self._tx() as c:
            ids = [r[0] for r in c.execute("SELECT id FROM trials WHERE outcome IS NULL")]
            c.executemany(
                "UPDATE trials SET state='done', outcome='interrupted', detail=? WHERE id=?",
                [(detail, i) for i in ids],
            )
        return ids

    def trial(self, trial_id: int) -> TrialRow:
        rows = self.trials(where="t.id=?", params=(trial_id,))
        if not rows:
            raise KeyError(trial_id)
        return rows[0]

    def trials(self, *, where: str = "1", params: tuple = ()) -> list[TrialRow]:
        """All trials (optionally filtered by a SQL condition on alias `t`), oldest first."""
        rows = self._conn.execute(
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
        ids = [r[0] for r in rows]
        if ids:
            marks = ",".join("?" * len(ids))
            for tid, rep, metric, value in self._conn.execute(
                f"SELECT trial_id, repetition, metric, value FROM measurements"
                f" WHERE trial_id IN ({marks}) ORDER BY trial_id, repetition", ids
            ):
                meas.setdefault(tid, {}).setdefault(rep, {})[metric] = value
            for tid, state, at in self._conn.execute(
                f"SELECT trial_id, state, at FROM trial_states WHERE trial_id IN ({marks})"
                " ORDER BY rowid", ids
            ):
                states.setdefault(tid, []).append((state, at))
        out = []
        for (tid, cid, spec, node, phase, attempt, state, outcome, detail, started, ended,
             log_path, suspect, suspect_reason, fp) in rows:
            result = None
            if outcome is not None:
                result = TrialResult(
                    outcome=Outcome(outcome),
                    detail=detail or "",
                    measurements=tuple(
                        Measurement(rep, metrics) for rep, metrics in sorted(meas.get(tid, {}).items())
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
