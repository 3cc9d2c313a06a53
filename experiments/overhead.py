"""sleuth's own cost: per trial, per start-up, and per strategy decision, against the bare work.

On a GPU node a restart takes minutes and sleuth's overhead is noise; on a fast bench (a kernel,
an import time, the simulated node of the demo and the tests) it is what the user waits for.
This measures, in one run, through the real CLI (a subprocess, a real local Ray instance):

- **bare bench**: the `target=command` bench (a shell script that sleeps 10 ms and prints a
  number) run from Python in a checkout, as a loop a user would write;
- **target=command**: a bisect over a 64-commit repository whose every commit carries that
  bench (`bench.repetitions=1 bench.warmup_requests=0`: one bench run per trial). A first,
  discarded bisect fills the worktree cache; the measured ones reuse it, as the verify phase and
  any second run do. Per trial: the time from one trial's dispatch to the next one's (the store's
  `created_at`, written before dispatch), minus the bare bench: sleuth's own overhead;
- **target=sim**: a bisect over a 20-commit sim scenario at the default time scale. The modeled
  server time of one trial is the model's load time plus the modeled end-to-end latency of
  every request the trial sends (read from a bare server's `/metrics` after the same requests);
  a **bare server** run (the same argv and environment, ready when its log says so, the same
  requests from one persistent client) shows what the process itself costs beyond the model;
- **start-up**: from spawning `sleuth bisect` to its first trial's start on the node;
- **strategy**: `BisectStrategy.propose()` and `verdict()` per decision at 1,000 / 10,000 /
  50,000 commits, driven by a virtual oracle (no trial runs), with where the time goes.

Figures are medians over trials (and over runs for the start-up); the 1-minute load average is
printed beside them: on a shared machine a figure can be limited by the load, not by sleuth.

    python experiments/overhead.py                     # everything (a few minutes)
    python experiments/overhead.py --only command --runs 4
    python experiments/overhead.py --only strategy --sizes 1000,50000 --profile
    python experiments/overhead.py --json out.json     # the numbers, machine-readable
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments.overhead_strategy import strategy_timings  # noqa: E402

BENCH_SLEEP_S = 0.01
COMMAND_COMMITS = 64
CULPRIT = 40  # the first commit whose bench prints 2.0 instead of 1.0
SIM_COMMITS = 20


def load1() -> float:
    return round(os.getloadavg()[0], 2)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def p10(xs: list[float]) -> float:
    """The 10th percentile: what a trial costs when the machine's other work leaves it alone
    (on a shared machine the median carries their load, the fastest tenth much less of it)."""
    return statistics.quantiles(xs, n=10)[0] if len(xs) >= 10 else min(xs, default=float("nan"))


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def command_repo(path: Path) -> list[str]:
    """64 commits, each with `bench.sh` (sleep 10 ms, print 1.0; 2.0 from commit CULPRIT on)."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "user.email", "bench@example.invalid")
    git(path, "config", "user.name", "bench")
    bench = path / "bench.sh"
    for i in range(COMMAND_COMMITS):
        value = "2.0" if i >= CULPRIT else "1.0"
        bench.write_text(f"#!/bin/sh\n# revision {i}\nsleep {BENCH_SLEEP_S}\necho {value}\n")
        bench.chmod(0o755)
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"revision {i}")
    return git(path, "rev-list", "--reverse", "main").split()


def bare_bench(repo: Path, n: int) -> list[float]:
    """The bench alone: n runs of `./bench.sh` in a checkout, output captured, in ms."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        subprocess.run(["./bench.sh"], cwd=repo, capture_output=True, check=True)
        out.append((time.perf_counter() - t) * 1e3)
    return out


def sleuth(args: list[str], log: Path, timeout_s: float = 900) -> tuple[float, int]:
    """Run the real CLI in a fresh process; returns (spawn time, exit code)."""
    spawned = time.time()
    with open(log, "ab") as f:
        code = subprocess.run([sys.executable, "-m", "orchestrator.cli", *args], stdout=f,
                              stderr=subprocess.STDOUT, timeout=timeout_s).returncode
    return spawned, code


def trials(run_dir: Path) -> list[dict]:
    """The run's trials with the time each of their steps began (`states`)."""
    with sqlite3.connect(run_dir / "trials.db") as db:
        db.row_factory = sqlite3.Row
        rows = [dict(r) for r in db.execute(
            "select id, outcome, created_at, started_at, ended_at from trials order by id")]
        states: dict[int, list[tuple[str, float]]] = {}
        for tid, state, at in db.execute("select trial_id, state, at from trial_states"
                                         " order by trial_id, at"):
            states.setdefault(tid, []).append((state, at))
    for r in rows:
        r["states"] = states.get(r["id"], [])
    return rows


