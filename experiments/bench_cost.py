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
:func:`orchestrator.stats.repetition_plan.plan_repetitions` choose each restart's count from
the components estimated so far (:func:`orchestrator.stats.variance.variance_components`),
as the drive loop does. ``adaptive_prior`` is the same with a prior from an earlier run on the
node: an adaptive bisect of another seeded case of the regime, its sums of squares discounted
as :func:`orchestrator.run.noise_prior.load_noise_prior` does, pooled with the run's own. The
strategy is the real :class:`BisectStrategy` at confidence 0.99, fed trials with their
repetition counts (precision-weighted likelihood).

Right: status ``found`` naming the planted commit. ``gpu_min`` is the mean GPU-minutes per case
(all trials); ``ratio_best_fixed`` and ``ratio_fixed_3`` compare an adaptive design with a fixed
one on the cases both ran (paired), the best fixed setting being the one it compares worst with.

Run: ``python -m experiments.bench_cost`` (``CASES=30``, ``WORKERS=2``, ``REGIMES=both``,
``DESIGNS=fixed_3,adaptive``, ``FIXED_CASES=N``: the fixed designs on the first N cases only,
``FIXED_1_CASES=N``: fixed_1 on the first N only where repetitions dominate, the costliest and
never the best there); writes ``runs/bench-cost.json``
and one line per case to ``runs/bench-cost.jsonl`` (``REUSE=1`` keeps the cases already there).
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
from orchestrator.run.noise_prior import PRIOR_BETWEEN_DF, PRIOR_WITHIN_DF
from orchestrator.stats.repetition_plan import CostModel, plan_repetitions
from orchestrator.stats.variance import NoiseStats, noise_stats, variance_components
from orchestrator.strategies.base import Observation
from orchestrator.strategies.bisect import BisectStrategy

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
DESIGNS = ("fixed_1", "fixed_3", "fixed_10", "adaptive", "adaptive_prior")
PRIOR_CASE_OFFSET = 100_000  # the earlier run behind adaptive_prior: another seeded case


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


def bisect(regime: Regime, case: int, fixed: int | None,
           prior: NoiseStats | None = None) -> tuple[list[Observation], dict, float, int, list]:
    """One seeded bisect: ``fixed`` repetitions in every restart, or (None) the adaptive
    design from 3, pooled with ``prior``. Returns the observations, the repetitions by
    point, the GPU-minutes, the final count and the count's changes."""
    rng = random.Random(1000 + case)
    culprit = rng.randrange(1, N_COMMITS)
    oracle = TwoLevelOracle(regime, culprit, 7919 * case + 1)
    strategy = BisectStrategy(N_COMMITS, confidence=0.99, max_trials=MAX_TRIALS)
    observations: list[Observation] = []
    reps_by_point: dict[int, list[list[float]]] = {}
    current = 3 if fixed is None else fixed
    minutes = 0.0
    changes: list[tuple[int, int]] = []
    while len(observations) < MAX_TRIALS:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        if fixed is None:
            comp = variance_components([[[math.log(v) for v in reps] for reps in restarts]
                                        for restarts in reps_by_point.values()], prior=prior)
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
    return observations, {"culprit": culprit, "strategy": strategy, "reps": reps_by_point}, \
        minutes, current, changes


def earlier_run_prior(regime: Regime, case: int) -> NoiseStats:
    """What the store would hold from an earlier run on the same node: an adaptive bisect of
    another seeded case of the regime, its sums of squares discounted as the drive loop's
    prior is (:func:`orchestrator.run.noise_prior.load_noise_prior`)."""
    _, state, _, _, _ = bisect(regime, PRIOR_CASE_OFFSET + case, None)
    stats = noise_stats([[[math.log(v) for v in reps] for reps in restarts]
                         for restarts in state["reps"].values()])
    return stats.discounted(PRIOR_WITHIN_DF, PRIOR_BETWEEN_DF)


def run_case(task: tuple[str, str, int]) -> dict:
    regime_name, design, case = task
    regime = next(r for r in REGIMES if r.name == regime_name)
    prior = earlier_run_prior(regime, case) if design == "adaptive_prior" else None
    fixed = None if design.startswith("adaptive") else int(design.split("_")[1])
    observations, state, minutes, current, changes = bisect(regime, case, fixed, prior)
    culprit = state["culprit"]
    verdict = state["strategy"].verdict(observations)
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
        # Ratios on the cases both designs ran (paired: the same seeded restarts); the best
        # fixed setting is the one the adaptive design compares worst with.
        by_case = {d: {r["case"]: r["gpu_min"] for r in results
                       if r["regime"] == regime.name and r["design"] == d} for d in DESIGNS}
        for name, adaptive in out[regime.name].items():
            if not name.startswith("adaptive"):
                continue
            ratios = {}
            for fixed in (d for d in out[regime.name] if d.startswith("fixed")):
                common = sorted(set(by_case[name]) & set(by_case[fixed]))
                if common:
                    ratios[fixed] = (sum(by_case[name][c] for c in common)
                                     / sum(by_case[fixed][c] for c in common))
            if ratios:
                best = max(ratios, key=ratios.get)
                adaptive["best_fixed"] = best
                adaptive["ratio_best_fixed"] = ratios[best]
            if "fixed_3" in ratios:
                adaptive["ratio_fixed_3"] = ratios["fixed_3"]
    return out


