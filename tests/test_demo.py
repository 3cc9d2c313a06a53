"""`sleuth demo` end to end (what `make demo` runs): the seed's story, told by `sleuth
investigate`, on the simulated node.

One run on a smaller scenario, a quieter node and a shorter modeled server load (5 s, not the
default 20 s: 0.1 s of wall time a restart instead of 0.4 s, over some 130 restarts) than the
default demo, so it checks the mechanics (every step runs, shares one store, and is checked
against `truth.json`), not the statistics: those are the benchmarks' job.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config.compose import compose_settings
from orchestrator.store import RunStore

pytestmark = pytest.mark.e2e

FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=3",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "trial.ready_timeout_s=30"]


def test_demo_tells_the_whole_story_and_matches_the_truth(tmp_path):
    runs = tmp_path / "runs"
    args = [f"runs_dir={runs}", "commits=40", "seed=3", "target.noise_restart_cv=0.005", *FAST]
    cfg = compose_settings("demo", args)
    assert cfg.nodes == 3 and cfg.space.name == "nccl_quick"  # the demo's own defaults

    # as `make demo` runs it: the installed `sleuth`, in a process of its own
    done = subprocess.run([str(Path(sys.executable).parent / "sleuth"), "demo", *args],
                          cwd=tmp_path, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "COLUMNS": "1000"})
    code, printed = done.returncode, done.stdout
    assert "Traceback" not in done.stderr, done.stderr[-3000:]

    assert code == 0, printed[-3000:]
    # ... and the slow server running now: server state named, the demo's server stopped
    assert "sleuth named server state +" in printed and "(requests served)" in printed
    (run_dir,) = [p for p in runs.iterdir() if (p / "trials.db").exists()]
    truth = json.loads((run_dir / "scenario" / "truth.json").read_text())
    ranked = json.loads((run_dir / "findings.json").read_text())
    experiments = sorted(doc["experiment"] for doc in ranked["sources"])
    assert experiments == ["bisect", "compare", "investigate", "isolate", "sweep"]
    assert ranked["experiment"] == "investigate"
    # Its reference trials replay the node as it was then, on purpose: no system change, and
    # none among the trials of the experiments (the isolate one sets clock policies).
    assert ranked["system_changes"] == [] and "the system on" not in printed
    # Its plain-decode reference trials report no verify_ms on purpose: not worth a warning.
    assert "reported no" not in printed

    # The planted code culprit is the top commit finding; the system causes were isolated.
    commits = [f for f in ranked["findings"] if f["kind"] == "commit"]
    assert [c["sha"] for c in truth["culprits"]] == [commits[0]["id"]]
    isolated = {d["key"] for doc in ranked["sources"] if doc["experiment"] == "isolate"
                for f in doc["findings"] for d in f["differences"]}
    assert {"NCCL_PROTO", "power_limit_w"} <= isolated

    # Same code, different result: the compare ranks the fingerprint diff by mechanism (the
    # SM clock under load dropped with the power cap and verify, compute-bound, moved: the
    # power limit leads, clocks before packages), the controllable ones marked.
    compare = next(d for d in ranked["sources"] if d["experiment"] == "compare")
    assert compare["verdict"] == "not_reproduced", compare["message"]
    keys = [d["key"] for d in compare["differences"]]
    assert keys[0] == "power_limit_w" and keys.index("power_limit_w") < keys.index("rich")
    by_key = {d["key"]: d for d in compare["differences"]}
    assert by_key["power_limit_w"]["controllable"]
    assert by_key["NCCL_PROTO"]["factor"] == ["env", "NCCL_PROTO", "LL128"]
    assert compare["total_effect"]["verify_ms"]["ci"][0] > 20

    # One answer names all three causes, each with an interval, and they add up: the
    # remainder is a few percent at most (NCCL_PROTO's saving is a smaller share of a verify
    # pass the culprit made longer, so the effects do not compose exactly).
    answer = ranked["answer"]
    named = {c["id"] for c in answer["causes"]}
    assert {commits[0]["id"], "power_limit_w", "NCCL_PROTO"} <= named, answer["sentence"]
    assert abs(answer["unexplained"]["pct"]) < 5, answer["sentence"]
    assert all(c["ci"][0] > 0 for c in answer["causes"])
    assert answer["settings"] and not any(c["experiment"] == "sweep" for c in answer["causes"])
    # The first line is one line: the total, the causes with their effects, what is left.
    first = answer["headline"]
    assert len(first) <= 200 and first.startswith("verify_ms "), first
    assert commits[0]["id"][:12] in first and "power limit" in first, first
    head = (run_dir / "report.md").read_text().splitlines()[:15]
    assert "simulated node" in head[0]
    assert any(commits[0]["id"][:12] in line and "power limit" in line for line in head), head
    assert "answer:" in printed and "simulated node" in printed

    # The sweep brought back the NCCL protocol the node lost, confirmed against its baseline.
    sweep_doc = next(d for d in ranked["sources"] if d["experiment"] == "sweep")
    assert sweep_doc["verdict"] == "found"
    assert sweep_doc["findings"][0]["config"]["NCCL_PROTO"] in ("LL128", "LL")

    # Every step's trials are in the one store, each phase its own experiment's.
    store = RunStore.open(run_dir / "trials.db")
    rows = store.trials()
    store.close()
    assert rows and all(r.finished for r in rows)
    phases = {(r.phase or "").split("/")[0] for r in rows}
    assert {"reference", "sweep"} <= phases
    assert printed.count(": found") == 4 and "MISSED" not in printed  # 3 + the live server
    assert (run_dir / "report.md").is_file() and (run_dir / "report.html").is_file()
    assert f"report: {run_dir / 'report.html'}" in printed.replace("\n", "")
