"""A trial's clean-up: every release runs, whatever an earlier one did.

`run_trial` holds a worktree lease, a clock policy, telemetry and (here) a server; at teardown
each is released last-acquired first. A release that raises (a sampler thread that fails, a
teardown that hits an OS error) must not leave the GPUs at the trial's clock or the worktree
leased: the clock restore and the lease release still run (and the target's HTTP client is
closed), and the error still surfaces.
Unit test: fake workspace, GPU, target and server, no process started, no git.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import pytest

from orchestrator.records import Candidate, Outcome
from orchestrator.runner import trial
from orchestrator.targets.base import NodeContext, Target


class Log:
    """What happened, in order."""

    def __init__(self) -> None:
        self.events: list[str] = []


class FakeWorkspace:
    def __init__(self, log: Log, worktree: Path):
        self.log, self.worktree = log, worktree

    @contextmanager
    def lease(self, commit, patches):
        self.log.events.append("lease held")
        try:
            yield self.worktree
        finally:
            self.log.events.append("lease released")

    def worktree_diff_hash(self, worktree) -> str:
        return ""


class FakeGpu:
    name = "fake"

    def __init__(self, log: Log):
        self.log = log

    def snapshot(self) -> dict:
        return {"backend": "fake", "gpus": []}

    def sample(self, own_pids=()):
        return []

    def apply(self, policy):
        self.log.events.append(f"clock applied {policy.locked_mhz}")
        return {"token": policy.locked_mhz}

    def restore(self, token) -> None:
        self.log.events.append(f"clock restored {token['token']}")


class FakeTarget(Target):
    name = "fake"

    def __init__(self, log: Log, *, server: bool):
        super().__init__({"name": "sim"}, {}, NodeContext("n0", Path(".")))
        self.log, self.server = log, server

    @property
    def has_server(self) -> bool:
        return self.server

    def gpu_control(self):
        return FakeGpu(self.log)

    def close(self) -> None:
        self.log.events.append("target closed")
        super().close()

    def node_packages(self):
        return {}

    def command(self, worktree, port):
        return ["serve", f"--port={port}"]

    def environment(self, candidate_env):
        return dict(candidate_env)

    def warm_up(self, base_url, n_requests) -> None:
        return None

    def requests(self, n=None, seed_offset=0):
        return []

    def measure(self, base_url, requests, log_path):
        return {"verify_ms": 19.0}


class RaisingSampler:
    """Telemetry whose stop fails: the first release at teardown."""

    def __init__(self, log: Log):
        self.log = log

    def start(self):
        return self

    def stop(self) -> dict:
        self.log.events.append("telemetry stop raised")
        raise RuntimeError("sampler thread failed")


class DeadServer:
    """A server that exited at once and whose teardown then raises."""

    pid = pgid = 2**22 + 12345
    base_url = "http://127.0.0.1:1"

    def __init__(self, log: Log, log_path: Path):
        self.log, self.log_path = log, log_path

    def poll(self) -> int:
        return 1

    def teardown(self, grace_s: float):
        self.log.events.append("server teardown raised")
        raise OSError("teardown failed")


def _run(tmp_path, monkeypatch, log: Log, *, server: bool):
    monkeypatch.setattr(trial.fingerprint, "collect", lambda **kw: {})
    monkeypatch.setattr(trial, "TelemetrySampler",
                        lambda gpu, interval, pids: RaisingSampler(log) if not server else
                        type("Quiet", (), {"start": lambda s: s, "stop": lambda s: {}})())
    if server:
        monkeypatch.setattr(trial, "launch", lambda argv, **kw: DeadServer(log, kw["log_path"]))
    spec = trial.TrialSpec(trial_id=1, candidate=Candidate.make("a" * 40, clock="locked:1500"),
                           repo=str(tmp_path), cache_dir=str(tmp_path / "cache"),
                           trial_dir=str(tmp_path / "trial"), repetitions=1)
    clocks: list[object] = []
    ws = FakeWorkspace(log, tmp_path)
    return clocks, lambda: trial.run_trial(spec, FakeTarget(log, server=server), node="n0",
                                           on_clock=clocks.append, workspace=lambda _s: ws)


def test_a_raising_telemetry_stop_still_restores_the_clock_and_releases_the_lease(
        tmp_path, monkeypatch):
    log = Log()
    clocks, run = _run(tmp_path, monkeypatch, log, server=False)
    with pytest.raises(RuntimeError, match="sampler thread failed"):
        run()
    assert log.events == ["lease held", "clock applied 1500", "telemetry stop raised",
                          "clock restored 1500", "lease released", "target closed"]
    assert clocks == [{"token": 1500}, None]  # the node's record of the clock cleared too


def test_a_raising_server_teardown_still_restores_the_clock_and_releases_the_lease(
        tmp_path, monkeypatch):
    """The server died before it was ready (a launch failure), then its teardown raised."""
    log = Log()
    clocks, run = _run(tmp_path, monkeypatch, log, server=True)
    with pytest.raises(OSError, match="teardown failed"):
        run()
    assert log.events == ["lease held", "clock applied 1500", "server teardown raised",
                          "clock restored 1500", "lease released", "target closed"]
    assert clocks == [{"token": 1500}, None]


def test_without_a_failing_release_the_trial_is_recorded_and_everything_released(
        tmp_path, monkeypatch):
    log = Log()
    monkeypatch.setattr(RaisingSampler, "stop", lambda self: {})
    clocks, run = _run(tmp_path, monkeypatch, log, server=False)
    result, report = run()
    assert result.outcome is Outcome.OK, result.detail
    assert [m.metrics for m in result.measurements] == [{"verify_ms": 19.0}]
    assert [s for s, _ in result.states] == ["preparing", "warming_up", "benchmarking",
                                             "tearing_down", "done"]
    assert log.events == ["lease held", "clock applied 1500", "clock restored 1500",
                          "lease released", "target closed"]
    assert report is None and clocks == [{"token": 1500}, None]