def format_table(report: dict) -> str:
    lines = ["| regime | design | accuracy | wrong P>=0.99 | restarts | GPU-min | final reps | "
             "vs best fixed | vs fixed 3 |", "|---|---|---|---|---|---|---|---|---|"]
    for regime, designs in report.items():
        for design, s in designs.items():
            best = (f"{s['ratio_best_fixed']:.2f}x ({s['best_fixed']})" if "ratio_best_fixed" in s
                    else "")
            three = f"{s['ratio_fixed_3']:.2f}x" if "ratio_fixed_3" in s else ""
            lines.append(f"| {regime} | {design} | {s['accuracy']:.2f} ({s['cases']}) | "
                         f"{s['wrong_confident']:.2f} | {s['mean_trials']:.1f} | "
                         f"{s['gpu_min']:.0f} | {s['median_final_repetitions']:.0f} | {best} | "
                         f"{three} |")
    return "\n".join(lines)


def load_cases(path: Path) -> dict[tuple[str, str, int], dict]:
    """Per-case results an earlier run wrote (one JSON object a line), by (regime, design,
    case); a line cut short by an interrupted run is skipped."""
    found: dict[tuple[str, str, int], dict] = {}
    if not path.is_file():
        return found
    for line in path.read_text().splitlines():
        try:
            r = json.loads(line)
            found[(r["regime"], r["design"], int(r["case"]))] = r
        except (ValueError, KeyError, TypeError):
            continue
    return found


def main() -> int:
    cases = int(os.environ.get("CASES", "30"))
    workers = int(os.environ.get("WORKERS", "2"))
    names = os.environ.get("REGIMES")
    wanted = os.environ.get("DESIGNS")
    designs = [d for d in DESIGNS if not wanted or d in wanted.split(",")]
    chosen = [r.name for r in REGIMES if not names or r.name in names.split(",")]
    out = Path(os.environ.get("BENCH_OUT", "runs/bench-cost.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    # Every finished case is appended to the .jsonl next to the report, so a long run can be
    # cut short and continued: REUSE=1 keeps the cases already there (the oracle and the
    # strategy are seeded: a case computed again gives the same result).
    per_case = out.with_suffix(".jsonl")
    done = load_cases(per_case) if os.environ.get("REUSE") == "1" else {}
    if not done:
        per_case.write_text("")
    # fixed_1 where repetitions dominate is never the best nor the default and costs the most
    # (hundreds of restarts to a wrong or no answer): FIXED_1_CASES runs it on fewer cases
    # there. Cases go in order, every regime at each, so a run cut short stays balanced.
    # FIXED_CASES: the fixed designs (the cost references) on the first N cases only.
    light = int(os.environ.get("FIXED_1_CASES", str(cases)))
    fixed_cases = int(os.environ.get("FIXED_CASES", str(cases)))
    wanted_tasks = [(r, d, c) for c in range(cases) for r in chosen for d in designs
                    if not (d == "fixed_1" and r.startswith("repetitions") and c >= light)
                    and not (d.startswith("fixed") and c >= fixed_cases)]
    tasks = [t for t in wanted_tasks if t not in done]
    started = time.perf_counter()
    results = [done[t] for t in wanted_tasks if t in done]
    with Pool(workers) as pool, per_case.open("a") as log:
        for result in pool.imap_unordered(run_case, tasks, chunksize=1):
            results.append(result)
            log.write(json.dumps(result) + "\n")
            log.flush()
    report = summarize(results)
    print(f"cost benchmark: {N_COMMITS} commits, {cases} cases per regime, restart "
          f"{COST.restart_s / 60:.0f} min, repetition {COST.repetition_s:.0f} s, {COST.gpus} GPUs,"
          f" adaptive bounds {BOUNDS[0]}..{BOUNDS[1]}, {time.perf_counter() - started:.0f} s"
          f" ({len(tasks)} cases run, {len(results) - len(tasks)} reused)")
    print(format_table(report))
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out} and {per_case}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
