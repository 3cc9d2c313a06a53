"""Restarts and modeled GPU-hours of the README's seed-story rehearsal, per step, per seed.

Runs the five commands of README.md's "Rehearse both steps without a GPU" exactly as typed
(through the installed `sleuth`, in a temporary directory), with the scenario's `seed=` and
the investigation's extra settings as the only additions:

    sleuth scenario out=SC preset=seed_story seed=S
    sleuth scenario out=SC apply=reference runs_dir=RUNS
    sleuth trial target=sim repo=SC/repo runs_dir=RUNS commit=GOOD restarts=3 run_id=reference
    sleuth scenario out=SC apply=now runs_dir=RUNS
    sleuth investigate target=sim repo=SC/repo runs_dir=RUNS reference=reference bad=BAD \
        evidence.kernels=false [EXTRA...]

and reads the investigation's store: restarts and modeled GPU-minutes per step (compare,
isolate, bisect, final check, kernels), whether the named causes are the planted ones
(`truth.json`), the width of every cause's interval and of the remainder's, and the exit
code. One JSON line per seed is appended to `OUT` (default `runs/seed-story-cost.jsonl`).

    python -m experiments.seed_story_cost --seeds 1 2 3 [--label after] [-- EXTRA...]
    python -m experiments.seed_story_cost --preset code_under_system --commits 150 --seeds 1 2 3
    python -m experiments.seed_story_cost --summary runs/seed-story-cost.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLEUTH = str(Path(sys.executable).parent / "sleuth")
STEPS = ("compare", "isolate", "bisect", "final", "kernels")


CODE: str | None = None  # --code DIR: the sleuth commands run that checkout's orchestrator


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": CODE} if CODE else None
    return subprocess.run([SLEUTH, *args], cwd=cwd, capture_output=True, text=True, env=env,
                          timeout=3600)


def steps_of(rows, base_commit: str) -> dict[int, str]:
    """The step of each trial: the investigation runs compare, isolate, bisect, final check
    and kernel evidence in that order; the bisect begins with its first trial of another
    commit than the reference's (its good end may be reused from the compare)."""
    out: dict[int, str] = {}
    in_bisect = False
    for r in rows:
        if r.phase in ("final", "kernels", "compare"):
            out[r.id] = r.phase
            continue
        if r.candidate.commit != base_commit:
            in_bisect = True
        out[r.id] = "bisect" if in_bisect else "isolate"
    return out


def measure(rows, target: dict, base_commit: str) -> dict:
    from orchestrator.run.blocks import lifetime_of
    from orchestrator.run.cost import trial_cost

    step = steps_of(rows, base_commit)
    restarts: Counter = Counter()
    minutes: dict[str, float] = defaultdict(float)
    for r in rows:
        if r.result is None:
            continue
        if lifetime_of(r.result.fingerprint) is not None:
            continue  # a block row: its lifetime's row is the restart (and holds the cost)
        restarts[step[r.id]] += 1
        c = trial_cost(r.result, target)
        if c is not None:
            minutes[step[r.id]] += c.gpu_minutes
    return {"restarts": {s: restarts.get(s, 0) for s in STEPS},
            "gpu_hours": {s: round(minutes.get(s, 0.0) / 60.0, 3) for s in STEPS},
            "total_restarts": sum(restarts.values()),
            "total_gpu_hours": round(sum(minutes.values()) / 60.0, 3)}


def causes_right(answer: dict, truth: dict) -> tuple[bool, list[str], list[str]]:
    """The planted commit and the planted harmful system causes, and nothing else."""
    want = {c["sha"][:12] for c in truth["culprits"]}
    for ch in truth.get("system", {}).get("changes", []):
        if ch.get("harmful"):
            want.add("NCCL_PROTO" if ch.get("var") == "NCCL_PROTO" else
                     "clock" if ch["factor"] == "clock" else str(ch.get("var") or ch.get("name")))
    named = set()
    for c in answer.get("causes") or []:
        ident = str(c.get("id", ""))
        kind = c.get("kind", "")
        if kind == "commit":
            named.add(ident[:12])
        elif kind == "clock" or ident.startswith(("power", "locked", "clock")):
            named.add("clock")
        else:
            named.add(ident.split("=")[0])
    return named == want, sorted(named), sorted(want)


def widths(answer: dict) -> dict:
    out = {}
    for c in answer.get("causes") or []:
        ci = c.get("ci") or (c.get("effect") or {}).get("ci")
        if ci:
            out[str(c.get("id"))] = round(float(ci[1]) - float(ci[0]), 2)
    rest = answer.get("unexplained") or {}
    if rest.get("ci"):
        out["remainder"] = round(float(rest["ci"][1]) - float(rest["ci"][0]), 2)
    return out


