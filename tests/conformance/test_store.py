"""The run-store contract (`orchestrator/store/`), through its public API only, on real SQLite.

One backend today; the fixture runs every test on a store as `create` returns it and on one
closed and opened again (what `sleuth resume` gets), since a run must not be able to tell the
two apart. What the controller and the experiments rely on: a trial row exists before the
trial runs and its result after; everything written reads back equal; a reopened store
continues where the last one stopped; a read-only open reads everything and writes nothing;
a second writer's transactions are serialised, never lost; a store is never overwritten.
File-level failures (a damaged page, a full disk, a read-only directory) are in
`tests/test_store.py`.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.errors import UserError
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.store import RunStore, TrialRow

CONFIG = "command: bisect\ntarget:\n  name: sim\n"


def _create(path: Path) -> RunStore:
    return RunStore.create(path, run_id="run-1", command="bisect", config_yaml=CONFIG)


@pytest.fixture(params=["created", "reopened"])
def store(request, tmp_path) -> Iterator[RunStore]:
    db = tmp_path / "trials.db"
    opened = _create(db)
    if request.param == "reopened":
        opened.close()
        opened = RunStore.open(db)
    yield opened
    opened.close()


def _result(value: float, *, node: str = "local-0", suspect: bool = False) -> TrialResult:
    return TrialResult(
        Outcome.OK, measurements=(Measurement(0, {"verify_ms": value, "tok_s": 900.0}, 1.5),
                                  Measurement(1, {"verify_ms": value + 1.0}, None)),
        states=(("preparing", 10.0), ("benchmarking", 11.0), ("done", 12.0)),
        started_at=10.0, ended_at=12.0, node=node,
        fingerprint={"git": {"sha": "a" * 40}, "gpu": {"backend": "sim"}},
        suspect=suspect, suspect_reason="hw_slowdown" if suspect else "")


def _finished(store: RunStore, cand: Candidate, value: float, **kw) -> int:
    tid = store.begin_trial(store.candidate_id(cand), node="local-0", phase="search")
    store.finish_trial(tid, _result(value, **kw))
    return tid


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- the run -----------------------------------------------------------------------------------
def test_the_run_reads_back_what_created_it(store):
    assert (store.run_id, store.command, store.config_yaml()) == ("run-1", "bisect", CONFIG)
    assert store.status() == "running" and store.summary() == {}
    store.set_status("done", {"culprit": "abc", "n": 3})
    store.set_status("reported")  # a status without a summary keeps the last summary
    assert store.status() == "reported" and store.summary() == {"culprit": "abc", "n": 3}


def test_a_store_is_never_overwritten(store):
    with pytest.raises(UserError, match="already exists"):
        _create(store.path)
    assert store.run_id == "run-1" and store.config_yaml() == CONFIG


# -- candidates and trials ---------------------------------------------------------------------
def test_a_candidate_has_one_id_and_reads_back_equal(store):
    cand = Candidate.make("a" * 40, ["p1.patch"], {"NCCL_PROTO": "LL128"}, "locked:1980",
                          {"speculative_num_steps": 3}, {"flashinfer-python": "0.2.5"})
    cid = store.candidate_id(cand)
    again = Candidate.make("a" * 40, ["p1.patch"], {"NCCL_PROTO": "LL128"}, "locked:1980",
                           {"speculative_num_steps": 3}, {"flashinfer-python": "0.2.5"})
    assert store.candidate_id(again) == cid
    assert store.candidate_id(Candidate.make("b" * 40)) != cid
    assert store.candidate(cid) == cand
    with pytest.raises(KeyError):
        store.candidate(cid + 100)


def test_a_trial_is_written_before_it_runs_and_its_result_after(store):
    cand = Candidate.make("a" * 40)
    tid = store.begin_trial(store.candidate_id(cand), node="local-1", phase="reproduce",
                            attempt=2, log_path=lambda t: f"trials/{t}/server.log")
    row = store.trial(tid)
    assert isinstance(row, TrialRow) and not row.finished and row.result is None
    assert (row.state, row.node, row.phase, row.attempt) == ("pending", "local-1", "reproduce", 2)
    assert row.log_path == f"trials/{tid}/server.log" and row.candidate == cand

    store.finish_trial(tid, _result(19.0, node="local-1", suspect=True))
    row = store.trial(tid)
    assert row.finished and row.outcome is Outcome.OK and row.suspect
    r = row.result
    assert [m.metrics for m in r.measurements] == [{"verify_ms": 19.0, "tok_s": 900.0},
                                                   {"verify_ms": 20.0}]
    assert [m.seconds for m in r.measurements] == [1.5, None]
    assert [s for s, _ in r.states] == ["pending", "preparing", "benchmarking", "done"]
    assert r.fingerprint == {"git": {"sha": "a" * 40}, "gpu": {"backend": "sim"}}
    assert (r.node, r.started_at, r.ended_at, r.suspect_reason) == ("local-1", 10.0, 12.0,
                                                                     "hw_slowdown")


def test_a_trial_is_finished_once(store):
    tid = _finished(store, Candidate.make("a" * 40), 19.0)
    with pytest.raises(ValueError, match="already finished"):
        store.finish_trial(tid, _result(25.0))
    assert store.trial(tid).result.value("verify_ms") == pytest.approx(19.5)
    with pytest.raises(KeyError):
        store.finish_trial(tid + 100, _result(1.0))
    with pytest.raises(KeyError):
        store.trial(tid + 100)


def test_a_failed_trial_keeps_its_outcome_and_no_measurement(store):
    tid = store.begin_trial(store.candidate_id(Candidate.make("c" * 40)))
    store.finish_trial(tid, TrialResult(Outcome.LAUNCH_FAILED, "exit code 1: no module named x",
                                        states=(("launching", 5.0),)))
    row = store.trial(tid)
    assert row.outcome is Outcome.LAUNCH_FAILED and row.detail.startswith("exit code 1")
    assert row.result.measurements == ()


def test_trials_come_oldest_first_and_filter_on_the_trial(store):
    ids = [_finished(store, Candidate.make(f"{i:040x}"), 10.0 + i) for i in range(3)]
    other = store.begin_trial(store.candidate_id(Candidate.make("d" * 40)), phase="verify")
    assert [r.id for r in store.trials()] == [*ids, other]
    assert [r.id for r in store.trials(where="t.phase=?", params=("verify",))] == [other]


def test_flags_of_a_kind_are_replaced_together(store):
    a, b = (_finished(store, Candidate.make(c * 40), 19.0) for c in "ab")
    store.set_trial_flags("outlier", {a: "3x its commit's level"})
    store.set_trial_flags("other", {b: "kept"})
    store.set_trial_flags("outlier", {b: "now this one"})
    assert store.trial_flags("outlier") == {b: {"outlier": "now this one"}}
    assert store.trial_flags() == {b: {"outlier": "now this one", "other": "kept"}}


# -- resume ------------------------------------------------------------------------------------
def test_a_reopened_store_continues_where_it_stopped(store):
    done = _finished(store, Candidate.make("a" * 40), 19.0)
    running = store.begin_trial(store.candidate_id(Candidate.make("b" * 40)), node="local-1")
    store.set_trial_flags("outlier", {done: "x"})
    before = store.trials()
    store.close()

    again = RunStore.open(store.path)
    try:
        assert again.trials() == before and again.trial_flags() == {done: {"outlier": "x"}}
        assert again.interrupt_unfinished() == [running]
        assert again.interrupt_unfinished() == []
        row = again.trial(running)
        assert row.outcome is Outcome.INTERRUPTED and row.result.measurements == ()
        assert again.trial(done) == before[0]  # a finished trial is never touched
        nxt = again.begin_trial(again.candidate_id(Candidate.make("a" * 40)))
        assert nxt > running and again.trial(nxt).candidate_id == before[0].candidate_id
    finally:
        again.close()


# -- readers and writers -----------------------------------------------------------------------
def test_a_read_only_open_reads_everything_and_writes_nothing(store):
    tid = _finished(store, Candidate.make("a" * 40), 19.0)
    store.set_status("done", {"n": 1})
    store.close()
    digest = _digest(store.path)
    reader = RunStore.open(store.path, readonly=True)
    try:
        assert reader.status() == "done" and reader.summary() == {"n": 1}
        assert reader.trial(tid).result.value("verify_ms") == pytest.approx(19.5)
        with pytest.raises(sqlite3.OperationalError, match="readonly"):
            reader.begin_trial(reader.candidate_id(Candidate.make("b" * 40)))
    finally:
        reader.close()
    assert _digest(store.path) == digest


def test_a_reader_sees_what_a_live_writer_commits(store):
    reader = RunStore.open(store.path, readonly=True)
    try:
        assert reader.trials() == []
        tid = _finished(store, Candidate.make("a" * 40), 19.0)
        assert [r.id for r in reader.trials()] == [tid]
        assert reader.trial(tid) == store.trial(tid)
    finally:
        reader.close()


def test_two_writers_are_serialised_and_nothing_is_lost(store):
    """A report or a second command may open the run while its controller writes: each
    transaction is whole, ids never collide, and every trial either wrote is kept."""
    other = RunStore.open(store.path)
    try:
        mine = [_finished(store, Candidate.make("a" * 40), 19.0 + i) for i in range(3)]
        theirs = [_finished(other, Candidate.make("a" * 40), 29.0 + i) for i in range(3)]
        mine.append(_finished(store, Candidate.make("b" * 40), 40.0))
        assert len(set(mine + theirs)) == 7
        for handle in (store, other):
            rows = handle.trials()
            assert sorted(r.id for r in rows) == sorted(mine + theirs)
            assert all(r.finished and len(r.result.measurements) == 2 for r in rows)
        assert len({r.candidate_id for r in store.trials()}) == 2
    finally:
        other.close()
