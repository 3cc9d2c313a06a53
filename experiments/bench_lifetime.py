"""Restarts an isolate needs when a power limit or clock lock is compared within one lifetime.

The system stories of `experiments/bench_isolate.py --system`, through the same chain
(virtual trials fingerprint the reference and the current node, the fingerprints are diffed,
the controllable differences become changes, and every candidate is built by `apply` and
priced by the sim's model), run twice on the same seeds:

- `restarts`: every configuration is a restart of its own (`within_lifetime=false`);
- `lifetime`: the clock differences (:mod:`orchestrator.system.runtime_settable`) are set on the
  running server: a trial launches a subset's other differences and measures every
  combination of the live ones in interleaved blocks. The virtual lifetime draws one restart
  level (lognormal, `--restart-cv`) that every block of it shares, and each level's value
  averages `--reps` repetitions of noise `--rep-cv` (their sample variance is what the
  strategy pools as the repetitions' scatter).

Correct: "found" and exactly the differences whose effect alone is at least 3% named; a wrong
answer is a wrong set named at the stated confidence. Restarts are server lifetimes.

    python -m experiments.bench_lifetime --cases 50
    python -m experiments.bench_lifetime --cases 50 --restart-cv 0.05 --rep-cv 0.03
    python -m experiments.bench_lifetime --cases 50 --interaction-cv 0.02   # a setting whose
        effect varies from one lifetime to the next (what the pairing alone does not cover)
    python -m experiments.bench_lifetime --cases 50 --outlier-rate 0.1      # 3x restarts
    python -m experiments.bench_lifetime --cases 50 --drift 0.01            # drift within one
    python -m experiments.bench_lifetime --cases 200 --story seed_system --nccl-mult 0.65
        # NCCL_PROTO at +4.9%, just over the 4% min effect (the README's seed story)
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
from collections import Counter
from dataclasses import dataclass

from orchestrator.strategies.base import Observation
from orchestrator.strategies.isolate import IsolateStrategy

STORIES = {"power_only": "power_limit", "clock_pair": "clock_pair",
           "power_strip": "power_strip", "seed_system": "seed_system"}
HARMFUL_PCT = 3.0


@dataclass(frozen=True)
class Result:
    story: str
    design: str
    status: str
    correct: bool
    restarts: int
    probability: float
    wrong_confident: bool


def _lognormal(rng: random.Random, cv: float) -> float:
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(rng.gauss(-0.5 * sigma * sigma, sigma))


def run(story: str, seed: int, design: str, *, restart_cv: float, rep_cv: float, reps: int,
        interaction_cv: float, confidence: float = 0.99, outlier_rate: float = 0.0,
        drift: float = 0.0, nccl_mult: float = 0.3) -> Result:
    """``nccl_mult``: NCCL_PROTO=LL128's all-reduce multiplier in the node's profile (0.3:
    dropping it costs `seed_system` about +10% verify; 0.65, the README's seed story's, about
    +4.9%, just over the isolate's 4% min effect: the hardest difference to clear or name)."""
    from experiments.system_oracle import SystemOracle
    from orchestrator.commands.isolate_points import IsolatePoints, LiveIsolatePoints
    from orchestrator.records import Candidate
    from orchestrator.run.blocks import level_candidate
    from orchestrator.runner.lifetime import block_order
    from orchestrator.sim_scenarios import system_stories as stories
    from orchestrator.system.differences import (
        apply,
        changes_from_system,
        check_distinct,
        reference_good,
    )
    from orchestrator.system.fingerprint_diff import diff
    from orchestrator.system.runtime_settable import live_indices

    rng = random.Random(seed)
    reference, now, _ = stories.system_story(STORIES[story], random.Random(seed))
    profile = {"verify_mult": 1.0, "decode_mult": 1.0, "verify_cuda_graph": True,
               "env_effects": [{"var": "NCCL_PROTO", "value": "LL128",
                                "allreduce_mult": nccl_mult},
                               {"var": "NCCL_ALGO", "value": "Tree", "allreduce_mult": 0.4}]}
    then = SystemOracle(reference, profile, restart_cv=0.0, rng=rng)
    node = SystemOracle(now, profile, restart_cv=0.0, rng=rng)
    base = Candidate.make("0" * 40)
    changes = changes_from_system(diff(then.fingerprint(base), node.fingerprint(base)))
    changes = [c for c in changes if c.factor != "package"]
    good = reference_good(base, changes)
    check_distinct(good, changes, str)
    live = live_indices(changes) if design == "lifetime" else frozenset()
    strategy = IsolateStrategy(len(changes), confidence=confidence,
                               labels=[c.label for c in changes], live=live)
    truth_good = node.truth(apply(good, changes, (), str))
    harmful = {c.name for i, c in enumerate(changes)
               if node.truth(apply(good, changes, [i], str)) / truth_good - 1
               >= HARMFUL_PCT / 100}
    points = (LiveIsolatePoints if live else IsolatePoints)(strategy, good, changes, str)
    observations: list[Observation] = []
    restarts = 0
    while True:
        verdict = strategy.verdict(observations)
        if verdict.done:
            break
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        restarts += 1
        level = _lognormal(rng, restart_cv)
        if live:
            cand, levels = points.launch(proposals[0].point)
            cands = [level_candidate(cand, lv) for lv in levels]
        else:
            cands = [points.candidate(proposals[0].point)]
        if rng.random() < outlier_rate:  # a restart that runs 3x slower throughout
            level *= 3.0
        order = block_order(len(cands), reps)  # the blocks as the lifetime runs them
        mults = [level * _lognormal(rng, interaction_cv) for _ in cands]
        values: list[list[float]] = [[] for _ in cands]
        for n, i in enumerate(order):
            values[i].append(node.truth(cands[i]) * mults[i] * (1.0 + drift * n)
                             * _lognormal(rng, rep_cv))
        for cand, vals in zip(cands, values, strict=True):
            logs = [math.log(v) for v in vals]
            spread = statistics.variance(logs) if len(vals) > 1 else None
            observations.append(Observation(points.point(cand), statistics.fmean(vals),
                                            trial_id=restarts, repetitions=len(vals),
                                            spread=spread,
                                            lifetime=restarts if live else None))
    verdict = strategy.verdict(observations)
    named = {changes[i].name for c in verdict.culprits for i in c.differences}
    correct = verdict.status == "found" and named == harmful
    wrong = verdict.status == "found" and named != harmful and verdict.probability >= confidence
    return Result(story, design, verdict.status, correct, restarts, float(verdict.probability),
                  wrong)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--restart-cv", type=float, default=0.02)
    ap.add_argument("--rep-cv", type=float, default=0.01)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--interaction-cv", type=float, default=0.0)
    ap.add_argument("--outlier-rate", type=float, default=0.0,
                    help="share of restarts that run 3x slower throughout")
    ap.add_argument("--drift", type=float, default=0.0,
                    help="relative drift per block within a lifetime (a GPU warming up)")
    ap.add_argument("--story", default="")
    ap.add_argument("--nccl-mult", type=float, default=0.3,
                    help="NCCL_PROTO's all-reduce multiplier (0.65: a +4.9%% difference)")
    a = ap.parse_args()
    print(f"restart cv {a.restart_cv}, repetition cv {a.rep_cv} x {a.reps}, lifetime-by-setting"
          f" cv {a.interaction_cv}, outliers {a.outlier_rate}, drift {a.drift} a block,"
          f" {a.cases} cases a story")
    print("| story | design | correct | wrong at P>=0.99 | restarts median / mean / max |")
    print("|---|---|---|---|---|")
    for story in STORIES:
        if a.story and story != a.story:
            continue
        for design in ("restarts", "lifetime"):
            rs = [run(story, a.seed * 100_003 + i, design, restart_cv=a.restart_cv,
                      rep_cv=a.rep_cv, reps=a.reps, interaction_cv=a.interaction_cv,
                      outlier_rate=a.outlier_rate, drift=a.drift, nccl_mult=a.nccl_mult)
                  for i in range(a.cases)]
            n = [r.restarts for r in rs]
            status = Counter(r.status for r in rs if not r.correct)
            print(f"| {story} | {design} | {sum(r.correct for r in rs)}/{len(rs)}"
                  + (f" ({', '.join(f'{v} {k}' for k, v in status.items())})" if status else "")
                  + f" | {sum(r.wrong_confident for r in rs)} | {statistics.median(n):.0f} /"
                  f" {statistics.fmean(n):.1f} / {max(n)} |", flush=True)


if __name__ == "__main__":
    main()
