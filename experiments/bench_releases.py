"""`sleuth bisect package=NAME` on real wheels: restarts against measuring every release once.

A release line of a small package is written as real wheels into a directory (offline): every
release takes 20 ms to import, the planted slow one and every later one 60 ms (a x3 step). A
git repository holds a benchmark that times the import (`target=command`). Each run is the real
command, `sleuth bisect package=slowpkg good=FIRST bad=LAST packages.find_links=DIR
target=command ...`, on a local Ray instance with 1 or 2 nodes: pip installs each release the
search needs into its overlay, the benchmark runs in it, the answer is read from the run's
findings. What is counted is restarts (benchmark runs), the releases installed, the release
named and its probability, and the exit code.

Measuring every release once costs one restart a release and states nothing with any
confidence; the search must name the planted release at P >= 0.99 for fewer.

Usage: ``python -m experiments.bench_releases`` (``RUNS=10``, ``LINES=10:6,40:23`` as
releases:first-slow, ``NODES=1,2``, ``OUT=FILE`` for the per-run figures as JSON).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from orchestrator.packages.wheels import write_wheel

BENCH = textwrap.dedent("""\
    import json, time
    t0 = time.perf_counter()
    import slowpkg
    print(json.dumps({"value": (time.perf_counter() - t0) * 1000}))
""")


def _git(repo: Path, *args: str) -> None:
    env = {**os.environ, "GIT_AUTHOR_NAME": "b", "GIT_AUTHOR_EMAIL": "b@example.com",
           "GIT_COMMITTER_NAME": "b", "GIT_COMMITTER_EMAIL": "b@example.com"}
    subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True)


def release_line(out: Path, releases: int, first_slow: int) -> list[str]:
    """Wheels of `slowpkg` 1.0 .. 1.(releases-1); those from `first_slow` on import slowly."""
    versions = [f"1.{i}" for i in range(releases)]
    for i, version in enumerate(versions):
        seconds = 0.06 if i >= first_slow else 0.02
        init = f"import time\ntime.sleep({seconds!r})\n__version__ = {version!r}\n"
        write_wheel(out, "slowpkg", version, {"slowpkg/__init__.py": init})
    return versions


def bench_repo(path: Path) -> Path:
    path.mkdir(parents=True)
    _git(path, "init", "-q", "-b", "main")
    (path / "bench.py").write_text(BENCH)
    _git(path, "add", "-A")
    _git(path, "commit", "-q", "-m", "bench")
    return path


def one_run(base: Path, wheels: Path, versions: list[str], nodes: int, run_id: str) -> dict:
    from orchestrator.commands import bisect as bisect_cmd
    from orchestrator.config.compose import compose_settings

    args = ["package=slowpkg", f"good={versions[0]}", f"bad={versions[-1]}",
            f"packages.find_links={wheels}", "target=command",
            f"repo={bench_repo(base / f'proj-{run_id}')}",
            f"target.bench={sys.executable} bench.py", "metric=value", "direction=increase",
            "bench.repetitions=2", "bench.warmup_requests=0", "trial.retries=0",
            f"nodes={nodes}", f"runs_dir={base / 'runs'}", f"run_id={run_id}"]
    with open(base / f"{run_id}.log", "w") as log, contextlib.redirect_stdout(log):
        code = bisect_cmd.run(compose_settings("bisect", args))
    doc = json.loads((base / "runs" / run_id / "findings.json").read_text())
    measured = {s["version"]: s.get("measured", 0) for s in doc["package"]["versions"]}
    top = doc["findings"][0] if doc["findings"] else {}
    return {"releases": len(versions), "nodes": nodes, "exit": code,
            "restarts": sum(measured.values()),
            "installed": sum(1 for count in measured.values() if count),
            "named": top.get("release"), "probability": top.get("probability")}


def main() -> int:
    import ray

    from orchestrator.control.controller import loopback_only
    from orchestrator.control.ray_cluster import lean_head

    runs = int(os.environ.get("RUNS", "10"))
    lines = [tuple(int(x) for x in item.split(":"))
             for item in os.environ.get("LINES", "10:6,40:23").split(",")]
    node_counts = [int(x) for x in os.environ.get("NODES", "1,2").split(",")]
    loopback_only()
    with lean_head():
        ray.init(address="local", num_cpus=max(node_counts), include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False, namespace="sleuth-bench")
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        for releases, first_slow in lines:
            wheels = base / f"wheels-{releases}"
            versions = release_line(wheels, releases, first_slow)
            for run in range(runs):
                for nodes in node_counts:
                    result = one_run(base, wheels, versions, nodes,
                                     f"line{releases}-run{run}-nodes{nodes}")
                    result["planted"] = versions[first_slow]
                    results.append(result)
    ray.shutdown()
    print("| releases | nodes | runs | named right at P >= 0.99, exit 0 | restarts: mean "
          "(each) | releases installed | measuring every release once |")
    print("|---|---|---|---|---|---|---|")
    for releases, _ in lines:
        for nodes in node_counts:
            rows = [r for r in results if r["releases"] == releases and r["nodes"] == nodes]
            right = sum(1 for r in rows if r["named"] == r["planted"] and r["exit"] == 0
                        and (r["probability"] or 0.0) >= 0.99)
            restarts = [r["restarts"] for r in rows]
            installed = sorted({r["installed"] for r in rows})
            print(f"| {releases} | {nodes} | {len(rows)} | {right} | "
                  f"{statistics.mean(restarts):.1f} ({', '.join(map(str, restarts))}) | "
                  f"{'-'.join(map(str, (installed[0], installed[-1]))) if len(installed) > 1 else installed[0]} "
                  f"| {releases} |")
    out = os.environ.get("OUT")
    if out:
        Path(out).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
