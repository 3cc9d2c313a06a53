"""Load: a 200-trial sweep over 4 simulated nodes completes with a store that adds up.

One real `sleuth sweep` (CLI entry point, real sim servers, real Ray, real Optuna storage) of
the shipped `nccl_pcie` space (7056 configurations, so the 200 restarts are mostly distinct
configurations, with pruning and re-measured leaders among them), then the run's two
databases and its findings are audited against each other.

Why 4 node actors on the session's local Ray rather than `ray.cluster_utils.Cluster` with 4
worker nodes (as `test_multinode.py` does for placement): on a 2-core machine both ran the same
200-trial sweep in about 100 s, but the cluster needs ~10 s more to start its five raylets in a
subprocess of its own, and what this test checks (the store under a long run with 4 nodes in
flight) does not depend on where Ray places the actors (`test_multinode.py` covers that). Per
trial the time goes to the server lifetime itself (launch ~0.35 s, ready ~0.25 s, warm-up ~0.15
s, two repetitions ~0.8 s, on 2 busy cores).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections import Counter, defaultdict
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial, TrialState

from orchestrator.cli import run as cli_run
from orchestrator.control.controller import RETRYABLE
from orchestrator.control.drive import observation
from orchestrator.records import Outcome
from orchestrator.store import RunStore, TrialRow
from orchestrator.strategies.sweep.work import parse_phase
from tests.conftest import _our_processes

TRIALS = 200
NODES = 4
RETRIES = 1  # trial.retries (the default, given explicitly: the accounting below uses it)
REPETITIONS = 2
CONFIRM_MIN_ROUNDS, CONFIRM_ROUNDS = 2, 3
METRIC = "verify_ms"
FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        f"bench.repetitions={REPETITIONS}", "trial.ready_timeout_s=30"]


def _final(rows: list[TrialRow]) -> tuple[list[TrialRow], list[TrialRow]]:
    """(final attempts, retried attempts). A retried attempt is a retryable failure the
    controller ran again: same node, phase and candidate, attempt + 1, a later trial id."""
    retries: dict[int, int] = {}  # retried attempt -> its retry
    for row in rows:
        if row.outcome in RETRYABLE and row.attempt <= RETRIES:
            later = [r.id for r in rows if r.id > row.id and r.attempt == row.attempt + 1
                     and r.id not in retries.values()
                     and (r.node, r.phase, r.candidate.key)
                     == (row.node, row.phase, row.candidate.key)]
            assert later, f"trial {row.id} ({row.outcome}) was never retried"
            retries[row.id] = min(later)
    return ([r for r in rows if r.id not in retries], [r for r in rows if r.id in retries])


def _check_row(row: TrialRow, run_dir: Path) -> None:
    """A finished trial whose fields agree with its outcome."""
    assert row.state == "done" and row.outcome is not None and row.result is not None, row
    assert row.outcome is not Outcome.INTERRUPTED, row  # nothing stopped this run
    assert row.started_at is not None and row.ended_at is not None
    assert 0 < row.started_at <= row.ended_at
    assert 1 <= row.attempt <= RETRIES + 1
    states = [s for s, _ in row.result.states]
    assert states[0] == "pending" and states[-1] == "done", states
    # its own directory: two trials never share a log
    assert Path(row.log_path) == run_dir / "trials" / str(row.id) / "server.log"
    if row.outcome is Outcome.OK:
        reps = [m.repetition for m in row.result.measurements]
        assert reps == list(range(REPETITIONS)), (row.id, reps)
        values = row.result.values(METRIC)
        assert len(values) == REPETITIONS and all(v > 0 for v in values), (row.id, values)
        fp = row.result.fingerprint
        assert fp["host"]["node"] == row.node  # the node that ran it is the one recorded
        assert fp["env"]["requested"] == row.candidate.env_dict  # and it ran this candidate
        assert fp["git"]["sha"] == row.candidate.commit
        assert fp["teardown"]["clean"] is True
        assert Path(row.log_path).is_file()
    else:  # a failure is never a measurement, and it says why
        assert row.result.measurements == () and row.detail, (row.id, row.outcome)


def _check_raw_tables(db: Path) -> None:
    """Nothing in the side tables points at a trial that does not exist, nothing is torn."""
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert conn.execute("PRAGMA foreign_key_check").fetchall() == []
        for table in ("measurements", "fingerprints", "trial_states"):
            orphans = conn.execute(f"SELECT COUNT(*) FROM {table} WHERE trial_id NOT IN"
                                   " (SELECT id FROM trials)").fetchone()[0]
            assert orphans == 0, table
        unused = conn.execute("SELECT COUNT(*) FROM candidates WHERE id NOT IN"
                              " (SELECT candidate_id FROM trials)").fetchone()[0]
        assert unused == 0
        unfinished = conn.execute("SELECT COUNT(*) FROM trials WHERE outcome IS NULL"
                                  " OR state != 'done'").fetchone()[0]
        assert unfinished == 0


def _check_nodes(rows: list[TrialRow]) -> None:
    """All 4 nodes ran trials, one at a time each, and the 4 really ran side by side."""
    by_node: dict[str, list[TrialRow]] = defaultdict(list)
    for row in rows:
        by_node[row.node].append(row)
    assert sorted(by_node) == [f"local-{i}" for i in range(NODES)]
    assert all(len(node_rows) > 0 for node_rows in by_node.values())
    for name, node_rows in by_node.items():
        spans = sorted((r.started_at, r.ended_at, r.id) for r in node_rows)
        for (_, end, a), (start, _, b) in zip(spans, spans[1:], strict=False):
            assert start >= end, f"trials {a} and {b} overlapped on {name}"
    events = sorted([(r.started_at, 1) for r in rows] + [(r.ended_at, -1) for r in rows])
    running, peak = 0, 0
    for _, step in events:  # an end sorts before a start at the same instant
        running += step
        peak = max(peak, running)
    assert peak == NODES


def _values_by_key(rows: list[TrialRow], kinds: set[str]) -> dict[str, list[float]]:
    """Measured values of the final rows of the given phase kinds, per candidate key."""
    out: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        o = observation(row, 0, METRIC, RETRIES + 1)
        if parse_phase(row.phase)[0] in kinds and o is not None and o.value is not None \
                and not o.suspect:
            out[row.candidate.key].append(o.value)
    return out


def _check_study(study: optuna.Study, search_rows: dict[int, TrialRow],
                 baseline_rows: list[TrialRow]) -> None:
    """Every Optuna trial the sampler was told about maps to restarts in trials.db, and every
    search restart maps to exactly one Optuna trial, with the value the store holds."""
    trials: dict[int, FrozenTrial] = {t.number: t for t in study.get_trials(deepcopy=False)}
    assert not [t.number for t in trials.values()
                if t.state in (TrialState.RUNNING, TrialState.WAITING)]
    measured = _values_by_key([*search_rows.values(), *baseline_rows], {"search", "baseline"})
    # store -> study: sweep/search/N is Optuna trial N, same candidate, same reported value
    for number, row in search_rows.items():
        t = trials[number]
        assert t.user_attrs["candidate"] == row.candidate.key, number
        o = observation(row, 0, METRIC, RETRIES + 1)
        if o.value is None:
            assert t.state == TrialState.FAIL, number
        else:
            assert t.state in (TrialState.COMPLETE, TrialState.PRUNED), (number, t.state)
            assert t.intermediate_values == {0: pytest.approx(o.value, rel=1e-12)}, number
    # study -> store
    (base,) = [t for t in trials.values() if t.user_attrs.get("baseline")]
    base_key = baseline_rows[0].candidate.key
    assert base.user_attrs["candidate"] == base_key and base.number not in search_rows
    if len(measured[base_key]) == 1:
        assert base.value == pytest.approx(measured[base_key][0], rel=1e-12)
    else:  # the sampler also proposed the baseline's configuration: the mean of some of them
        assert min(measured[base_key]) - 1e-9 <= base.value <= max(measured[base_key]) + 1e-9
    pruned_keys = {t.user_attrs["candidate"] for t in trials.values()
                   if t.state == TrialState.PRUNED and t.number in search_rows}
    for t in trials.values():
        if t.state not in (TrialState.COMPLETE, TrialState.PRUNED) or t is base:
            continue
        key = t.user_attrs["candidate"]
        if t.number not in search_rows:  # answered without a restart: pruned on an earlier one
            assert t.state == TrialState.PRUNED and t.user_attrs["note"] == "pruned earlier"
            assert key in pruned_keys and measured[key], t.number
            continue
        if t.state == TrialState.COMPLETE:  # the mean of that configuration's restarts so far
            assert min(measured[key]) - 1e-9 <= t.value <= max(measured[key]) + 1e-9
    with_restarts = [n for n in trials if n in search_rows]
    assert len(with_restarts) == len(search_rows) == TRIALS - len(baseline_rows)


def _check_findings(doc: dict, run_dir: Path, study: optuna.Study, final: list[TrialRow],
                    confirm_rows: list[TrialRow], n_search: int) -> None:
    """findings.json names a best configuration, backed by exactly the store's restarts."""
    assert doc["experiment"] == "sweep" and doc["run"] == run_dir.name
    assert doc["space"] == "nccl_pcie" and doc["space_size"] == 7056
    assert doc["n_trials"] == n_search + len(confirm_rows)
    best = doc["findings"][0]
    assert best["rank"] == 1 and best["id"] and best["config"]
    for name, level in best["config"].items():  # the candidate is the configuration named
        assert best["candidate"]["env"].get(name) == (None if level is None else str(level))
    (confirmed,) = doc["confirmed"]
    assert best["after_key"] == confirmed["key"] != best["before_key"] == doc["baseline"]["key"]
    assert study.user_attrs["confirm"] == [best["before_key"], best["after_key"]]
    assert sorted(best["evidence"]) == sorted(r.id for r in confirm_rows)
    assert doc["system_changes"] == []  # 200 restarts on 4 nodes, no false alarm
    search = _values_by_key(final, {"search", "baseline"})
    confirm = _values_by_key(final, {"confirm"})
    for side in (doc["baseline"], confirmed):
        assert sorted(side["search"]) == pytest.approx(sorted(search[side["key"]]), rel=1e-12)
        assert sorted(side["confirm"]) == pytest.approx(sorted(confirm[side["key"]]), rel=1e-12)


