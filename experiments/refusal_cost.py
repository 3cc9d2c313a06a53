"""What a refusal costs the user: wall time and CPU time of `sleuth` commands refused as bad
input, each run as a user runs it (the installed entry point, a fresh process).

    python -m experiments.refusal_cost [--runs 5] [--busy 2]

`--busy N` starts N busy loops (`while 1: pass`) beside the commands, as a loaded host, and
stops them after. The refusals: what the typed words decide (a metric or target typo, a run
another process is writing: `config/early.py`), one that needs the composed configuration (an
unknown key), and ones that need the repository (an unknown ref, a range of one commit).
Prints a markdown table: the median and the worst of `--runs` runs.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SLEUTH = str(Path(sys.executable).parent / "sleuth")


def _repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@e",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@e"}
    for args in (["init", "-q", "-b", "main"], ["commit", "-q", "--allow-empty", "-m", "a"],
                 ["commit", "-q", "--allow-empty", "-m", "b"]):
        subprocess.run(["git", *args], cwd=repo, env=env, check=True)
    return repo


def _live_run(base: Path, repo: Path) -> subprocess.Popen:
    """A run whose writer lock another process holds, as a live `sleuth bisect` would."""
    script = (
        "import sys, time\n"
        "from orchestrator.config.compose import compose_settings\n"
        "from orchestrator.commands.parts import create_run\n"
        f"cfg = compose_settings('bisect', ['target=sim', 'repo={repo}', 'good=HEAD~1',"
        f" 'bad=HEAD', 'runs_dir={base / 'runs'}', 'run_id=live'])\n"
        "create_run(cfg)\nprint('ready', flush=True)\ntime.sleep(3600)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


def cases(base: Path, repo: Path) -> dict[str, list[str]]:
    runs = f"runs_dir={base / 'runs'}"
    return {
        "metric typo": ["bisect", "target=sim", f"repo={repo}", "good=HEAD~1", "bad=HEAD",
                        "metric=verfy_ms", runs],
        "target typo": ["trial", "target=simm", f"repo={repo}", runs],
        "resume of a run being written": ["resume", "live", runs],
        "unknown key": ["trial", "target=sim", f"repo={repo}", "bench.repetitons=3", runs],
        "unknown ref": ["bisect", "target=sim", f"repo={repo}", "good=nosuch", "bad=HEAD", runs],
        "good = bad": ["bisect", "target=sim", f"repo={repo}", "good=HEAD", "bad=HEAD", runs],
    }


def measure(argv: list[str]) -> tuple[float, float, int]:
    """(wall s, CPU s, exit code) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    done = subprocess.run([SLEUTH, *argv], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--busy", type=int, default=0)
    args = parser.parse_args()
    busy = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(args.busy)]
    base = Path(tempfile.mkdtemp(prefix="refusal-cost-"))
    repo = _repo(base)
    live = _live_run(base, repo)
    try:
        print(f"| refusal ({args.busy} busy loops, {args.runs} runs) | exit | wall median"
              " (worst) | CPU median (worst) |")
        print("|---|---|---|---|")
        for name, argv in cases(base, repo).items():
            runs = [measure(argv) for _ in range(args.runs)]
            walls, cpus = [r[0] for r in runs], [r[1] for r in runs]
            codes = sorted({r[2] for r in runs})
            print(f"| {name} | {','.join(map(str, codes))} | {statistics.median(walls):.2f} s"
                  f" ({max(walls):.2f}) | {statistics.median(cpus):.2f} s ({max(cpus):.2f}) |")
    finally:
        live.kill()
        for proc in busy:
            proc.kill()


if __name__ == "__main__":
    main()