def one(seed: int, extra: list[str], label: str, preset: str = "seed_story",
        commits: int | None = None) -> dict:
    from orchestrator.config.settings import saved_values
    from orchestrator.store import RunStore

    with tempfile.TemporaryDirectory(prefix="seed-story-") as tmp:
        t = Path(tmp)
        sc, runs = t / "sc", t / "runs"
        done = _run(["scenario", f"out={sc}", f"preset={preset}", f"seed={seed}",
                     *([f"commits={commits}"] if commits else [])], t)
        assert done.returncode == 0, done.stderr
        truth = json.loads((sc / "truth.json").read_text())
        good, bad = truth["good"][:12], truth["bad"][:12]
        for args in (["scenario", f"out={sc}", "apply=reference", f"runs_dir={runs}"],
                     ["trial", "target=sim", f"repo={sc}/repo", f"runs_dir={runs}",
                      f"commit={good}", "restarts=3", "run_id=reference"],
                     ["scenario", f"out={sc}", "apply=now", f"runs_dir={runs}"]):
            done = _run(args, t)
            assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        began = time.monotonic()
        inv = _run(["investigate", "target=sim", f"repo={sc}/repo", f"runs_dir={runs}",
                    "reference=reference", f"bad={bad}", "evidence.kernels=false", *extra], t)
        wall = time.monotonic() - began
        run_dir = next(d for d in runs.iterdir() if d.name.endswith(("-investigate",))
                       or "-investigate-" in d.name)
        store = RunStore.open(run_dir / "trials.db", readonly=True)
        try:
            rows = store.trials()
            cfg = saved_values(store.config_yaml())
        finally:
            store.close()
        doc = json.loads((run_dir / "findings-investigate.json").read_text())
        answer = doc["answer"]
        right, named, want = causes_right(answer, truth)
        plan_lines = [ln for ln in inv.stdout.splitlines() if ln.startswith(("plan:", "budget"))]
        return {"label": label, "preset": preset, "seed": seed, "extra": extra,
                "exit": inv.returncode,
                "right": right, "named": named, "planted": want,
                "status": answer.get("status"), "widths": widths(answer),
                **measure(rows, cfg.get("target") or {}, truth["good"]),
                "plan": plan_lines[:8], "wall_s": round(wall, 1),
                "sentence": answer.get("sentence", "")[:600]}


def summary(path: Path) -> None:
    rows = [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["label"]].append(r)
    print("| run | seeds | causes right | restarts: compare / isolate / bisect / final | total"
          " restarts mean (min-max) | modeled GPU-h mean | remainder CI width mean |")
    print("|---|---|---|---|---|---|---|")
    for label, rs in by.items():
        steps = " / ".join(f"{statistics.fmean(r['restarts'][s] for r in rs):.1f}"
                           for s in ("compare", "isolate", "bisect", "final"))
        tot = [r["total_restarts"] for r in rs]
        rem = [r["widths"].get("remainder") for r in rs if r["widths"].get("remainder")]
        print(f"| {label} | {len(rs)} | {sum(r['right'] for r in rs)}/{len(rs)} | {steps} |"
              f" {statistics.fmean(tot):.1f} ({min(tot)}-{max(tot)}) |"
              f" {statistics.fmean(r['total_gpu_hours'] for r in rs):.2f} |"
              f" {statistics.fmean(rem) if rem else float('nan'):.1f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="*", default=[1, 2, 3])
    ap.add_argument("--label", default="now")
    ap.add_argument("--out", default=str(ROOT / "runs" / "seed-story-cost.jsonl"))
    ap.add_argument("--summary", default="")
    ap.add_argument("--preset", default="seed_story",
                    help="another system story of tests/ (code_under_system: 150 commits)")
    ap.add_argument("--commits", type=int, default=0)
    ap.add_argument("--code", default="",
                    help="a checkout whose orchestrator the commands run (a 'before' measured"
                         " with this script's reading of the store)")
    ap.add_argument("extra", nargs="*", help="settings added to the investigate command")
    a = ap.parse_args()
    global CODE
    CODE = str(Path(a.code).resolve()) if a.code else None
    if a.summary:
        summary(Path(a.summary))
        return
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    for seed in a.seeds:
        rec = one(seed, a.extra, a.label, a.preset, a.commits or None)
        with out.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(json.dumps({k: rec[k] for k in ("label", "seed", "exit", "right", "restarts",
                                               "total_restarts", "total_gpu_hours", "widths")}),
              flush=True)


if __name__ == "__main__":
    main()
