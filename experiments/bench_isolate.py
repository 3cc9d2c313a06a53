"""Virtual-oracle benchmark of the isolate strategy: accuracy, calibration and trial cost.

Each case plants causes among ``D`` differences: single causes (a multiplicative effect when the
difference is applied) and pairs that only hurt together (an effect when both are applied, none
for either alone). A trial of a subset returns ``base * prod(1 + effect) * (1 + cv * z)``, z
standard normal (or Student-t with 4 degrees of freedom for heavy tails). Trials finish in
random order on ``k`` simulated nodes, as with the real controller.

Correct means: status "found" and the named causes (kind and differences) equal the planted
ones. Calibration compares the share of correct answers among "found" answers with the requested
confidence. Cost is compared with one-factor-at-a-time (OFAT): each difference added alone to good
``r`` times plus good ``r`` times (``(D + 1) * r`` trials; it cannot see a pair that only hurts
together), and both ways (``(2 D + 2) * r``), which can.

Usage: ``python experiments/bench_isolate.py [--cases 200] [--seed 0] [--k 1] [--heavy]``
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.strategies.base import Observation  # noqa: E402
from orchestrator.strategies.isolate import IsolateStrategy  # noqa: E402


@dataclass(frozen=True)
class Case:
    """Planted truth: ``singles[i]`` and ``pairs[(i, j)]`` are relative effects (0.28 = +28%)."""

    n_differences: int
    singles: Mapping[int, float]
    pairs: Mapping[tuple[int, int], float] = field(default_factory=dict)
    cv: float = 0.02
    direction: str = "increase"
    heavy_tails: bool = False

    def truth(self) -> set[tuple[str, tuple[int, ...]]]:
        found = {("single", (i,)) for i in self.singles}
        return found | {("interaction", tuple(sorted(p))) for p in self.pairs}


def oracle(case: Case, rng: random.Random) -> Callable[[frozenset[int]], float]:
    """Trial values of a subset under the case's truth, with restart-level noise."""

    def value(subset: frozenset[int]) -> float:
        factor = 1.0
        for index, effect in case.singles.items():
            if index in subset:
                factor *= 1.0 + effect
        for (first, second), effect in case.pairs.items():
            if first in subset and second in subset:
                factor *= 1.0 + effect
        if case.direction == "decrease":
            factor = 1.0 / factor
        noise = rng.gauss(0.0, 1.0)
        if case.heavy_tails:
            noise = rng.gauss(0.0, 1.0) / math.sqrt(rng.gammavariate(2.0, 0.5)) / math.sqrt(2.0)
        return 100.0 * factor * max(1.0 + case.cv * noise, 0.05)

    return value


@dataclass(frozen=True)
class Outcome:
    status: str
    named: set[tuple[str, tuple[int, ...]]]
    correct: bool
    n_trials: int
    probability: float
    seconds: float


def run_case(case: Case, seed: int, *, k: int = 1, confidence: float = 0.99,
             max_trials: int | None = None) -> Outcome:
    """Drive one case to the strategy's verdict with ``k`` simulated nodes."""
    rng = random.Random(seed)
    measure = oracle(case, rng)
    strategy = IsolateStrategy(case.n_differences, direction=case.direction,
                               confidence=confidence, max_trials=max_trials)
    observations: list[Observation] = []
    pending: list[int] = []
    started = time.perf_counter()
    while True:
        verdict = strategy.verdict(observations)
        if not verdict.done and len(pending) < k:
            pending += [p.point for p in strategy.propose(observations, pending, k - len(pending))]
        if not pending:
            break
        point = pending.pop(rng.randrange(len(pending)))
        observations.append(Observation(point, measure(strategy.subset(point))))
    verdict = strategy.verdict(observations)
    named = {(c.kind, c.differences) for c in verdict.culprits}
    return Outcome(
        status=verdict.status,
        named=named,
        correct=verdict.status == "found" and named == case.truth(),
        n_trials=verdict.n_trials,
        probability=verdict.probability,
        seconds=time.perf_counter() - started,
    )


def random_case(rng: random.Random, *, heavy_tails: bool = False) -> Case:
    """A case whose every cause is at least 1.5x the default naming threshold.

    Effects below the threshold (10% of the total change, one restart-noise sigma, at least 1%)
    are by design neither named nor ruled out, so cases with such effects would test nothing.
    """
    while True:
        n = rng.randint(6, 40)
        n_singles = rng.choice([1, 1, 2, 2, 3])
        with_pair = rng.random() < 0.3 and n >= n_singles + 2
        picks = rng.sample(range(n), n_singles + (2 if with_pair else 0))
        effects = [math.exp(rng.uniform(math.log(0.05), math.log(0.4))) for _ in picks]
        singles = dict(zip(picks[:n_singles], effects[:n_singles], strict=True))
        pairs = {}
        if with_pair:
            pairs[tuple(sorted(picks[n_singles:]))] = effects[n_singles]
        cv = rng.uniform(0.01, 0.03)
        logs = [math.log1p(e) for e in list(singles.values()) + list(pairs.values())]
        threshold = max(math.log(1.01), 0.1 * sum(logs), cv)
        if min(logs) >= 1.5 * threshold:
            return Case(n, singles, pairs, cv=cv,
                        direction=rng.choice(["increase", "decrease"]), heavy_tails=heavy_tails)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--heavy", action="store_true", help="Student-t(4) restart noise")
    parser.add_argument("--repeats", type=int, default=3, help="OFAT repeats per subset")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    outcomes, ofat, ofat_both = [], [], []
    for index in range(args.cases):
        case = random_case(rng, heavy_tails=args.heavy)
        outcome = run_case(case, args.seed * 100_003 + index, k=args.k,
                           confidence=args.confidence)
        outcomes.append(outcome)
        ofat.append((case.n_differences + 1) * args.repeats)
        ofat_both.append((2 * case.n_differences + 2) * args.repeats)
        if not outcome.correct:
            print(f"case {index}: {outcome.status}, named {sorted(outcome.named)}, truth "
                  f"{sorted(case.truth())}, D={case.n_differences}, cv={case.cv:.3f}, "
                  f"{outcome.n_trials} trials, P={outcome.probability:.3f}")
    found = [o for o in outcomes if o.status == "found"]
    correct = sum(o.correct for o in found)
    trials = [o.n_trials for o in outcomes]
    print(f"{len(outcomes)} cases, k={args.k}, confidence {args.confidence}")
    print(f"found {len(found)}; correct among found {correct}/{len(found)} = "
          f"{correct / max(len(found), 1):.3f}; correct overall "
          f"{sum(o.correct for o in outcomes) / len(outcomes):.3f}")
    print(f"trials: median {statistics.median(trials):.0f}, mean {statistics.mean(trials):.1f}, "
          f"max {max(trials)}; OFAT x{args.repeats}: mean {statistics.mean(ofat):.1f}, both "
          f"ways {statistics.mean(ofat_both):.1f}")
    print(f"seconds per case: mean {statistics.mean(o.seconds for o in outcomes):.2f}")


if __name__ == "__main__":
    main()
