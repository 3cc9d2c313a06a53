"""SQLite run store (`runs/<run-id>/trials.db`, WAL mode).

Why SQLite: one file per run that survives a SIGKILL of the controller mid-write (WAL +
transactions), that a resumed run reopens as-is, and that a user can query with `sqlite3`.
Only the controller writes to it; node actors return records and never touch the database.

The tables and their migrations are in `schema.py`: opening a store brings an older one up to
date (`PRAGMA user_version`), so every reader and writer here sees the same tables.

A full disk must not lose a finished trial. A run that writes keeps a small reserve file
(`.trials.db.reserve`, see `ensure_reserve`) beside the database: when a write fails because
the disk is full, the reserve is deleted and the write tried once more, so the trial that just
finished and the run's final `interrupted` status still fit; `space_exhausted` then tells the
controller to stop. Opening checks the file's integrity (`PRAGMA quick_check`), so a damaged
page anywhere is one clear error, not a traceback halfway through a report.

Size: one class over one schema (trials, states, measurements, flags, repetition times) and its
write discipline; splitting the tables apart would split the transactions that must stay one.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from orchestrator.errors import DiskFull, UserError
from orchestrator.records import Candidate, TrialResult
from orchestrator.store.rows import TrialRow, read_trials
from orchestrator.store.schema import (
    SCHEMA_VERSION,
    STORE_FORMAT,
    migrate,
    needs_migration,
    user_version,
)
from orchestrator.store.writer import WRITER_LOCK, being_written, holder_text, writer_of
from orchestrator.util import wallclock

# Room kept for the last writes of a run whose disk filled up: a few trial results with their
# fingerprints, the in-flight trials marked interrupted and the run's status.
RESERVE_BYTES = 1 << 20

_T = TypeVar("_T")


def _is_full(exc: BaseException) -> bool:
    """SQLITE_FULL, or an I/O error from a write that ran out of space."""
    code = getattr(exc, "sqlite_errorcode", None)
    if code == sqlite3.SQLITE_FULL or "database or disk is full" in str(exc):
        return True
    return isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT)

class RunStore:
    """The run's database. Open with `create` (new run) or `open` (existing run)."""

    def __init__(self, conn: sqlite3.Connection, path: Path):
        self._conn = conn
        self.path = path
        self.reserve_path = path.with_name(f".{path.name}.reserve")
        # Set once a write needed the reserve: the run must stop while it still can.
        self.space_exhausted = False
        # True for a store this process created (`rundir.create_run`), not for a resumed one.
        self.fresh = False
        self.made_root = False  # and made runs_dir for it (removed too if the run is refused)
        # Called once, just after the first trial row is written (the run directory is then
        # announced: see `rundir.running`).
        self.on_first_trial: Callable[[], None] | None = None
        self._writer: int | None = None  # the descriptor holding `.writer.lock` (`claim`)

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
        now = wallclock.now()
        try:
            migrate(conn)
            with conn:
                conn.executemany(
                    "INSERT INTO meta(key, value) VALUES (?, ?)",
                    [("schema_version", STORE_FORMAT), ("run_id", run_id),
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
    def open(cls, path: Path, *, readonly: bool = False) -> RunStore:
        """Open an existing store, its tables brought up to date (`schema.migrate`); a missing,
        unreadable, damaged or foreign file, or one from a newer release, is a UserError.
        `readonly` opens it without writing anything, also in a read-only run directory (a
        run copied off a cluster, an archive): an older store is then migrated in a copy held
        in memory, so readers never ask which tables a store has."""
        if not path.is_file():
            raise UserError(f"no run store at {path}")
        conn = None
        try:
            conn = cls._connect_readonly(path) if readonly else cls._connect(path)
            check = conn.execute("PRAGMA quick_check(1)").fetchone()
            if check is None or check[0] != "ok":
                raise sqlite3.DatabaseError(str(check[0] if check else "no result"))
            version = conn.execute(
                "SELECT value FROM meta WHERE key='schema_version'"
            ).fetchone()
        except sqlite3.DatabaseError as exc:
            if conn is not None:
                conn.close()
            raise UserError(f"{path} is not a readable sleuth run store"
                            f" ({' '.join(str(exc).split())[:200]})") from exc
        if version is None or version[0] != STORE_FORMAT:
            conn.close()
            raise UserError(f"{path} has an unknown schema version: not a sleuth run store")
        found = user_version(conn)
        if found > SCHEMA_VERSION:
            conn.close()
            raise UserError(f"{path} was written by a newer sleuth (tables at version"
                            f" {found}, this release knows {SCHEMA_VERSION}):"
                            " upgrade sleuth to read it")
        try:
            conn = cls._migrated(conn, readonly=readonly)
        except (sqlite3.OperationalError, OSError) as exc:
            conn.close()
            if _is_full(exc):
                raise DiskFull(f"no space left on device to update {path}: free some space,"
                               " then try again") from exc
            raise
        return cls(conn, path)

    @staticmethod
    def _migrated(conn: sqlite3.Connection, *, readonly: bool) -> sqlite3.Connection:
        """`conn` with its tables at SCHEMA_VERSION; read-only, a migrated copy in memory."""
        if not needs_migration(conn):
            return conn
        if not readonly:
            migrate(conn)
            return conn
        copy = sqlite3.connect(":memory:", isolation_level=None)
        conn.backup(copy)
        conn.close()
        migrate(copy)
        return copy

    @staticmethod
    def _connect(path: Path) -> sqlite3.Connection:
        conn = sqlite3.connect(path, timeout=30.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    @staticmethod
    def _connect_readonly(path: Path) -> sqlite3.Connection:
        """A connection that never writes. A WAL database normally needs its `-shm` file,
        which a read-only directory cannot get: then the file is read as immutable (nothing
        can be writing it there anyway)."""
        uri = path.resolve().as_uri()
        conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=30.0, isolation_level=None)
        try:
            conn.execute("SELECT 1 FROM sqlite_master LIMIT 1").fetchall()
            return conn
        except sqlite3.OperationalError:
            conn.close()
            if os.access(path.parent, os.W_OK):
                raise
        return sqlite3.connect(f"{uri}?immutable=1", uri=True, isolation_level=None)

    def claim(self) -> None:
        """Become the run's one writer, or refuse: another process already writes it.

        A second controller on a live run (a `sleuth resume` typed in another terminal, or
        a continued `run_id=`) would mark the first one's running trials interrupted and add
        its own beside them. An exclusive `flock` on `.writer.lock` in the run directory,
        held until `close`, tells; the kernel drops it when the holder dies however it dies,
        so a killed run never stays claimed. Readers (`sleuth report`) never claim. A
        filesystem without `flock` goes unguarded rather than refused."""
        if self._writer is not None:
            return
        try:
            descriptor = os.open(self.path.with_name(WRITER_LOCK), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError:  # a directory this user cannot write: the store's own writes will say
            return
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = holder_text(os.pread(descriptor, 200, 0))
            os.close(descriptor)
            raise UserError(being_written(self.path.parent, who)) from None
        except OSError:
            os.close(descriptor)
            return
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()} {self.command or '?'}\n".encode(), 0)
        self._writer = descriptor

    @staticmethod
    def writer_of(run_dir: Path) -> str | None:
        """Who writes the run now (`store/writer.py: writer_of`)."""
        return writer_of(run_dir)

    def close(self) -> None:
        self._conn.close()
        if self._writer is not None:
            os.close(self._writer)  # closing the descriptor drops the flock
            self._writer = None

    # -- space -------------------------------------------------------------------------------
    def ensure_reserve(self) -> None:
        """Put the reserve file in place (a run about to write). No room for it is DiskFull:
        a run must not start, or resume, on a disk that cannot hold its results."""
        if self.reserve_path.exists() and self.reserve_path.stat().st_size >= RESERVE_BYTES:
            return
        tmp = self.reserve_path.with_name(self.reserve_path.name + ".tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(b"\0" * RESERVE_BYTES)
                f.flush()
                os.fsync(f.fileno())
            tmp.replace(self.reserve_path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if _is_full(exc):
                raise DiskFull(f"no space left on device for the run in {self.path.parent}:"
                               " free some space, then sleuth resume it") from exc
            raise

    def release_reserve(self) -> bool:
        """Give the reserve's space back (once). True if there was one."""
        try:
            self.reserve_path.unlink()
        except FileNotFoundError:
            return False
        return True

    def _write(self, body: Callable[[sqlite3.Connection], _T]) -> _T:
        """Run `body` in one IMMEDIATE transaction. When the disk is full, free the reserve
        and try once more; if that fails too, the write is lost and DiskFull says so."""
        for attempt in (1, 2):
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    result = body(self._conn)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
                return result
            except (sqlite3.OperationalError, OSError) as exc:
                if not _is_full(exc):
                    raise
                if self._conn.in_transaction:
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass
                self.space_exhausted = True
                if attempt == 2 or not self.release_reserve():
                    raise DiskFull(f"no space left on device for {self.path}") from exc
        raise AssertionError("unreachable")

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
        self._write(lambda c: c.execute(
            "UPDATE runs SET status=?, updated_at=?, summary_json=COALESCE(?, summary_json)",
            (status, wallclock.now(), json.dumps(summary) if summary is not None else None),
        ))

    def summary(self) -> dict:
        row = self._conn.execute("SELECT summary_json FROM runs").fetchone()
        return json.loads(row[0]) if row and row[0] else {}

    # -- trial flags -------------------------------------------------------------------------
    def set_trial_flags(self, kind: str, flags: dict[int, str]) -> None:
        """Replace every flag of ``kind`` with ``flags`` (trial id -> detail), atomically."""
        def body(c: sqlite3.Connection) -> None:
            c.execute("DELETE FROM trial_flags WHERE kind=?", (kind,))
            c.executemany("INSERT INTO trial_flags(trial_id, kind, detail) VALUES (?, ?, ?)",
                          [(int(t), kind, d) for t, d in sorted(flags.items())])

        self._write(body)

    def trial_flags(self, kind: str | None = None) -> dict[int, dict[str, str]]:
        """``{trial id: {kind: detail}}``."""
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
        def body(c: sqlite3.Connection) -> int:
            c.execute(
                "INSERT OR IGNORE INTO candidates(key, spec_json, label) VALUES (?, ?, ?)",
                (cand.key, json.dumps(cand.to_json(), sort_keys=True), cand.label),
            )
            return c.execute("SELECT id FROM candidates WHERE key=?", (cand.key,)).fetchone()[0]

        return self._write(body)

    def candidate(self, candidate_id: int) -> Candidate:
        row = self._conn.execute(
            "SELECT spec_json FROM candidates WHERE id=?", (candidate_id,)
        ).fetchone()
        if row is None:
            raise KeyError(candidate_id)
        return Candidate.from_json(json.loads(row[0]))

    # -- trials ------------------------------------------------------------------------------
    def begin_trial(self, candidate_id: int, *, node: str = "", phase: str = "",
                    attempt: int = 1, log_path: Callable[[int], str] | None = None) -> int:
        """Write the trial row before anything runs, so a crash leaves a trace of it.

        `log_path(trial_id)` names its server log in the same transaction (one commit, not
        two, per dispatched trial)."""
        now = wallclock.now()

        def body(c: sqlite3.Connection) -> int:
            cur = c.execute(
                "INSERT INTO trials(candidate_id, node, phase, attempt, state, created_at)"
                " VALUES (?, ?, ?, ?, 'pending', ?)",
                (candidate_id, node, phase, attempt, now),
            )
            trial_id = int(cur.lastrowid)
            c.execute("INSERT INTO trial_states VALUES (?, 'pending', ?)", (trial_id, now))
            if log_path is not None:
                c.execute("UPDATE trials SET log_path=? WHERE id=?", (log_path(trial_id), trial_id))
            return trial_id

        trial_id = self._write(body)
        if self.on_first_trial is not None:
            hook, self.on_first_trial = self.on_first_trial, None
            hook()
        return trial_id

    def finish_trial(self, trial_id: int, result: TrialResult) -> None:
        """Record the outcome, the step history, measurements and fingerprint in one transaction."""
        def body(c: sqlite3.Connection) -> None:
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
            timed = [(trial_id, m.repetition, float(m.seconds)) for m in result.measurements
                     if m.seconds is not None]
            if timed:
                c.executemany("INSERT INTO repetition_times VALUES (?, ?, ?)", timed)
            if result.fingerprint:
                c.execute(
                    "INSERT OR REPLACE INTO fingerprints VALUES (?, ?)",
                    (trial_id, json.dumps(result.fingerprint, sort_keys=True, default=str)),
                )

        self._write(body)

    def interrupt_unfinished(self, detail: str = "controller stopped before the trial ended") -> list[int]:
        """Mark trials left without an outcome (controller died) as interrupted; return their ids."""
        def body(c: sqlite3.Connection) -> list[int]:
            ids = [r[0] for r in c.execute("SELECT id FROM trials WHERE outcome IS NULL")]
            c.executemany(
                "UPDATE trials SET state='done', outcome='interrupted', detail=? WHERE id=?",
                [(detail, i) for i in ids],
            )
            return ids

        return self._write(body)

    def trial(self, trial_id: int) -> TrialRow:
        rows = self.trials(where="t.id=?", params=(trial_id,))
        if not rows:
            raise KeyError(trial_id)
        return rows[0]

    def trials(self, *, where: str = "1", params: tuple = ()) -> list[TrialRow]:
        """All trials (optionally filtered by a SQL condition on alias `t`), oldest first."""
        try:
            return read_trials(self._conn, where, params)
        except sqlite3.DatabaseError as exc:
            if isinstance(exc, sqlite3.OperationalError) and "locked" in str(exc):
                raise
            raise UserError(f"{self.path} is not a readable sleuth run store"
                            f" ({' '.join(str(exc).split())[:200]})") from exc
