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
