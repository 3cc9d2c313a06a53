"""What a trial and a run pay beyond the bench itself, kept small without losing a check.

Pure or nearly pure tests: the readiness schedule, telemetry on a node without GPUs, the
shared TLS context, the prompts made once, one commit per dispatched trial, and the lean
local Ray head (its start is exercised for real by every test that uses `ray_session`).
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from orchestrator.bench import http
from orchestrator.bench.client import make_requests
from orchestrator.control import ray_cluster
from orchestrator.gpu.base import NoGpuControl
from orchestrator.records import Candidate
from orchestrator.runner.telemetry import TelemetrySampler
from orchestrator.runner.trial_checks import (
    READY_FAST_S,
    READY_MAX_POLL_S,
    READY_POLL_S,
    ready_delay,
)
from orchestrator.store import RunStore


def test_readiness_is_polled_every_20_ms_early_and_at_most_every_second_later():
    early = [ready_delay(t / 10) for t in range(int(READY_FAST_S * 10))]
    assert max(early) == READY_POLL_S == 0.02
    later = [ready_delay(READY_FAST_S + t) for t in range(0, 120)]
    assert later == sorted(later) and later[-1] == READY_MAX_POLL_S == 1.0
    # A server that takes minutes is not probed 20 times a second for all of them.
    assert sum(1 for t in range(60, 600) if ready_delay(t) < 1.0) == 0


def test_telemetry_without_gpus_neither_samples_nor_scans_processes():
    def own_pids():
        raise AssertionError("no GPU: the trial's processes need not be listed")

    sampler = TelemetrySampler(NoGpuControl(), 0.05, own_pids).start()
    summary = sampler.stop()
    assert summary["n_samples"] == 0 and not summary["suspect"] and summary["errors"] == []


class _KeepAlive(BaseHTTPRequestHandler):
    """An HTTP/1.1 server that keeps connections open and notes each one's client port."""

    protocol_version = "HTTP/1.1"
    connections: list[int] = []

    def do_GET(self):  # noqa: N802 - the stdlib's name
        type(self).connections.append(self.client_address[1])
        body = b"ok" if self.path != "/metrics" else b'sglang:num_running_reqs{a="b"} 1\n'
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def keep_alive_server():
    _KeepAlive.connections = []
    server = HTTPServer(("127.0.0.1", 0), _KeepAlive)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


def test_one_tls_context_serves_every_client(keep_alive_server):
    assert http.tls_context() is http.tls_context()
    with http.client() as client:
        r = client.get(f"{keep_alive_server}/health", timeout=5)
    assert r.status_code == 200 and r.text == "ok"


def test_a_target_reuses_one_connection_until_it_is_closed(tmp_path, keep_alive_server):
    """Readiness polls and scrapes of a trial share the target's client (one connection, not
    one per call); `close` ends it, and a later call opens a new one."""
    from orchestrator.targets.base import NodeContext, Target

    class Probed(Target):  # the base class's readiness probe and scrape
        def command(self, worktree, port):
            return []

    target = Probed({"name": "sim"}, {}, NodeContext("n0", tmp_path))
    assert target.is_ready(keep_alive_server) and target.is_ready(keep_alive_server)
    assert target.scrape(keep_alive_server) == {("sglang:num_running_reqs", (("a", "b"),)): 1.0}
    assert len(_KeepAlive.connections) == 3 and len(set(_KeepAlive.connections)) == 1
    first = target.http
    target.close()
    assert first.is_closed
    assert target.is_ready(keep_alive_server)
    assert len(set(_KeepAlive.connections)) == 2 and target.http is not first
    target.close()


def test_prompts_are_made_once_and_each_caller_gets_its_own_list():
    a, b = make_requests(4, 16, 8, 0), make_requests(4, 16, 8, 0)
    assert a == b and a is not b
    a.clear()
    assert len(make_requests(4, 16, 8, 0)) == 4
    assert make_requests(4, 16, 8, 1) != b  # another seed, other prompts


def test_a_dispatched_trial_is_one_commit_with_its_log_path(tmp_path, monkeypatch):
    store = RunStore.create(tmp_path / "trials.db", run_id="r", command="bisect",
                            config_yaml="a: 1\n")
    cid = store.candidate_id(Candidate.make("a" * 40))
    commits = []
    original = store._write

    def counted(body):
        commits.append(body)
        return original(body)

    monkeypatch.setattr(store, "_write", counted)
    tid = store.begin_trial(cid, node="local-0", log_path=lambda t: f"/runs/r/trials/{t}/log")
    assert len(commits) == 1
    assert store.trial(tid).log_path == f"/runs/r/trials/{tid}/log"


def test_the_lean_head_skips_three_processes_only_while_it_starts():
    from ray._private.node import Node

    before = {name: Node.__dict__[name] for name in ray_cluster.LEAN_SKIPS}
    with ray_cluster.lean_head():
        for name in ray_cluster.LEAN_SKIPS:
            assert getattr(Node, name)(object()) is None
    assert {name: Node.__dict__[name] for name in ray_cluster.LEAN_SKIPS} == before


