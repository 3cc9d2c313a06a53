"""A bisect on a real multi-node Ray cluster (`ray.cluster_utils.Cluster`, 3 worker nodes).

Ray allows one connection per process and the session's `ray_session` fixture may already hold
it, so the cluster and the controller run in a subprocess of their own: nothing this test does
can disturb (or be disturbed by) the Ray instance the other tests share.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.store import RunStore
from orchestrator.targets.sim.scenario import generate_scenario

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow

FAST = ["target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=30"]

# Runs in the subprocess: a head without the resource (the controller's host) and three GPU
# "nodes" that joined with --resources '{"sleuth_node": 1}' (or whatever the test passes), then
# `sleuth bisect` with the given overrides through the real CLI entry point.
CLUSTER_SCRIPT = r"""
import json, sys
import ray
from ray.cluster_utils import Cluster

spec = json.loads(sys.argv[1])
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
for _ in range(3):
    cluster.add_node(num_cpus=1, resources=spec["resources"])
cluster.wait_for_nodes()
try:
    from orchestrator.cli import main

    main(["bisect", *spec["overrides"], f"cluster.address={cluster.address}"])
finally:
    ray.shutdown()
    cluster.shutdown()
"""


def _run_in_cluster(overrides: list[str], resources: dict,
                    timeout_s: float = 400) -> subprocess.CompletedProcess:
    spec = json.dumps({"overrides": overrides, "resources": resources})
    proc = subprocess.Popen([sys.executable, "-c", CLUSTER_SCRIPT, spec], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            env={**os.environ, "RAY_DISABLE_USAGE_STATS": "1"})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the cluster's raylets and workers with it
            proc.wait()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_bisect_on_three_ray_nodes_runs_them_concurrently_and_one_trial_per_node(tmp_path):
    scenario = generate_scenario(tmp_path / "sc", 60, 11, "one_culprit")
    truth = scenario.truth
    runs = tmp_path / "runs"
    done = _run_in_cluster([f"repo={scenario.repo}", f"runs_dir={runs}", f"good={truth['good']}",
                            f"bad={truth['bad']}", "metric=verify_ms", "nodes=3", "cluster=ray",
                            "trial.retries=0", *FAST], {"sleuth_node": 1})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run_dir,) = [p for p in runs.iterdir() if not p.name.startswith(".")]
    doc = json.loads((run_dir / "findings.json").read_text())
    assert doc["findings"][0]["id"] == truth["culprits"][0]["sha"]

    rows = [r for r in RunStore.open(run_dir / "trials.db").trials() if r.result is not None]
    by_node: dict[str, list] = {}
    for row in rows:
        by_node.setdefault(row.node, []).append(row)
    # One actor per sleuth node, named <host>-<Ray node id prefix>, and all three used.
    assert len(by_node) == 3
    assert all(re.fullmatch(r".+-[0-9a-f]{8}", name) for name in by_node)
    # The node's identity is in every trial's fingerprint, and it is that node's.
    ids = {}
    for name, node_rows in by_node.items():
        seen = {r.result.fingerprint["host"]["ray_node_id"] for r in node_rows}
        assert len(seen) == 1 and next(iter(seen)).startswith(name[-8:])
        ids[name] = seen.pop()
    assert len(set(ids.values())) == 3
    # Never two trials at once on one node ...
    for node_rows in by_node.values():
        spans = sorted((r.result.started_at, r.result.ended_at) for r in node_rows)
        for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
            assert start >= end
    # ... while different nodes did run at the same time.
    overlapping = sum(
        1 for a in rows for b in rows
        if a.node < b.node and a.result.started_at < b.result.ended_at
        and b.result.started_at < a.result.ended_at
    )
    assert overlapping >= 3


def test_cluster_without_sleuth_nodes_is_refused_with_one_line(tmp_path):
    scenario = generate_scenario(tmp_path / "sc", 20, 1, "one_culprit")
    truth = scenario.truth
    done = _run_in_cluster([f"repo={scenario.repo}", f"runs_dir={tmp_path / 'runs'}",
                            f"good={truth['good']}", f"bad={truth['bad']}", "cluster=ray",
                            *FAST], {"gpu_box": 1})
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("sleuth: error:")]
    assert len(errors) == 1 and "sleuth_node" in errors[0] and "ray start" in errors[0]
