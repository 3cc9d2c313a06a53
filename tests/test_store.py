from __future__ import annotations

import sqlite3

import pytest

from orchestrator.errors import UserError
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.store import RunStore


def _store(tmp_path):
    return RunStore.create(tmp_path / "trials.db", run_id="r1", command="trial", config_yaml="a: 1\n")


def test_trial_row_written_before_and_finished_after(tmp_path):
    store = _store(tmp_path)
    cand = Candidate.make("a" * 40, env={"NCCL_PROTO": "LL128"})
    cid = store.candidate_id(cand)
    assert store.candidate_id(Candidate.make("a" * 40, env={"NCCL_PROTO": "LL128"})) == cid
    tid = store.begin_trial(cid, node="local-0", phase="trial")
    row = store.trial(tid)
    assert row.outcome is None and row.state == "pending" and not row.finished
    result = TrialResult(
        Outcome.OK, measurements=(Measurement(0, {"verify_ms": 19.0}), Measurement(1, {"verify_ms": 21.0})),
        states=(("preparing", 1.0), ("done", 2.0)), started_at=1.0, ended_at=2.0,
        node="local-0", fingerprint={"git": {"sha": "a" * 40}},
    )
    store.finish_trial(tid, result)
    row = store.trial(tid)
    assert row.outcome is Outcome.OK
    assert row.result.value("verify_ms") == pytest.approx(20.0)
    assert row.result.fingerprint["git"]["sha"] == "a" * 40
    assert [s for s, _ in row.result.states] == ["pending", "preparing", "done"]
    assert row.candidate == cand
    with pytest.raises(ValueError):
        store.finish_trial(tid, result)


def test_reopen_and_interrupt_unfinished(tmp_path):
    store = _store(tmp_path)
    cid = store.candidate_id(Candidate.make("b" * 40))
    t1 = store.begin_trial(cid)
    store.close()
    store = RunStore.open(tmp_path / "trials.db")
    assert store.run_id == "r1" and store.command == "trial"
    assert store.interrupt_unfinished() == [t1]
    assert store.trial(t1).outcome is Outcome.INTERRUPTED


def test_journal_is_wal(tmp_path):
    _store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "trials.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_create_refuses_existing(tmp_path):
    _store(tmp_path).close()
    with pytest.raises(UserError):
        _store(tmp_path)


def test_open_rejects_corrupt_and_foreign(tmp_path):
    bad = tmp_path / "corrupt.db"
    bad.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(UserError):
        RunStore.open(bad)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE x(y)")
    with pytest.raises(UserError):
        RunStore.open(other)
    with pytest.raises(UserError):
        RunStore.open(tmp_path / "missing.db")


def _many_trials(tmp_path, n: int = 200) -> RunStore:
    store = _store(tmp_path)
    for i in range(n):
        tid = store.begin_trial(store.candidate_id(Candidate.make(f"{i:040x}")), node="local-0")
        store.finish_trial(tid, TrialResult(
            Outcome.OK, measurements=(Measurement(0, {"verify_ms": 19.0 + i / 100}),),
            started_at=1.0, ended_at=2.0, node="local-0", fingerprint={"pad": "x" * 400}))
    store._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return store