# The soak lane (`pytest -m soak`): 40 s of the default lane's budget for what the soak's
# 500-trial bisect also checks (a consistent store after hundreds of trials on several nodes).
@pytest.mark.soak
@pytest.mark.e2e
def test_200_trial_sweep_on_4_nodes_leaves_a_consistent_store(tmp_path, ray_session, sim_repo):
    repo, shas = sim_repo
    runs = tmp_path / "runs"
    code = cli_run(["sweep", f"repo={repo}", f"commit={shas[0]}", f"runs_dir={runs}",
                    "space=nccl_pcie", f"metric={METRIC}", f"trials={TRIALS}", f"nodes={NODES}",
                    "cluster=local", "seed=1", f"trial.retries={RETRIES}",
                    f"experiment.params.confirm_min_rounds={CONFIRM_MIN_ROUNDS}",
                    f"experiment.params.confirm_rounds={CONFIRM_ROUNDS}", *FAST])
    (run_dir,) = [p for p in runs.iterdir() if not p.name.startswith(".")]
    doc = json.loads((run_dir / "findings.json").read_text())
    assert code in (0, 3), doc["message"]  # found, or finished but inconclusive

    # Nothing is left running: the sweep returns after every teardown, each node's record of
    # its running server is cleared, and no process works in the run's directories (the
    # servers' cwd is their worktree under runs/.cache, inside tmp_path, so the conftest's
    # autouse guard checks the same again after the test).
    assert not list((runs / ".nodes").glob("*/server.json"))
    assert not _our_processes(runs)

    _check_raw_tables(run_dir / "trials.db")
    store = RunStore.open(run_dir / "trials.db")
    try:
        assert store.command == "sweep"
        assert store.status() == ("done" if code == 0 else "inconclusive")
        rows = store.trials()
    finally:
        store.close()
    assert len({r.id for r in rows}) == len(rows)
    for row in rows:
        _check_row(row, run_dir)
    _check_nodes(rows)

    # Budget: exactly TRIALS search restarts (baseline included), each evaluation once.
    final, retried = _final(rows)
    assert all(observation(r, 0, METRIC, RETRIES + 1) is not None for r in final)
    kinds = Counter(parse_phase(r.phase)[0] for r in final)
    assert set(kinds) == {"baseline", "search", "confirm"}
    baseline_rows = [r for r in final if parse_phase(r.phase)[0] == "baseline"]
    assert len(baseline_rows) == 1  # experiment.params.restarts = 1
    search_numbers = Counter(parse_phase(r.phase)[1] for r in final
                             if parse_phase(r.phase)[0] == "search")
    assert max(search_numbers.values()) == 1  # no Optuna trial was measured twice
    assert kinds["baseline"] + kinds["search"] == TRIALS
    # The confirmation: whole interleaved rounds of the baseline and the best, each side once.
    confirm_rows = [r for r in final if parse_phase(r.phase)[0] == "confirm"]
    rounds = Counter(parse_phase(r.phase)[1] for r in confirm_rows)
    assert sorted(rounds) == list(range(len(rounds)))
    assert CONFIRM_MIN_ROUNDS <= len(rounds) <= CONFIRM_ROUNDS
    assert set(rounds.values()) == {2}
    for r in range(len(rounds)):
        keys = {row.candidate.key for row in confirm_rows if parse_phase(row.phase)[1] == r}
        assert keys == {doc["findings"][0]["before_key"], doc["findings"][0]["after_key"]}
    assert len(rows) == TRIALS + len(confirm_rows) + len(retried)

    study = optuna.load_study(study_name=run_dir.name,
                              storage=f"sqlite:///{run_dir / 'optuna.db'}")
    search_rows = {parse_phase(r.phase)[1]: r for r in final
                   if parse_phase(r.phase)[0] == "search"}
    _check_study(study, search_rows, baseline_rows)
    _check_findings(doc, run_dir, study, final, confirm_rows, TRIALS)
    assert math.isfinite(doc["findings"][0]["effect"][METRIC]["pct"])
