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

**System cases** (``--system``) run the whole system-level path instead of a bare oracle over
subsets: a scenario's reference and current node (`orchestrator.sim_scenarios.presets`
system stories) are fingerprinted by a virtual trial (`SystemOracle`: the GPU snapshot after
the candidate's clock policy, the server's environment after the node's launcher wrapper), the
fingerprints are diffed, the controllable differences become changes, and each candidate the
strategy asks for is built by `apply` and measured by the sim's model. Stories: ``clock_pair``
(power limit and SM lock changed together), ``launcher_strip`` (NCCL_ALGO dropped by a
launcher wrapper), ``seed_system`` (an SM lock, a stripped NCCL variable, 20 harmless
variables, a driver and a package bump), ``nccl_upgrade`` (the NCCL wheel upgraded into the
sim's 2.28 regression, a harmless package bump whose old wheel exists, one without, a changed
variable; a package change is tested only when its old wheel exists). Correct: "found", the
named differences are exactly those whose effect alone is above 3%. First, the stories where
causes do not simply add up (a commit under larger system causes, overlapping and synergistic
settings, a node that changes mid-isolate: `experiments/isolate_stories.py`, each with its own
"correct"); ``--story NAME`` runs one of them alone.

Usage: ``python experiments/bench_isolate.py [--cases 200] [--seed 0] [--k 1] [--heavy]``
       ``python experiments/bench_isolate.py --system [--cases 50]``
       ``python experiments/bench_isolate.py --system --story env_overlap --cases 20``
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


def drive(strategy: IsolateStrategy, k: int, rng: random.Random,
          trial: Callable[[int], Observation]) -> list[Observation]:
    """Observations until the verdict, ``k`` trials in flight finishing in random order."""
    observations: list[Observation] = []
    pending: list[int] = []
    while True:
        verdict = strategy.verdict(observations)
        if not verdict.done and len(pending) < k:
            pending += [p.point for p in strategy.propose(observations, pending, k - len(pending))]
        if not pending:
            return observations
        observations.append(trial(pending.pop(rng.randrange(len(pending)))))


def run_case(case: Case, seed: int, *, k: int = 1, confidence: float = 0.99,
             max_trials: int | None = None) -> Outcome:
    """Drive one case to the strategy's verdict with ``k`` simulated nodes."""
    rng = random.Random(seed)
    measure = oracle(case, rng)
    strategy = IsolateStrategy(case.n_differences, direction=case.direction,
                               confidence=confidence, max_trials=max_trials)
    started = time.perf_counter()
    observations = drive(strategy, k, rng,
                         lambda point: Observation(point, measure(strategy.subset(point))))
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


SYSTEM_STORIES = {"clock_pair": "clock_pair", "launcher_strip": "launcher_strip",
                  "seed_system": "seed_system",
                  "nccl_upgrade": "nccl_upgrade"}  # story -> preset (for its env effects)
HARMFUL_PCT = 3.0


@dataclass(frozen=True)
class SystemOutcome:
    status: str
    named: set[str]
    harmful: set[str]
    n_changes: int
    n_trials: int
    max_per_candidate: int
    probability: float

    @property
    def correct(self) -> bool:
        return self.status == "found" and self.named == self.harmful


def run_system_case(story: str, seed: int, *, k: int = 1, confidence: float = 0.99,
                    restart_cv: float = 0.02) -> SystemOutcome:
    """One system-level isolate through the real difference model (see the module doc)."""
    from collections import Counter

    from experiments.system_oracle import SystemOracle
    from orchestrator.commands.isolate_points import IsolatePoints
    from orchestrator.records import Candidate
    from orchestrator.sim_scenarios import presets as material
    from orchestrator.sim_scenarios import system_stories as stories
    from orchestrator.system.differences import (
        apply,
        changes_from_system,
        check_distinct,
        reference_good,
    )
    from orchestrator.system.fingerprint_diff import diff

    rng = random.Random(seed)
    reference, now, _ = stories.system_story(story, random.Random(seed))
    spec = material.PRESETS[SYSTEM_STORIES[story]]
    profile = {"verify_mult": 1.0, "decode_mult": 1.0, "verify_cuda_graph": True,
               "env_effects": [dict(e) for e in spec.env_effects]}
    then = SystemOracle(reference, profile, restart_cv=restart_cv, rng=rng)
    node = SystemOracle(now, profile, restart_cv=restart_cv, rng=rng)
    base = Candidate.make("0" * 40)
    changes = changes_from_system(diff(then.fingerprint(base), node.fingerprint(base)))
    # A package change is tested only when its old wheel is in the package source (the
    # story's wheel directory), as `sleuth isolate packages.find_links=DIR` does.
    changes = [c for c in changes if c.factor != "package" or (c.key, c.good) in reference.wheels]
    good = reference_good(base, changes)

    def resolve(ref: str) -> str:
        return ref

    check_distinct(good, changes, resolve)
    strategy = IsolateStrategy(len(changes), confidence=confidence,
                               labels=[c.label for c in changes])
    points = IsolatePoints(strategy, good, changes, resolve)
    truth_good = node.truth(apply(good, changes, (), resolve))
    harmful = {c.name for i, c in enumerate(changes)
               if node.truth(apply(good, changes, [i], resolve)) / truth_good - 1
               >= HARMFUL_PCT / 100}
    per_candidate: Counter[str] = Counter()

    def trial(point: int) -> Observation:
        cand = points.candidate(point)
        per_candidate[cand.key] += 1
        # Mapped back from the candidate, as the controller maps a stored trial back.
        return Observation(points.point(cand), node.measure(cand))

    verdict = strategy.verdict(drive(strategy, k, rng, trial))
    named = {changes[i].name for c in verdict.culprits for i in c.differences}
    return SystemOutcome(verdict.status, named, harmful, len(changes), verdict.n_trials,
                         max(per_candidate.values(), default=0), verdict.probability)


def stories_main(cases: int, seed: int, k: int, confidence: float,
                 only: str | None = None) -> None:
    """The stories where causes do not simply add up (`experiments/isolate_stories.py`)."""
    from experiments.isolate_stories import STORIES

    for story, run in STORIES.items():
        if only and story != only:
            continue
        outcomes = [run(seed * 100_003 + i, k=k, confidence=confidence) for i in range(cases)]
        for i, o in enumerate(outcomes):
            if not o.correct:
                print(f"{story} case {i}: {o.detail}, {o.n_trials} trials")
        trials = [o.n_trials for o in outcomes]
        old = [o.old_yardstick for o in outcomes if o.old_yardstick is not None]
        print(f"{story} (k={k}): correct {sum(o.correct for o in outcomes)}/{cases}; trials "
              f"median {statistics.median(trials):.0f}, mean {statistics.mean(trials):.1f}, max"
              f" {max(trials)}" + (f"; with the old yardstick the bisect named the commit in"
                                   f" {sum(old)}/{len(old)}" if old else ""))


def system_main(cases: int, seed: int, k: int, confidence: float) -> None:
    stories_main(cases, seed, k, confidence)
    for story in SYSTEM_STORIES:
        outcomes = [run_system_case(story, seed * 100_003 + i, k=k, confidence=confidence)
                    for i in range(cases)]
        for i, o in enumerate(outcomes):
            if not o.correct:
                print(f"{story} case {i}: {o.status}, named {sorted(o.named)}, harmful "
                      f"{sorted(o.harmful)}, {o.n_trials} trials, P={o.probability:.3f}")
        trials = [o.n_trials for o in outcomes]
        print(f"{story}: {outcomes[0].n_changes} differences, harmful "
              f"{sorted(outcomes[0].harmful)}; correct {sum(o.correct for o in outcomes)}/"
              f"{cases}; trials median {statistics.median(trials):.0f}, mean "
              f"{statistics.mean(trials):.1f}, max {max(trials)}; most trials of one candidate "
              f"{max(o.max_per_candidate for o in outcomes)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--system", action="store_true", help="the system-level cases")
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--k", type=int, default=1)
    parser.add_argument("--confidence", type=float, default=0.99)
    parser.add_argument("--heavy", action="store_true", help="Student-t(4) restart noise")
    parser.add_argument("--repeats", type=int, default=3, help="OFAT repeats per subset")
    parser.add_argument("--story", help="with --system: only this story of"
                        " experiments/isolate_stories.py")
    args = parser.parse_args()
    if args.system and args.story:
        stories_main(args.cases if args.cases != 200 else 20, args.seed, args.k,
                     args.confidence, only=args.story)
        return
    if args.system:
        system_main(min(args.cases, 50) if args.cases == 200 else args.cases, args.seed, args.k,
                    args.confidence)
        return
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
