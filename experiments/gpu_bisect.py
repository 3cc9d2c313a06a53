"""The device check's bisect: `sleuth bisect target=command` of a GPU matmul benchmark over a
generated repository with one planted slowdown, run without Ray.

What runs is the bisect command's own code: its configuration composed by Hydra
(`config.compose`), checked and planned (`commands.bisect.validate` / `plan`: GitPython over
the repository), a run directory and store (`run.rundir.create_run`), and
`commands.bisect.execute` (the strategy, the drive loop, the repetition design, findings and
the answer) over an in-process node (`gpu_local.LocalController` -> `runner.node.NodeRunner`
-> trial runner, worktrees, NVML telemetry, fingerprints). Only Ray's node actors are left out.

`bench.py` times one n x n bf16 matmul on the GPU with CUDA events; commit `CULPRIT` raises n
from 4096 to 5793 (~2.8x the work). `prepare` runs before any GPU call (so the rehearsal
without a GPU covers the repository, Hydra, GitPython and the plan); `run` needs the GPU.

Where `git` is missing (GitPython drives the git binary), each revision is a plain directory
and a directory workspace (`DirWorkspace`) hands them to the same node and trial runner.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console

from experiments.gpu_local import NODE, LocalController
from experiments.gpu_steps import Step
from orchestrator.commands import bisect as bisect_command
from orchestrator.commands import parts
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import as_dict
from orchestrator.records import Candidate
from orchestrator.runner.node import NodeRunner
from orchestrator.workspace import CommitInfo

BASE_N, SLOW_N, COMMITS, CULPRIT = 4096, 5793, 12, 8
REPETITIONS = 2  # bench runs per restart (each a fresh process: torch import + CUDA init)
SECONDS_PER_TRIAL = 12.0  # a guess for the budget: two runs of ~5 s and the trial's own steps

BENCH_PY = '''"""One repetition: mean ms of an n x n bf16 matmul on the GPU (n from kernel.json)."""
import json
import torch

n = json.load(open("kernel.json"))["n"]
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
iters = 50
start.record()
for _ in range(iters):
    a @ b
end.record()
torch.cuda.synchronize()
print(json.dumps({"value": start.elapsed_time(end) / iters, "n": n}))
'''


def _revision(i: int, culprit: int, base_n: int, slow_n: int) -> dict[str, str]:
    n = slow_n if i >= culprit else base_n
    return {"kernel.json": json.dumps({"n": n}) + "\n", "NOTES": f"revision {i}\n"}


def make_kernel_repo(path: Path, commits: int = COMMITS, culprit: int = CULPRIT,
                     base_n: int = BASE_N, slow_n: int = SLOW_N,
                     bench: str = BENCH_PY) -> list[str]:
    """A git repo whose commit `culprit` (and every later one) multiplies larger matrices."""
    path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "gpu-check", "GIT_AUTHOR_EMAIL": "gpu-check@example.com",
           "GIT_COMMITTER_NAME": "gpu-check", "GIT_COMMITTER_EMAIL": "gpu-check@example.com"}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    (path / "bench.py").write_text(bench)
    shas = []
    for i in range(commits):
        for name, text in _revision(i, culprit, base_n, slow_n).items():
            (path / name).write_text(text)
        git("add", "-A")
        git("commit", "-q", "-m", f"revision {i}" + (" (larger kernel)" if i == culprit else ""))
        shas.append(git("rev-parse", "HEAD"))
    return shas


def make_kernel_dirs(path: Path, commits: int = COMMITS, culprit: int = CULPRIT,
                     base_n: int = BASE_N, slow_n: int = SLOW_N,
                     bench: str = BENCH_PY) -> list[CommitInfo]:
    """Without git: one directory per revision, described as the commits they stand for."""
    infos = []
    for i in range(commits):
        rev = path / f"r{i:02d}"
        rev.mkdir(parents=True, exist_ok=True)
        (rev / "bench.py").write_text(bench)
        for name, text in _revision(i, culprit, base_n, slow_n).items():
            (rev / name).write_text(text)
        infos.append(CommitInfo(sha=rev.name, parents=(f"r{i - 1:02d}",) if i else (),
                                subject=f"revision {i}" + (" (larger kernel)" if i == culprit
                                                           else ""),
                                author="gpu-check", date="", files=("kernel.json", "NOTES")))
    return infos


class DirWorkspace:
    """The workspace surface the trial runner uses, over directories named by revision."""

    def __init__(self, root: Path):
        self.root = root

    @contextlib.contextmanager
    def lease(self, sha: str, patches=()) -> Iterator[Path]:
        if patches:
            raise ValueError("a directory workspace applies no patches")
        yield self.root / sha

    def worktree_diff_hash(self, path: Path | str) -> str | None:
        return None


class DirNodeRunner(NodeRunner):
    """A node whose worktrees are `DirWorkspace` directories (no git on the machine)."""

    def _workspace(self, spec):
        return DirWorkspace(Path(spec.repo))


@dataclasses.dataclass
class Prepared:
    work: Path
    repo: Path
    commits: list[CommitInfo]
    points: list[Candidate]
    weights: list[float] | None
    use_git: bool
    planted: str

    def describe(self) -> dict:
        return {"repo": str(self.repo), "git": self.use_git, "revisions": len(self.commits),
                "planted": self.planted}


def overrides(repo: Path, runs: Path, good: str, bad: str, python: str, gpu: int,
              max_trials: int | None, bench: str = "bench.py") -> list[str]:
    """`sleuth bisect` as a user would type it for this repository."""
    out = ["target=command", f"repo={repo}", f"runs_dir={runs}", f"good={good}", f"bad={bad}",
           f"target.bench={python} {bench}", "direction=increase",
           f"bench.repetitions={REPETITIONS}", "bench.adaptive_repetitions=false",
           "bench.warmup_requests=0", "bench.noise_prior=false", "trial.retries=1", "nodes=1",
           f"target.env.CUDA_VISIBLE_DEVICES={gpu}"]
    return out + ([f"max_trials={max_trials}"] if max_trials is not None else [])


def _compose(prepared: Prepared, python: str, gpu: int, max_trials: int | None):
    good, bad = prepared.commits[0].sha, prepared.commits[-1].sha
    return compose_settings("bisect", overrides(prepared.repo, prepared.work / "runs", good, bad,
                                              python, gpu, max_trials))


def prepare(work: Path, use_git: bool, bench: str = BENCH_PY, python: str = sys.executable,
            **sizes) -> Prepared:
    """The repository, the composed configuration and the plan; no GPU call."""
    if use_git:
        repo = work / "repo"
        shas = make_kernel_repo(repo, bench=bench, **sizes)
        cfg = compose_settings("bisect", overrides(repo, work / "runs", shas[0], shas[-1], python,
                                                 0, None))
        cfg, req = bisect_command.validate(cfg)
        commits, points, weights = bisect_command.plan(cfg, req)
    else:
        repo = work / "revisions"
        commits = make_kernel_dirs(repo, bench=bench, **sizes)
        cfg = compose_settings("bisect", overrides(repo, work / "runs", commits[0].sha,
                                                 commits[-1].sha, python, 0, None))
        points = [Candidate.make(c.sha, [], {}, "default") for c in commits]
        weights = None
    culprit = sizes.get("culprit", CULPRIT)
    return Prepared(work, repo, commits, points, weights, use_git, commits[culprit].sha)


def run(prepared: Prepared, torch_python: str, gpu: int, seconds_left: float, out_dir: Path,
        name: str = "bisect") -> Step:
    """The bisect on the GPU, within ``seconds_left`` (its trial budget follows from it)."""
    t0 = time.monotonic()
    budget = max(12, int(seconds_left / SECONDS_PER_TRIAL))
    cfg = _compose(prepared, torch_python, gpu, budget)
    cfg, req = bisect_command.validate(cfg)
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    log_path = prepared.work / f"{name}.log"
    events: list[str] = []
    with open(log_path, "w") as log:
        out = Console(file=log, width=120, color_system=None)
        runner = None
        if not prepared.use_git:
            runner = DirNodeRunner(NODE, str(Path(cfg.runs_dir) / ".nodes" / NODE),
                                   as_dict(cfg.target),
                                   as_dict(cfg.bench), store.run_id)
        try:
            with LocalController(parts.control(cfg), store, run_dir, on_event=events.append, runner=runner,
                                 deadline=t0 + seconds_left) as ctl:
                verdict, doc = bisect_command.execute(cfg, req, ctl, run_dir, prepared.commits,
                                                      prepared.points, prepared.weights, out)
            store.set_status("done" if verdict.status == "found" else "inconclusive")
            rows = store.trials()
        finally:
            store.close()
    trials = sum(" started on " in e for e in events)
    suspect = [r.suspect_reason for r in rows if r.suspect]
    kept = out_dir / name  # the whole run (store, trial logs, telemetry): `sleuth report` reads it
    shutil.copytree(run_dir, kept / "run", dirs_exist_ok=True)
    shutil.copyfile(run_dir / "findings.json", kept / "findings.json")
    shutil.copyfile(log_path, kept / log_path.name)
    top = doc["findings"][0] if doc.get("findings") else {}
    effect = (top.get("effect") or {}).get("value") or {}
    probability = float(top.get("probability") or 0.0)
    named = top.get("id") == prepared.planted
    # The answer is what is checked: the planted commit, at the promised confidence. A run
    # that named it and then spent its budget on what else might be left says so in `status`.
    ok = named and probability >= 0.99
    data = {"status": verdict.status, "named": top.get("id"), "planted": prepared.planted,
            "probability": probability, "effect": effect, "trials": trials,
            "max_trials": budget, "answer": (doc.get("answer") or {}).get("sentence"),
            "suspect_trials": len(suspect), "suspect_reasons": sorted(set(suspect))[:5],
            "run": run_dir.name, "events": events[-60:]}
    return Step(name, "ok" if ok else "FAIL",
                f"{verdict.status}: named {str(top.get('id'))[:10]} (planted"
                f" {prepared.planted[:10]}) P={probability:.4f}, effect {effect.get('pct')}%"
                f" {effect.get('ci')}, {trials} trials of at most {budget}"
                + (f"; {len(suspect)} suspect (left out): {sorted(set(suspect))[0][:160]}"
                   if suspect else ""),
                time.monotonic() - t0, data)
