"""Cost benchmark: GPU-minutes to a right answer, fixed repetitions against the adaptive design.

A virtual oracle with the two noise levels of a real node: a restart draws its level
``truth x exp(N(0, sd_restart))`` and each of its ``n`` repetitions reads
``level x exp(N(0, sd_repetition))``; the trial's value is their mean, with their spread. The
cost model is the issue's node: a restart (launch to ready, warm-up, teardown) 8 minutes, one
repetition 30 s, 8 GPUs. Regimes:

- ``repetitions_dominate``: a repetition scatters 100x more than a restart (sd 10% vs 0.1%,
  a short benchmark on a well-pinned node), a 3% change: more repetitions per restart are far
  cheaper than more restarts, and even 10 are too few;
- ``repetitions_mild``: the same with sd 6% per repetition (10 repetitions are near the best);
- ``restarts_dominate``: a restart scatters 4x more than a repetition (2% vs 0.5%): every
  repetition past the first is wasted;
- ``both``: restart 1%, repetition 4% (the optimum near 16 repetitions).

Each case: 32 commits, one culprit at a seeded place, a step of ``effect`` (per regime). Every
design sees the same seeded cases; ``fixed_1``/``fixed_3``/``fixed_10`` run that many
repetitions in every restart, ``adaptive`` starts at 3 and lets
:func:`orchestrator.strategies.repetitions.plan_repetitions` choose each restart's count from
the components estimated so far (:func:`orchestrator.stats.variance.variance_components`),
as the drive loop does. The strategy is the real :class:`BisectStrategy` at confidence 0.99,
fed trials with their repetition counts (precision-weighted likelihood).

Right: status ``found`` naming the planted commit. ``gpu_min`` is the mean GPU-minutes per case
(all trials), ``ratio_best_fixed`` the adaptive design's GPU-minutes over the best fixed one's.

Run: ``python -m experiments.bench_cost`` (``CASES=30``, ``WORKERS=2``, ``REGIMES=both``);
writes ``runs/bench-cost.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import random
import time
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from orchestrator.control.repetitions import change_size
from orchestrator.stats.variance import variance_components
from orchestrator.strategies.base import Observation
from orchestrator.strategies.bisect import BisectStrategy
from orchestrator.strategies.repetitions import CostModel, plan_repetitions

N_COMMITS = 32
MAX_TRIALS = 600
COST = CostModel(restart_s=480.0, repetition_s=30.0, gpus=8)
BOUNDS = (1, 32)


@dataclass(frozen=True)
class Regime:
    name: str
    sd_restart: float
    sd_repetition: float
    effect: float


REGIMES = (
    Regime("repetitions_dominate", 0.001, 0.10, 0.03),
    Regime("repetitions_mild", 0.001, 0.06, 0.03),
    Regime("restarts_dominate", 0.02, 0.005, 0.06),
    Regime("both", 0.01, 0.04, 0.05),
)
DESIGNS = ("fixed_1", "fixed_3", "fixed_10", "adaptive")


class TwoLevelOracle:
    """Seeded per (commit, restart index): every design sees the same restart levels and the
    same first repetitions at a commit."""

    def __init__(self, regime: Regime, culprit: int, seed: int) -> None:
        self.regime = regime
        self.culprit = culprit
        self.seed = seed
        self.restarts: dict[int, int] = {}

    def measure(self, point: int, n: int) -> list[float]:
        j = self.restarts.get(point, 0)
        self.restarts[point] = j + 1
        rng = random.Random(hash((self.seed, point, j)) & 0xFFFFFFFF)
        truth = 20.0 * (1.0 + self.regime.effect) if point >= self.culprit else 20.0
        level = truth * math.exp(rng.gauss(0.0, self.regime.sd_restart))
        return [level * math.exp(rng.gauss(0.0, self.regime.sd_repetition)) for _ in range(n)]


def run_case(task: tuple[str, str, int]) -> dict:
    regime_name, design, case = task
    regime = next(r for r in REGIMES if r.name == regime_name)
    rng = random.Random(1000 + case)
    culprit = rng.randrange(1, N_COMMITS)
    oracle = TwoLevelOracle(regime, culprit, 7919 * case + 1)
    strategy = BisectStrategy(N_COMMITS, confidence=0.99, max_trials=MAX_TRIALS)
    observations: list[Observation] = []
    reps_by_point: dict[int, list[list[float]]] = {}
    current = 3 if design == "adaptive" else int(design.split("_")[1])
    minutes = 0.0
    changes: list[int] = []
    while len(observations) < MAX_TRIALS:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        if design == "adaptive":
            comp = variance_components([[[math.log(v) for v in reps] for reps in restarts]
                                        for restarts in reps_by_point.values()])
            plan = plan_repetitions(comp, COST, current, *BOUNDS,
                                    effect=change_size(strategy.verdict(observations)))
            if plan.changed:
                changes.append((len(observations), plan.repetitions))
            current = plan.repetitions
        point = proposals[0].point
        reps = oracle.measure(point, current)
        reps_by_point.setdefault(point, []).append(reps)
        logs = [math.log(v) for v in reps]
        spread = float(np.var(logs, ddof=1)) if len(logs) > 1 else None
        observations.append(Observation(point, float(np.mean(reps)), trial_id=len(observations),
                                        repetitions=len(reps), spread=spread))
        minutes += COST.gpu_minutes(current)
    verdict = strategy.verdict(observations)
    top = verdict.top
    right = verdict.status == "found" and top is not None and top.point == culprit
    wrong = top is not None and top.point != culprit and top.probability >= 0.99
    return {"regime": regime_name, "design": design, "case": case, "right": right,
            "wrong_confident": wrong, "trials": len(observations), "gpu_min": minutes,
            "status": verdict.status, "final_repetitions": current, "changes": changes}


def summarize(results: list[dict]) -> dict:
    out: dict = {}
    for regime in REGIMES:
        out[regime.name] = {}
        for design in DESIGNS:
            rs = [r for r in results if r["regime"] == regime.name and r["design"] == design]
            if not rs:
                continue
            out[regime.name][design] = {
                "cases": len(rs),
                "accuracy": sum(r["right"] for r in rs) / len(rs),
                "wrong_confident": sum(r["wrong_confident"] for r in rs) / len(rs),
                "mean_trials": float(np.mean([r["trials"] for r in rs])),
                "gpu_min": float(np.mean([r["gpu_min"] for r in rs])),
                "median_final_repetitions": float(np.median([r["final_repetitions"]
                                                             for r in rs])),
            }
        fixed = [v["gpu_min"] for k, v in out[regime.name].items() if k.startswith("fixed")]
        adaptive = out[regime.name].get("adaptive")
        if adaptive and fixed:
            adaptive["ratio_best_fixed"] = adaptive["gpu_min"] / min(fixed)
            if "fixed_3" in out[regime.name]:
                adaptive["ratio_fixed_3"] = adaptive["gpu_min"] / out[regime.name]["fixed_3"][
                    "gpu_min"]
    return out


def format_table(report: dict) -> str:
    lines = ["| regime | design | accuracy | wrong P>=0.99 | restarts | GPU-min | final reps | "
             "vs best fixed | vs fixed 3 |", "|---|---|---|---|---|---|---|---|---|"]
    for regime, designs in report.items():
        for design, s in designs.items():
            best = f"{s['ratio_best_fixed']:.2f}x" if "ratio_best_fixed" in s else ""
            three = f"{s['ratio_fixed_3']:.2f}x" if "ratio_fixed_3" in s else ""
            lines.append(f"| {regime} | {design} | {s['accuracy']:.2f} ({s['cases']}) | "
                         f"{s['wrong_confident']:.2f} | {s['mean_trials']:.1f} | "
                         f"{s['gpu_min']:.0f} | {s['median_final_repetitions']:.0f} | {best} | "
                         f"{three} |")
    return "\n".join(lines)


def main() -> int:
    cases = int(os.environ.get("CASES", "30"))
    workers = int(os.environ.get("WORKERS", "2"))
    names = os.environ.get("REGIMES")
    chosen = [r.name for r in REGIMES if not names or r.name in names.split(",")]
    tasks = [(r, d, c) for r in chosen for c in range(cases) for d in DESIGNS]
    started = time.perf_counter()
    with Pool(workers) as pool:
        results = pool.map(run_case, tasks, chunksize=1)
    report = summarize(results)
    print(f"cost benchmark: {N_COMMITS} commits, {cases} cases per regime, restart "
          f"{COST.restart_s / 60:.0f} min, repetition {COST.repetition_s:.0f} s, {COST.gpus} GPUs,"
          f" adaptive bounds {BOUNDS[0]}..{BOUNDS[1]}, {time.perf_counter() - started:.0f} s")
    print(format_table(report))
    out = Path(os.environ.get("BENCH_OUT", "runs/bench-cost.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
