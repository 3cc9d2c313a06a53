"""How well does the sweep find the best configuration? Virtual sweeps against the sim's model.

    python -m experiments.bench_sweep [--seeds 20] [key=value ...]

Each seed runs the real sweep experiment (same sampler, pruning, confirmation and importance
code as `sleuth sweep`, an in-memory Optuna study) against `SimOracle`: the sim's noise-free
model times restart noise, with K trials in flight. The truth comes from evaluating every
configuration of the space noise-free. Reported per seed: the chosen configuration's distance
to the true best, whether the confirmation proved it better than the baseline, and whether the
truly most important parameter (largest main-effect share over the whole grid) ranked first.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from orchestrator.config import params as experiment_params
from orchestrator.config import sweep as setup
from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import RunSettings, as_dict, evolve
from orchestrator.records import Candidate
from orchestrator.sim_scenarios.sweep_oracle import SimOracle
from orchestrator.strategies.sweep import importance
from orchestrator.strategies.sweep.search import SweepResult, SweepSearch
from orchestrator.strategies.sweep.space import SearchSpace
from orchestrator.strategies.sweep.study import make_sampler, open_study

DEFAULTS = ["target=sim", "space=nccl_pcie", "metric=output_throughput", "trials=40", "nodes=2"]

def main_effect_shares(values: Mapping[tuple, float], names: list[str]) -> dict[str, float]:
    """First-order functional-ANOVA shares over a full grid: the variance of each parameter's
    level means (log scale), normalised. What "the important parameter" means in the truth."""
    logs = {k: math.log(v) for k, v in values.items() if v and v > 0}
    total = statistics.pvariance(list(logs.values()))
    shares = {}
    for i, name in enumerate(names):
        groups: dict[Any, list[float]] = {}
        for k, v in logs.items():
            groups.setdefault(k[i], []).append(v)
        grand = statistics.fmean(logs.values())
        between = sum(len(g) * (statistics.fmean(g) - grand) ** 2 for g in groups.values())
        shares[name] = between / len(logs) / total if total > 0 else 0.0
    s = sum(shares.values()) or 1.0
    return dict(sorted(((k, v / s) for k, v in shares.items()), key=lambda kv: -kv[1]))



@dataclass(frozen=True)
class Truth:
    best_value: float
    best_label: str
    baseline_value: float
    important: str  # parameter with the largest main-effect share
    shares: dict[str, float]
    size: int


@dataclass(frozen=True)
class VirtualOutcome:
    seed: int
    result: SweepResult
    chosen_truth: float | None
    gap_pct: float | None  # how far the chosen configuration is from the true best (>= 0)
    top_param: str | None  # ranked first by the configured importance evaluator
    importance_evaluator: str
    restarts: int
    other_tops: tuple[tuple[str, str | None], ...] = ()  # (evaluator, first) for comparisons


def base_candidate() -> Candidate:
    return Candidate.make("0" * 40)


def truth(space: SearchSpace, oracle: SimOracle, target_conf: dict, maximize: bool) -> Truth:
    base = base_candidate()
    values: dict[tuple, float] = {}
    labels: dict[tuple, str] = {}
    for assignment in space.configurations():
        value = oracle.truth(space.candidate(base, assignment, target_conf))
        if value is None:
            continue
        key = tuple(assignment.get(n, "(inactive)") for n in space.names)
        values[key], labels[key] = value, space.label(assignment)
    pick = max if maximize else min
    best = pick(values, key=values.get)
    baseline = oracle.truth(space.candidate(base, space.baseline(target_conf), target_conf))
    shares = main_effect_shares(values, space.names)
    return Truth(values[best], labels[best], baseline, next(iter(shares)), shares, len(values))


def run_virtual(cfg: RunSettings, seed: int, *, oracle_seed: int | None = None,
                compare: tuple[str, ...] = ()) -> VirtualOutcome:
    """One sweep against the oracle, exactly as `sleuth sweep` would run it on `cfg.nodes`."""
    cfg = evolve(cfg, seed=seed)
    target_conf = as_dict(cfg.target)
    bench_conf = as_dict(cfg.bench)
    space = setup.space(cfg, target_conf)
    settings = setup.settings(cfg)
    oracle = SimOracle(target_conf, bench_conf, metric=cfg.metric,
                       seed=seed if oracle_seed is None else oracle_seed)
    sampler = make_sampler(settings.sampler, space, seed=seed,
                           budget=settings.budget,
                           startup=settings.startup)
    study = open_study(name=f"virtual-{seed}", storage=None, sampler=sampler,
                       maximize=settings.maximize)
    search = SweepSearch(space, study, base_candidate(), target_conf, settings)
    in_flight: deque = deque()
    nodes = cfg.nodes
    while not search.done:
        in_flight.extend(search.propose(nodes - len(in_flight)))
        if not in_flight:
            break
        work = in_flight.popleft()
        search.record(work, oracle.measure(work.candidate))
    result = search.result()
    chosen = oracle.truth(result.best.config.candidate) if result.best else None
    imp = importance.of_search(search, experiment_params.of(cfg).importance)
    others = []
    for name in compare:
        ranked = importance.of_search(search, name).ranked
        others.append((name, ranked[0] if ranked else None))
    return VirtualOutcome(seed, result, chosen, None, imp.ranked[0] if imp.ranked else None,
                          imp.evaluator, search.spent, tuple(others))


def score(outcome: VirtualOutcome, t: Truth, maximize: bool) -> VirtualOutcome:
    if outcome.chosen_truth is None:
        return outcome
    gap = (t.best_value / outcome.chosen_truth - 1.0) if maximize else (
        outcome.chosen_truth / t.best_value - 1.0)
    return VirtualOutcome(outcome.seed, outcome.result, outcome.chosen_truth, 100.0 * gap,
                          outcome.top_param, outcome.importance_evaluator, outcome.restarts,
                          outcome.other_tops)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m experiments.bench_sweep",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--within-pct", type=float, default=2.0)
    ap.add_argument("--compare-importance", default="",
                    help="comma-separated evaluators to score on the same sweeps "
                         "(fanova and mdi need scikit-learn)")
    ap.add_argument("overrides", nargs="*", help="sleuth config overrides (key=value)")
    ns = ap.parse_args(argv)
    cfg = compose_settings("sweep", [*DEFAULTS, *ns.overrides])
    target_conf = as_dict(cfg.target)
    space = setup.space(cfg, target_conf)
    maximize = setup.maximize(cfg.metric, cfg.direction)
    oracle = SimOracle(target_conf, as_dict(cfg.bench),
                       metric=cfg.metric)
    t = truth(space, oracle, target_conf, maximize)
    print(f"space {space.name}: {t.size} configurations; metric {cfg.metric}; "
          f"{cfg.trials} trials on {cfg.nodes} node(s); sampler {cfg.sampler}")
    print(f"truth: baseline {t.baseline_value:.2f}, best {t.best_value:.2f} "
          f"({100 * (t.best_value / t.baseline_value - 1):+.1f}%): {t.best_label}")
    print("truth: main-effect shares " + ", ".join(f"{k} {v:.2f}" for k, v in t.shares.items()))
    rows = []
    started = time.perf_counter()
    for seed in range(ns.first_seed, ns.first_seed + ns.seeds):
        compare = tuple(x for x in ns.compare_importance.split(",") if x)
        o = score(run_virtual(cfg, seed, compare=compare), t, maximize)
        rows.append(o)
        gap = f"{o.gap_pct:5.2f}%" if o.gap_pct is not None else "  -   "
        print(f"seed {seed:3d}: {o.result.status:13s} gap {gap} restarts {o.restarts:3d} "
              f"top {o.top_param} | {o.result.best.config.label if o.result.best else '-'}")
    n = len(rows)
    within = sum(1 for o in rows if o.gap_pct is not None and o.gap_pct <= ns.within_pct)
    found = sum(1 for o in rows if o.result.status == "found")
    both = sum(1 for o in rows if o.result.status == "found" and o.gap_pct is not None
               and o.gap_pct <= ns.within_pct)
    top = sum(1 for o in rows if o.top_param == t.important)
    every = sum(1 for o in rows if o.result.status == "found" and o.gap_pct is not None
                and o.gap_pct <= ns.within_pct and o.top_param == t.important)
    gaps = [o.gap_pct for o in rows if o.gap_pct is not None]
    print(f"within {ns.within_pct:g}% of the true best: {within}/{n}; confirmed better than "
          f"baseline: {found}/{n}; both: {both}/{n}; {t.important} ranked first: {top}/{n} "
          f"({rows[0].importance_evaluator}); all three: {every}/{n}")
    for name in (x for x in ns.compare_importance.split(",") if x):
        hits = sum(1 for o in rows if dict(o.other_tops).get(name) == t.important)
        print(f"importance by {name}: {t.important} ranked first {hits}/{n}")
    if gaps:
        print(f"gap to the true best: median {statistics.median(gaps):.2f}%, "
              f"max {max(gaps):.2f}%; restarts used: max {max(o.restarts for o in rows)}; "
              f"{time.perf_counter() - started:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