def phases_ms(runs: list[dict]) -> dict[str, float]:
    """Median ms per trial step (from one step's start to the next's), the controller's share
    (dispatch to the node's start, the node's end to the next dispatch) included."""
    spans: dict[str, list[float]] = {}
    for run in runs:
        rows = run["trials"]
        for i, t in enumerate(rows):
            steps = [(s, at) for s, at in t["states"] if s != "pending"]
            for (name, a), (_, b) in zip(steps, steps[1:], strict=False):
                spans.setdefault(name, []).append((b - a) * 1e3)
            spans.setdefault("dispatch->node", []).append((t["started_at"] - t["created_at"]) * 1e3)
            if i + 1 < len(rows):
                spans.setdefault("node->next dispatch", []).append(
                    (rows[i + 1]["created_at"] - t["ended_at"]) * 1e3)
    return {k: round(median(v), 1) for k, v in spans.items()}


def run_dirs(runs: Path) -> set[Path]:
    return {p for p in runs.iterdir() if (p / "trials.db").exists()} if runs.exists() else set()


def measure_runs(args: list[str], runs: Path, n_runs: int, log: Path) -> list[dict]:
    """n_runs fresh `sleuth` processes; per run its trials, spawn time and load."""
    out = []
    for _ in range(n_runs):
        before = run_dirs(runs)
        spawned, code = sleuth(args, log)
        made = sorted(run_dirs(runs) - before)
        if code not in (0, 3) or not made:
            raise SystemExit(f"sleuth {' '.join(args[:1])} exited {code}; see {log}")
        rows = trials(made[-1])
        out.append({"spawned": spawned, "trials": rows, "load1": load1()})
    return out


def periods(run: dict) -> list[float]:
    """Dispatch-to-dispatch seconds of one run's trials (the first trial of a run excluded)."""
    created = [t["created_at"] for t in run["trials"]]
    return [b - a for a, b in zip(created, created[1:], strict=False)]


def first_trial_s(run: dict) -> float:
    return run["trials"][0]["started_at"] - run["spawned"]


def command_section(work: Path, n_runs: int, n_bare: int) -> dict:
    repo = work / "command-repo"
    shas = command_repo(repo)
    runs, log = work / "command-runs", work / "command.log"
    args = ["bisect", "target=command", f"repo={repo}", f"good={shas[0]}", f"bad={shas[-1]}",
            "target.bench=./bench.sh", "metric=value", f"runs_dir={runs}",
            "bench.repetitions=1", "bench.warmup_requests=0"]
    bare = bare_bench(repo, n_bare)
    measure_runs(args, runs, 1, log)  # fills the worktree cache; not counted
    measured = measure_runs(args, runs, n_runs, log)
    per = [p * 1e3 for run in measured for p in periods(run)]
    node = [(t["ended_at"] - t["started_at"]) * 1e3 for run in measured for t in run["trials"]]
    bench_ms = median(bare)
    overhead = median(per) - bench_ms
    return {
        "bare_bench_ms": round(bench_ms, 1),
        "trial_period_ms": round(median(per), 1),
        "node_trial_ms": round(median(node), 1),
        "overhead_ms": round(overhead, 1),
        "overhead_ratio": round(overhead / bench_ms, 2),
        "overhead_p10_ms": round(p10(per) - p10(bare), 1),
        "per_run_overhead_ms": [round(median([p * 1e3 for p in periods(r)]) - bench_ms, 1)
                                for r in measured],
        "n_trials": len(per),
        "steps_ms": phases_ms(measured),
        "first_trial_s": [round(first_trial_s(r), 2) for r in measured],
        "load1": [r["load1"] for r in measured],
    }


def _sim_setup(work: Path) -> tuple[Path, dict]:
    out = work / "sim-scenario"
    code = subprocess.run([sys.executable, "-m", "orchestrator.cli", "scenario", f"out={out}",
                           f"commits={SIM_COMMITS}", "seed=1"], capture_output=True).returncode
    if code != 0:
        raise SystemExit("sleuth scenario failed")
    return out / "repo", json.loads((out / "truth.json").read_text())


