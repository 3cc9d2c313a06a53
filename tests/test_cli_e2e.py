"""The commands the documents show only in prose, run as a user types them: the installed
`sleuth`, in a process of its own, on the simulated node.

The doc-command lane (`test_doc_commands.py`) runs every command a fenced block shows; these are
the rest: `compare` and `report` of a reference, as the README's prose names them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import make_sim_repo

pytestmark = pytest.mark.e2e

SLEUTH = str(Path(sys.executable).parent / "sleuth")
FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "trial.ready_timeout_s=30", "target.noise_restart_cv=0.005"]


def _sleuth(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([SLEUTH, *args], cwd=cwd, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "COLUMNS": "1000"})
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done


def test_a_reference_then_compare_then_its_report(tmp_path):
    repo = tmp_path / "repo"
    make_sim_repo(repo, [{}])
    where = [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST]
    made = _sleuth(tmp_path, "trial", *where, "restarts=2", "run_id=ref")
    assert made.returncode == 0, made.stdout[-2000:]
    compared = _sleuth(tmp_path, "compare", *where, "reference=ref", "max_trials=4")
    assert compared.returncode == 0, compared.stdout[-3000:] + compared.stderr[-2000:]
    assert "answer: verify_ms" in compared.stdout
    run_dir = Path([ln.split(": ", 1)[1].split(" ")[0] for ln in compared.stdout.splitlines()
                    if ln.startswith("run directory: ")][-1])
    doc = json.loads((run_dir / "findings.json").read_text())
    assert doc["experiment"] == "compare" and doc["verdict"] in ("reproduced", "unresolved")
    reported = _sleuth(tmp_path, "report", "ref", f"runs_dir={tmp_path / 'runs'}")
    assert reported.returncode == 0, reported.stderr[-2000:]
    assert (tmp_path / "runs" / "ref" / "report.md").is_file()
