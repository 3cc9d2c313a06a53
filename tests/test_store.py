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