@pytest.mark.parametrize(("configured", "nodes", "want"),
                         [(None, 1, 1), (None, 2, 2), (3, 1, 3), (None, None, None)])
def test_the_local_instance_prestarts_one_worker_per_node(configured, nodes, want, monkeypatch):
    monkeypatch.setattr(ray_cluster.os, "cpu_count", lambda: 2)
    assert ray_cluster.local_workers({"num_cpus": configured}, nodes) == want
    assert ray_cluster.local_workers({}, 8) == 2  # never more than the machine has


# Two controllers one after the other in one process (as `sleuth demo` runs them), on a
# command target: the second finds Ray up and its node free at once.
TWO_CONTROLLERS = r"""
import json, sys
from pathlib import Path
from omegaconf import OmegaConf
from orchestrator.control import ray_cluster
from orchestrator.config.compose import compose_settings
from orchestrator.control.controller import Controller
from orchestrator.records import Candidate
from orchestrator.commands import parts
from orchestrator.commands.parts import create_run

repo, sha, runs = sys.argv[1:4]
cfg = compose_settings("trial", ["target=command", f"repo={repo}", f"runs_dir={runs}",
                               "target.bench=echo 1", "bench.repetitions=1",
                               "bench.warmup_requests=0"])
run_dir, store = create_run(cfg)
seen = []
for _ in range(2):
    with Controller(parts.control(cfg), store, run_dir) as ctl:
        ctl.submit(Candidate.make(sha))
        row = next(rows[0] for rows in iter(ctl.wait, None) if rows)
        seen.append({"outcome": row.outcome.value, "instance": ray_cluster._instance()})
print(json.dumps(seen))
"""


@pytest.mark.e2e  # starts Ray in a child process
def test_one_ray_instance_serves_every_controller_of_a_command(tmp_path):
    import json
    import os
    import subprocess
    import sys

    repo = tmp_path / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    for args in (["init", "-q"], ["commit", "-q", "--allow-empty", "-m", "c"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, check=True, text=True,
                         capture_output=True).stdout.strip()
    done = subprocess.run([sys.executable, "-c", TWO_CONTROLLERS, str(repo), sha,
                           str(tmp_path / "runs")], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-2000:]
    first, second = json.loads(done.stdout.strip().splitlines()[-1])
    assert first["outcome"] == second["outcome"] == "ok"
    assert first["instance"] == second["instance"] != ""  # started once, used twice


def test_a_closed_node_actor_gives_its_node_back_while_its_process_lives(tmp_path):
    from orchestrator.runner.node import NodeRunner
    from orchestrator.runner.trial import TrialSpec

    conf = {"name": "command", "bench": "echo 1"}
    first = NodeRunner("local-0", str(tmp_path / "node"), conf, {"repetitions": 1})
    assert first.held_by is None
    assert NodeRunner("local-0", str(tmp_path / "node"), conf, {}).held_by is not None
    assert first.close(timeout_s=1)
    second = NodeRunner("local-0", str(tmp_path / "node"), conf, {})
    assert second.held_by is None  # the node is the next actor's at once
    spec = TrialSpec(trial_id=1, candidate=Candidate.make("a" * 40), repo=str(tmp_path),
                     cache_dir=str(tmp_path / "cache"), trial_dir=str(tmp_path / "t"))
    assert first.run(spec).outcome.value == "error"  # and the closed one runs nothing more


def test_stopping_asks_only_started_actors_to_close_and_kills_every_one(monkeypatch):
    """An actor still starting may be blocked waiting for its node lock; a close sent to it
    would queue behind that and hold the stop for the whole close wait."""
    from orchestrator.control import node_pool

    class Actor:
        def __init__(self, name):
            self.name, self.asked = name, False
            self.close = type("M", (), {"remote": lambda _, s: self._closed(s)})()

        def _closed(self, close_s):
            self.asked = True
            return f"close-{self.name}"

    waited, killed = [], []
    monkeypatch.setattr(node_pool.ray, "wait", lambda refs, **kw: waited.append(refs))
    monkeypatch.setattr(node_pool.ray, "kill", lambda actor: killed.append(actor.name))
    pool = object.__new__(node_pool.NodePool)
    started, joining = Actor("started"), Actor("joining")
    pool.actors, pool._joining = {"n0": started}, {"hello-ref": ("n1", joining)}
    pool.kill_all(close_s=5)
    assert started.asked and not joining.asked
    assert waited == [["close-started"]]
    assert sorted(killed) == ["joining", "started"] and not pool.actors and not pool._joining


def test_the_decision_time_benchmark_drives_the_strategy_to_its_culprit():
    """experiments/overhead_strategy.py measures the strategy through its public API; a small
    size keeps it working as the strategy changes (its timings are the benchmark's, not this)."""
    from experiments.overhead_strategy import one_size

    row = one_size(300, seed=3, profile=True)
    assert row["status"] == "found" and row["found"]
    assert row["decisions"] >= 5 and row["propose_ms"] > 0 and row["verdict_ms"] > 0
    assert row["profile"] and "ms/decision" in row["profile"][0]