def bare_sim(work: Path, repo: Path, sha: str) -> dict:
    """The sim server alone: sleuth's argv and environment, ready when its log says so, the
    trial's requests from one persistent client, then SIGTERM. Returns wall and modeled s."""
    import httpx

    from orchestrator.bench import prometheus
    from orchestrator.bench.client import make_requests
    from orchestrator.config.compose import compose_settings
    from orchestrator.config.settings import as_dict
    from orchestrator.targets.base import NodeContext
    from orchestrator.targets.registry import make_target
    from orchestrator.util.process import free_port

    cfg = compose_settings("trial", ["target=sim"])  # the sim only by name
    tconf = as_dict(cfg.target)
    bconf = as_dict(cfg.bench)
    tree = work / "sim-bare-tree"
    if not tree.exists():
        subprocess.run(["git", "-C", str(repo), "worktree", "add", "-q", "--detach", str(tree),
                        sha], check=True, capture_output=True)
    state = work / "sim-bare-node"
    target = make_target(tconf, bconf, NodeContext(name="bare", state_dir=state))
    target.prepare(tree, state)
    target.gpu_control().snapshot()  # the node's simulated GPU state file, as a trial makes it
    port = free_port()
    argv, env = target.command(tree, port), target.environment({})
    warm = make_requests(int(bconf["warmup_requests"]), int(bconf["input_len"]),
                         int(bconf["output_len"]), int(bconf["seed"]) + 10_000)
    reqs = make_requests(int(bconf["requests"]), int(bconf["input_len"]),
                         int(bconf["output_len"]), int(bconf["seed"]))
    sent = [*warm, *[r for _ in range(int(bconf["repetitions"])) for r in reqs]]
    log = state / "server.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    base = f"http://127.0.0.1:{port}"
    with httpx.Client(trust_env=False, timeout=60) as client:
        t0 = time.perf_counter()
        with open(log, "wb") as f:
            proc = subprocess.Popen(argv, cwd=tree, env=env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        while b"fired up and ready" not in log.read_bytes():
            if proc.poll() is not None:
                raise SystemExit(f"bare sim server exited {proc.returncode}: see {log}")
            time.sleep(0.002)
        for spec in sent:
            payload = {"input_ids": list(spec.input_ids), "stream": True,
                       "sampling_params": {"max_new_tokens": spec.max_new_tokens,
                                           "temperature": 0.0, "ignore_eos": True}}
            with client.stream("POST", f"{base}/generate", json=payload) as r:
                for _ in r.iter_lines():
                    pass
        served = time.perf_counter()
        metrics = prometheus.parse(client.get(f"{base}/metrics").text)
        t1 = time.perf_counter()
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait()
        t2 = time.perf_counter()
    e2e = sum(v for (name, _), v in metrics.items()
              if name == "sglang:e2e_request_latency_seconds_sum")
    scale = float(tconf["time_scale"])
    modeled = scale * (float(tconf["load_seconds"]) + e2e)
    return {"wall_s": (served - t0) + (t2 - t1), "modeled_s": modeled, "requests": len(sent)}


def sim_section(work: Path, n_runs: int) -> dict:
    repo, truth = _sim_setup(work)
    bare = [bare_sim(work, repo, truth["good"]) for _ in range(3)]
    runs, log = work / "sim-runs", work / "sim.log"
    args = ["bisect", "target=sim", f"repo={repo}", f"good={truth['good']}", f"bad={truth['bad']}",
            f"runs_dir={runs}"]
    measured = measure_runs(args, runs, n_runs, log)
    per = [p for run in measured for p in periods(run)]
    node = [t["ended_at"] - t["started_at"] for run in measured for t in run["trials"]]
    modeled = median([b["modeled_s"] for b in bare])
    bare_wall = median([b["wall_s"] for b in bare])
    return {
        "modeled_s": round(modeled, 3),
        "bare_server_s": round(bare_wall, 3),
        "trial_period_s": round(median(per), 3),
        "node_trial_s": round(median(node), 3),
        "overhead_vs_modeled_s": round(median(per) - modeled, 3),
        "overhead_vs_modeled_p10_s": round(p10(per) - modeled, 3),
        "overhead_vs_bare_s": round(median(per) - bare_wall, 3),
        "n_trials": len(per),
        "steps_ms": phases_ms(measured),
        "first_trial_s": [round(first_trial_s(r), 2) for r in measured],
        "load1": [r["load1"] for r in measured],
    }


def _steps(r: dict) -> None:
    print("  per step (median ms): " + ", ".join(f"{k} {v:g}" for k, v in r["steps_ms"].items()))


def _print_command(r: dict) -> None:
    print(f"\n== target=command (64 commits, {r['n_trials']} trials; load {r['load1']}) ==")
    print(f"  bare bench               {r['bare_bench_ms']:8.1f} ms")
    print(f"  sleuth, dispatch->next   {r['trial_period_ms']:8.1f} ms   (node side"
          f" {r['node_trial_ms']:.1f} ms)")
    print(f"  sleuth's own overhead    {r['overhead_ms']:8.1f} ms   = {r['overhead_ratio']:.2f}x"
          f" the bare bench (fastest tenth: {r['overhead_p10_ms']:.1f} ms)")
    print(f"  overhead per measured run {r['per_run_overhead_ms']} ms (the first verifies the"
          " cached worktrees with git)")
    _steps(r)
    print(f"  process start -> 1st trial {r['first_trial_s']} s")


def _print_sim(r: dict) -> None:
    print(f"\n== target=sim (default time scale, {r['n_trials']} trials; load {r['load1']}) ==")
    print(f"  modeled server time      {r['modeled_s']:8.3f} s")
    print(f"  bare server process      {r['bare_server_s']:8.3f} s")
    print(f"  sleuth, dispatch->next   {r['trial_period_s']:8.3f} s   (node side"
          f" {r['node_trial_s']:.3f} s)")
    print(f"  overhead over modeled    {r['overhead_vs_modeled_s']:8.3f} s   (fastest tenth"
          f" {r['overhead_vs_modeled_p10_s']:.3f} s; over the bare server"
          f" {r['overhead_vs_bare_s']:.3f} s)")
    _steps(r)
    print(f"  process start -> 1st trial {r['first_trial_s']} s")


def _print_strategy(rows: list[dict]) -> None:
    print("\n== BisectStrategy per decision (virtual oracle) ==")
    print(f"  {'commits':>8} {'decisions':>9} {'propose ms':>11} {'max':>8} {'cpu':>6}"
          f" {'verdict ms':>11} {'max':>8} {'cpu':>6} {'load':>5}")
    for r in rows:
        print(f"  {r['commits']:>8} {r['decisions']:>9} {r['propose_ms']:>11.2f}"
              f" {r['propose_max_ms']:>8.2f} {r['propose_cpu_ms']:>6.2f}"
              f" {r['verdict_ms']:>11.2f} {r['verdict_max_ms']:>8.2f}"
              f" {r['verdict_cpu_ms']:>6.2f} {r['load']:>5.2f}")
        for line in r.get("profile", []):
            print(f"      {line}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="command,sim,strategy",
                   help="comma list of sections: command, sim, strategy")
    p.add_argument("--runs", type=int, default=3, help="measured CLI runs per section")
    p.add_argument("--bare", type=int, default=60, help="bare bench repetitions")
    p.add_argument("--sizes", default="1000,10000,50000", help="strategy sizes (commits)")
    p.add_argument("--profile", action="store_true", help="where the strategy's time goes")
    p.add_argument("--json", help="also write the results here")
    p.add_argument("--keep", help="work in this (new) directory and keep it: repos, run dirs")
    a = p.parse_args(argv)
    only = set(a.only.split(","))
    results: dict = {"load1_start": load1(), "cpus": os.cpu_count()}
    print(f"load average (1 min) at start: {results['load1_start']} on {results['cpus']} CPUs")
    with tempfile.TemporaryDirectory(prefix="sleuth-overhead-") as tmp:
        work = Path(a.keep).resolve() if a.keep else Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if "command" in only:
            results["command"] = command_section(work, a.runs, a.bare)
            _print_command(results["command"])
        if "sim" in only:
            results["sim"] = sim_section(work, a.runs)
            _print_sim(results["sim"])
    if "strategy" in only:
        sizes = [int(s) for s in a.sizes.split(",") if s]
        results["strategy"] = strategy_timings(sizes, profile=a.profile)
        _print_strategy(results["strategy"])
    results["load1_end"] = load1()
    print(f"\nload average (1 min) at end: {results['load1_end']}")
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
