"""A printed `next:` command runs as printed: the shell gives sleuth back the same settings."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from orchestrator.answer.compose import for_compare
from orchestrator.commands import next_step
from orchestrator.config.compose import compose_settings
from orchestrator.ui.report.answer import detail_lines

WHERE = ("target", "bench", "trial", "cluster", "repo", "metric", "nodes", "direction")


def _as_the_shell_reads_it(line: str) -> list[str]:
    """The words a POSIX shell hands to sleuth for this line."""
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + line], capture_output=True,
                         text=True, check=True).stdout
    return out.split("\0")[:-1]


@pytest.mark.parametrize("given", [
    ["target=sim", "repo={repo}", "runs_dir=runs", "target.time_scale=0.02", "bench.requests=2",
     "metric=output_throughput", "nodes=2", "target.env.FOO=a b", "target.env.BAR=$HOME",
     "target.extra_args=[--x,'--y=1']", "trial.ready_timeout_s=30"],
    ["target=command", "repo={repo}", "target.bench=python bench.py --n 3", "runs_dir=r"],
    ["repo={repo}"],
])
def test_the_next_command_keeps_what_the_user_gave(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    given = [g.format(repo=tmp_path / "my repo") for g in given]
    cfg = compose_settings("compare", [*given, "reference=ref-run"])
    line = next_step.command(cfg, "isolate", "reference=ref-run")
    words = _as_the_shell_reads_it(line)
    assert words[:3] == ["sleuth", "isolate", "reference=ref-run"], line
    again = compose_settings("isolate", words[2:])
    for key in WHERE:
        assert getattr(again, key) == getattr(cfg, key), (key, line)
    assert again.runs_dir == str(tmp_path / given_runs_dir(given)), line  # absolute: any cwd
    assert ("target=" in line) == (cfg.target.name != "sglang")


def given_runs_dir(given: list[str]) -> str:
    return next((g.split("=", 1)[1] for g in given if g.startswith("runs_dir=")), "runs")


def test_compare_names_one_next_step_and_it_is_a_command():
    doc = {"run": "cmp", "experiment": "compare", "metric": "verify_ms",
           "verdict": "not_reproduced", "message": "", "reference": {"name": "ref"},
           "total_effect": {}, "n_trials": 3, "findings": [], "differences": []}
    answer = for_compare(doc, next_step="sleuth isolate reference=ref target=sim")
    lines = [ln for ln in detail_lines(answer) if ln.startswith("next:")]
    assert lines == ["next: sleuth isolate reference=ref target=sim"]
    assert shlex.split(lines[0].removeprefix("next: "))[0] == "sleuth"
