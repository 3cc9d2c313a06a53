"""A wall clock that jumps during a trial changes no duration, timeout, ETA or ordering.

The clock is moved for real inside this process (`time.time` goes back an hour at every
reading), where the node runs the trial; the server under test is a real sim process."""

from __future__ import annotations

import io
import time

from rich.console import Console

from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import as_dict
from orchestrator.records import Candidate, Outcome
from orchestrator.run.cost import trial_cost
from orchestrator.runner.node import NodeRunner
from orchestrator.runner.trial import TrialSpec
from orchestrator.store import RunStore
from orchestrator.ui.progress import Progress

HOUR = 3600.0


def _jumping_clock(monkeypatch) -> None:
    """`time.time` moves back an hour each time it is read (an NTP step, `date -s`)."""
    real = time.time
    reads = [0]

    def jumping() -> float:
        reads[0] += 1
        return real() - HOUR * reads[0]

    monkeypatch.setattr(time, "time", jumping)


def test_a_trial_under_a_jumping_wall_clock(tmp_path, sim_repo, monkeypatch):
    repo, shas = sim_repo
    cfg = compose_settings("trial", ["target=sim", "target.time_scale=0.02",
                                   "target.load_seconds=5", "bench.requests=2",
                                   "bench.output_len=32", "bench.input_len=32"])
    target = as_dict(cfg.target)
    node = NodeRunner("local-0", str(tmp_path / "node"), target,
                      as_dict(cfg.bench))
    spec = TrialSpec(trial_id=1, candidate=Candidate.make(shas[0]), repo=str(repo),
                     cache_dir=str(tmp_path / "cache"), trial_dir=str(tmp_path / "t1"),
                     ready_timeout_s=60.0, repetitions=2, warmup_requests=1)
    store = RunStore.create(tmp_path / "trials.db", run_id="jump", command="trial",
                            config_yaml="{}\n")
    cand = store.candidate_id(spec.candidate)
    _jumping_clock(monkeypatch)
    began = time.monotonic()
    first = store.begin_trial(cand, node="local-0")
    result = node.run(spec)
    elapsed = time.monotonic() - began
    second = store.begin_trial(cand, node="local-0")  # after the clock went back more hours
    store.finish_trial(first, result)
    monkeypatch.undo()
    node.close()
    # Timeouts: the server was waited for, warmed up and measured as usual.
    assert result.outcome is Outcome.OK, result.detail
    assert len(result.measurements) == 2 and all(m.seconds > 0 for m in result.measurements)
    # Durations: start to end is the real elapsed time, the states follow each other.
    took = result.ended_at - result.started_at
    assert 0 < took <= elapsed
    times = [t for _, t in result.states]
    assert times == sorted(times) and result.started_at <= times[0]
    cost = trial_cost(result, target)
    assert cost is not None and cost.total > 0 and cost.launch_to_ready is not None
    # The ETA is built on those durations.
    progress = Progress(Console(file=io.StringIO()), live=False)
    rows = store.trials()
    progress.on_trial(rows[0])
    assert 0 < progress.snapshot().mean_duration <= elapsed
    # Ordering: rows in the order they were made, their creation times not reversed.
    assert [r.id for r in rows] == [first, second]
    created = [store._conn.execute("SELECT created_at FROM trials WHERE id=?", (i,)).fetchone()[0]
               for i in (first, second)]
    assert created == sorted(created)
    store.close()