def test_a_damaged_page_in_the_middle_is_refused_in_one_line(tmp_path, capsys):
    from orchestrator.cli import main

    run = tmp_path / "run"
    run.mkdir()
    _many_trials(run).close()
    db = run / "trials.db"
    page = sqlite3.connect(db).execute("PRAGMA page_size").fetchone()[0]
    pages = db.stat().st_size // page
    assert pages > 20
    with open(db, "r+b") as f:  # a sector gone bad half-way through the file
        f.seek((pages // 2) * page)
        f.write(bytes(range(256)) * (page // 256))
    with pytest.raises(UserError, match="not a readable sleuth run store"):
        RunStore.open(db)
    with pytest.raises(SystemExit) as exc:
        main(["report", str(run)])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and len(err) == 1 and "not a readable" in err[0], err
    assert not (run / "report.md").exists()


def test_a_read_only_run_directory_can_be_reviewed(tmp_path, capsys):
    from orchestrator.cli import main
    from tests.conftest import read_only_view
    from tests.test_report_render import build_bisect_run

    run = build_bisect_run(tmp_path / "runs", run_id="archived")
    with read_only_view(run["run_dir"], tmp_path / "ro") as ro:
        with pytest.raises(OSError):
            (ro / "probe").write_text("x")
        store = RunStore.open(ro / "trials.db", readonly=True)
        assert len(store.trials()) == run["n_obs"] and store.status() == "done"
        store.close()
        with pytest.raises(SystemExit) as exc:
            main(["report", str(ro)])
        out = capsys.readouterr().out
        assert exc.value.code == 0 and "is read-only" in out and "out=DIR" in out
        assert "causes (bisect" in out.lower() and "answer:" in out
        with pytest.raises(SystemExit) as exc:
            main(["report", str(ro), f"out={tmp_path / 'review'}"])
        assert exc.value.code == 0
    assert "sleuth report: archived" in (tmp_path / "review" / "report.md").read_text()
    assert (tmp_path / "review" / "report.html").is_file()


@pytest.fixture()
def tiny_disk(tmp_path):
    import subprocess

    mnt = tmp_path / "disk"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_full_disk_still_keeps_the_trial_that_just_finished(tiny_disk):
    from orchestrator.errors import DiskFull

    store = _store(tiny_disk)
    store.ensure_reserve()
    tid = store.begin_trial(store.candidate_id(Candidate.make("b" * 40)), node="local-0")
    with open(tiny_disk / "filler", "wb", buffering=0) as f:  # someone else fills the disk
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
    store.finish_trial(tid, TrialResult(  # a large result: it needs the reserve to fit
        Outcome.OK, measurements=(Measurement(0, {"verify_ms": 19.0}),), started_at=1.0,
        ended_at=2.0, node="local-0", fingerprint={"pad": "x" * 200_000}))
    assert store.space_exhausted and not store.reserve_path.exists()
    store.set_status("interrupted")
    store.close()
    again = RunStore.open(tiny_disk / "trials.db", readonly=True)
    assert again.status() == "interrupted" and again.trial(tid).outcome is Outcome.OK
    again.close()
    conn = sqlite3.connect(tiny_disk / "trials.db")
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    conn.close()
    store = RunStore.open(tiny_disk / "trials.db")
    with pytest.raises(DiskFull):  # a run cannot resume until space is freed
        store.ensure_reserve()
    (tiny_disk / "filler").unlink()
    store.ensure_reserve()
    assert store.reserve_path.stat().st_size >= 1 << 20
    store.close()


# The previous release's tables, verbatim: written by one script at creation, no user_version;
# trial_flags and repetition_times appeared only once a write needed them.
_PREVIOUS_RELEASE_SCHEMA = """
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
_PREVIOUS_RELEASE_FLAGS = """CREATE TABLE IF NOT EXISTS trial_flags(
    trial_id INTEGER NOT NULL REFERENCES trials(id), kind TEXT NOT NULL, detail TEXT,
    PRIMARY KEY (trial_id, kind))"""


def _previous_release_store(db, *, with_flags: bool):
    """A store as the previous release left it: one finished trial, one still running when
    the controller died; with `with_flags`, the lazily created flags table too."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(_PREVIOUS_RELEASE_SCHEMA)
    conn.executemany("INSERT INTO meta VALUES (?, ?)", [("schema_version", "1"), ("run_id", "old"),
                                                        ("command", "bisect"), ("created_at", "1")])
    conn.execute("INSERT INTO runs VALUES ('old', 'bisect', 'running', 1, 1, 'a: 1\n', NULL)")
    cand = Candidate.make("c" * 40)
    import json

    conn.execute("INSERT INTO candidates VALUES (1, ?, ?, ?)",
                 (cand.key, json.dumps(cand.to_json(), sort_keys=True), cand.label))
    conn.execute("INSERT INTO trials(candidate_id, node, state, outcome, created_at, started_at,"
                 " ended_at) VALUES (1, 'n0', 'done', 'ok', 1, 1, 2)")
    conn.execute("INSERT INTO trial_states VALUES (1, 'pending', 1)")
    conn.execute("INSERT INTO measurements VALUES (1, 0, 'verify_ms', 19.5)")
    conn.execute("INSERT INTO trials(candidate_id, node, state, created_at) VALUES (1, 'n1',"
                 " 'pending', 3)")
    if with_flags:
        conn.execute(_PREVIOUS_RELEASE_FLAGS)
        conn.execute("INSERT INTO trial_flags VALUES (1, 'outlier', 'far off')")
    conn.close()
    return cand


@pytest.mark.parametrize("with_flags", [False, True])
def test_a_store_of_the_previous_release_opens_resumes_and_reads(tmp_path, with_flags):
    """A store written before the tables were versioned (user_version 0, tables created
    lazily or not yet) opens, is brought to the current version once, resumes (the dead
    trial interrupted, new trials written with every table) and reads back what it had."""
    from orchestrator.store.schema import SCHEMA_VERSION

    db = tmp_path / "trials.db"
    cand = _previous_release_store(db, with_flags=with_flags)
    store = RunStore.open(db)
    assert store.run_id == "old" and store.command == "bisect" and store.config_yaml() == "a: 1\n"
    assert sqlite3.connect(db).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.interrupt_unfinished() == [2]
    first = store.trial(1)
    assert first.outcome is Outcome.OK and first.candidate == cand
    assert first.result.measurements == (Measurement(0, {"verify_ms": 19.5}, None),)
    assert store.trial_flags("outlier") == ({1: {"outlier": "far off"}} if with_flags else {})
    tid = store.begin_trial(store.candidate_id(cand), node="n0")
    store.finish_trial(tid, TrialResult(Outcome.OK, measurements=(Measurement(0, {"verify_ms": 20.0},
                                                                              1.5),)))
    store.set_trial_flags("outlier", {tid: "new"})
    store.close()
    again = RunStore.open(db)  # a second open finds nothing left to migrate
    assert again.trial(tid).result.measurements == (Measurement(0, {"verify_ms": 20.0}, 1.5),)
    assert again.trial_flags("outlier") == {tid: {"outlier": "new"}}
    assert [r.outcome for r in again.trials()] == [Outcome.OK, Outcome.INTERRUPTED, Outcome.OK]


def test_a_previous_release_store_reads_read_only_without_being_changed(tmp_path):
    """Read-only (a report, a noise prior from an old run) the migration runs on a copy in
    memory: the file keeps its bytes, and every table reads as in a current store."""
    db = tmp_path / "trials.db"
    _previous_release_store(db, with_flags=False)
    before = db.read_bytes()
    store = RunStore.open(db, readonly=True)
    assert [r.outcome for r in store.trials()] == [Outcome.OK, None]
    assert store.trial(1).result.measurements[0].seconds is None
    assert store.trial_flags() == {}
    store.close()
    assert db.read_bytes() == before


def test_a_store_from_a_newer_release_is_refused_in_one_line(tmp_path):
    from orchestrator.store.schema import SCHEMA_VERSION

    _store(tmp_path).close()
    sqlite3.connect(tmp_path / "trials.db").execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    with pytest.raises(UserError, match="written by a newer sleuth"):
        RunStore.open(tmp_path / "trials.db")
    with pytest.raises(UserError, match="written by a newer sleuth"):
        RunStore.open(tmp_path / "trials.db", readonly=True)


def test_a_new_store_is_at_the_current_version_with_every_table(tmp_path):
    from orchestrator.store.schema import MIGRATIONS, SCHEMA_VERSION

    _store(tmp_path).close()
    conn = sqlite3.connect(tmp_path / "trials.db")
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == len(MIGRATIONS)
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert {"meta", "runs", "candidates", "trials", "trial_states", "measurements",
            "fingerprints", "trial_flags", "repetition_times"} <= tables


def test_a_run_whose_writer_was_killed_reads_stopped_not_running(tmp_path):
    """A SIGKILLed controller cannot store "interrupted": its run stays "running" in the
    store. The writer lock tells the two apart: while a process holds it the report says who
    runs it, and once the kernel has dropped it with the process the report says the run
    stopped without a word and how to continue it."""
    import os
    import signal
    import subprocess
    import sys

    from orchestrator.ui.report.collect import load_run

    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    child = subprocess.Popen(
        [sys.executable, "-c",
         "import sys; from pathlib import Path; from orchestrator.store import RunStore\n"
         f"s = RunStore.create(Path({str(run_dir / 'trials.db')!r}), run_id='r1',"
         " command='bisect', config_yaml='a: 1\\n')\n"
         "s.claim(); print('ready', flush=True); sys.stdin.read()"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "ready"
        assert RunStore.writer_of(run_dir) == f"sleuth bisect (pid {child.pid})"
        assert load_run(run_dir).status == f"running: sleuth bisect (pid {child.pid})"
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    assert RunStore.writer_of(run_dir) == ""
    assert load_run(run_dir).status == ("stopped without a word (no process writes it; sleuth"
                                        " resume r1 continues it)")
    assert RunStore.writer_of(tmp_path) is None  # a run from before the lock: not told
