"""The run store's tables, and the ordered migrations that build them.

Why migrations: a run directory outlives the release that wrote it (a run resumed after an
upgrade, an old run read by `report` or used as a noise prior). Each change of the tables is
one function appended to `MIGRATIONS`; `PRAGMA user_version` counts how many a file has had,
and opening a store applies the missing ones in order, in one transaction. Before this, new
tables were created lazily inside the writes that needed them and every reader had to guess
whether a table existed. A store written before `user_version` was kept reads 0 and has had
some of the migrations already: each one is idempotent (`IF NOT EXISTS`) for that reason.

`meta.schema_version` stays "1": it names the file a sleuth run store (releases before the
migrations refuse any other value), while `user_version` is the level of its tables.

Tables
------
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
    (migration 2) What an experiment concluded about a finished trial without discarding it,
    e.g. kind `outlier`: a restart its commit's other restarts disagree with, left out of the
    bisect's likelihood.
repetition_times(trial_id INTEGER, repetition INTEGER, seconds REAL,
                 PRIMARY KEY (trial_id, repetition))
    (migration 3) Node wall seconds of each benchmark repetition (the cost split of a trial:
    launch to ready and warm-up come from `trial_states`).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

# The value of meta.schema_version: "a sleuth run store" (see the module docstring).
STORE_FORMAT = "1"


def _base_tables(conn: sqlite3.Connection) -> None:
    for statement in (
        "CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT)",
        """CREATE TABLE IF NOT EXISTS runs(
            id TEXT PRIMARY KEY, command TEXT NOT NULL, status TEXT NOT NULL,
            created_at REAL NOT NULL, updated_at REAL NOT NULL, config_yaml TEXT,
            summary_json TEXT)""",
        """CREATE TABLE IF NOT EXISTS candidates(
            id INTEGER PRIMARY KEY, key TEXT UNIQUE NOT NULL, spec_json TEXT NOT NULL,
            label TEXT)""",
        """CREATE TABLE IF NOT EXISTS trials(
            id INTEGER PRIMARY KEY, candidate_id INTEGER NOT NULL REFERENCES candidates(id),
            node TEXT, phase TEXT, attempt INTEGER NOT NULL DEFAULT 1, state TEXT NOT NULL,
            outcome TEXT, detail TEXT, created_at REAL NOT NULL, started_at REAL,
            ended_at REAL, log_path TEXT, suspect INTEGER NOT NULL DEFAULT 0,
            suspect_reason TEXT)""",
        """CREATE TABLE IF NOT EXISTS trial_states(
            trial_id INTEGER NOT NULL REFERENCES trials(id), state TEXT NOT NULL,
            at REAL NOT NULL)""",
        """CREATE TABLE IF NOT EXISTS measurements(
            trial_id INTEGER NOT NULL REFERENCES trials(id), repetition INTEGER NOT NULL,
            metric TEXT NOT NULL, value REAL, PRIMARY KEY (trial_id, repetition, metric))""",
        """CREATE TABLE IF NOT EXISTS fingerprints(
            trial_id INTEGER PRIMARY KEY REFERENCES trials(id), json TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS trials_by_candidate ON trials(candidate_id)",
    ):
        conn.execute(statement)


def _trial_flags(conn: sqlite3.Connection) -> None:
    conn.execute("""CREATE TABLE IF NOT EXISTS trial_flags(
        trial_id INTEGER NOT NULL REFERENCES trials(id), kind TEXT NOT NULL, detail TEXT,
        PRIMARY KEY (trial_id, kind))""")


def _repetition_times(conn: sqlite3.Connection) -> None:
    conn.execute("""CREATE TABLE IF NOT EXISTS repetition_times(
        trial_id INTEGER NOT NULL REFERENCES trials(id), repetition INTEGER NOT NULL,
        seconds REAL NOT NULL, PRIMARY KEY (trial_id, repetition))""")


# Applied in order: a file at user_version N has had MIGRATIONS[:N]. Only ever append.
MIGRATIONS: tuple[Callable[[sqlite3.Connection], None], ...] = (
    _base_tables,
    _trial_flags,
    _repetition_times,
)
SCHEMA_VERSION = len(MIGRATIONS)


def user_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def migrate(conn: sqlite3.Connection) -> int:
    """Bring `conn`'s tables to SCHEMA_VERSION in one IMMEDIATE transaction (a concurrent
    opener waits, then finds nothing left to do); returns the version the file had. A file
    newer than this release is left alone: the caller refuses it."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        found = user_version(conn)
        for step in MIGRATIONS[found:]:
            step(conn)
        if found < SCHEMA_VERSION:
            conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")
    return found


def needs_migration(conn: sqlite3.Connection) -> bool:
    return user_version(conn) < SCHEMA_VERSION
