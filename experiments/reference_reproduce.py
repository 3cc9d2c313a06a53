"""How often does a bisect told the good level (`was=VALUE`, or a reference run's level) end a
real regression as "not reproducible"? And what does that level save where the range really
holds no change?

Told the level the user remembers, the bisect rules a range out when its change is confidently
under half of the change since that level: the regression is elsewhere. On a real change that
answer is confidently wrong ("not in this range"), so it is held to the standard of the run's
other answers. This harness measures it on noise that real nodes make, independent of the
localization benchmark's regimes:

- ``bimodal``: each restart lands in a slow state with probability 0.3 (a slow NCCL ring, a bad
  placement), +10% on top of 2% normal noise: two levels, and two restarts of one commit agree
  most of the time;
- ``outliers``: log-normal noise of 5% with one restart in twenty at 3x;
- ``lognormal``: log-normal noise of 5%;
- ``load_step``: normal noise of 5% and a neighbour's job adding 10% for 30 trials, starting
  somewhere in trials 0-20;
- ``ref5``: the ``bimodal`` node, and the level a 5-restart reference run measured on it (the
  mean of five restarts of the good commit), not the exact one.

Each case is a chain of 64 commits. A *real change* has one culprit at a seeded position with a
step drawn from +8%, +15%, +30% or +53%, and the level given is the good commit's; a *no-change*
case has the same step before the range (the level given is below both endpoints by it). Every
case is driven through the strategy's own ``propose``/``verdict`` loop, one trial at a time, up to
``--trials`` restarts (default: through the reproduce phase and the audit that follows it, which
is where "not reproducible" is decided: 120 restarts, or to the end with ``--full``).

Counted per kind: real changes that ended "not reproducible" (or "reversed": both say "not in
this range") and their share, no-change cases that ended "not reproducible" and the restarts
they took, with and without the level (the plain bisect has only the 1% floor and its 48-a-side
cap to end on).

Run: ``python -m experiments.reference_reproduce --cases 1000`` (``--kinds bimodal,outliers``,
``--workers 2``, ``--method level|plain``). Prints one table row per kind and method.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass
from multiprocessing import Pool

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

from orchestrator.strategies import BisectStrategy, Observation

N = 64
BASE = 19.0
STEPS = (0.08, 0.15, 0.30, 0.53)
SEED = 20261206
KINDS = ("bimodal", "outliers", "lognormal", "load_step", "ref5")


@dataclass(frozen=True)
class Case:
    kind: str
    index: int
    change: bool

    @property
    def rng_seed(self) -> tuple[int, ...]:
        return (SEED, KINDS.index(self.kind), int(self.change), self.index)


class Node:
    """Trial values of one case: the j-th restart of a commit always draws the same noise."""

    def __init__(self, case: Case) -> None:
        rng = np.random.default_rng(case.rng_seed)
        self.case = case
        self.step = float(STEPS[int(rng.integers(len(STEPS)))])
        self.culprit = int(rng.integers(1, N)) if case.change else -1
        self.load_start = int(rng.integers(0, 21))
        self.trials = 0
        self.visits: Counter[int] = Counter()

    def level(self, point: int) -> float:
        return BASE * (1.0 + self.step) if 0 <= self.culprit <= point else BASE

    def given_level(self) -> float:
        """The good level the user states: the good commit's (a real change in the range), or
        the level before a regression that lies before the range (no change in it)."""
        true = self.level(0) if self.case.change else BASE / (1.0 + self.step)
        if self.case.kind != "ref5":
            return true
        rng = np.random.default_rng((*self.case.rng_seed, 99))
        return float(np.mean([true * self._noise(rng) for _ in range(5)]))

    def _noise(self, rng: np.random.Generator) -> float:
        kind = self.case.kind
        if kind in ("bimodal", "ref5"):
            slow = 1.10 if rng.random() < 0.3 else 1.0
            return slow * max(1.0 + 0.02 * rng.standard_normal(), 0.05)
        if kind in ("outliers", "lognormal"):
            sigma = math.sqrt(math.log1p(0.05 ** 2))
            value = math.exp(sigma * rng.standard_normal() - 0.5 * sigma * sigma)
            if kind == "outliers" and rng.random() < 0.05:
                value *= 3.0
            return value
        return max(1.0 + 0.05 * rng.standard_normal(), 0.05)  # load_step

    def measure(self, point: int) -> float:
        rng = np.random.default_rng((*self.case.rng_seed, point, self.visits[point]))
        self.visits[point] += 1
        value = self.level(point) * self._noise(rng)
        if self.case.kind == "load_step" and \
                self.load_start <= self.trials < self.load_start + 30:
            value *= 1.10
        self.trials += 1
        return value


def run_case(task: tuple[str, int, bool, str, int]) -> tuple[str, str, bool, str, int]:
    kind, index, change, method, limit = task
    node = Node(Case(kind, index, change))
    strategy = BisectStrategy(N, confidence=0.99, max_trials=None if limit < 400 else limit,
                              reference_value=node.given_level() if method == "level" else None)
    observations: list[Observation] = []
    status = "searching"
    while len(observations) < limit:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        for p in proposals:
            observations.append(Observation(p.point, node.measure(p.point),
                                            trial_id=len(observations)))
    verdict = strategy.verdict(observations)
    status = verdict.status
    return kind, method, change, status, len(observations)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=1000)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--method", default="level,plain")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--trials", type=int, default=120)
    parser.add_argument("--full", action="store_true", help="to the end (cap 1500)")
    parser.add_argument("--no-change-cases", type=int, default=None,
                        help="no-change cases per kind (default: a fifth of --cases)")
    args = parser.parse_args(argv)
    limit = 1500 if args.full else args.trials
    kinds = [k for k in args.kinds.split(",") if k]
    methods = [m for m in args.method.split(",") if m]
    quiet = args.no_change_cases if args.no_change_cases is not None else max(args.cases // 5, 1)
    tasks = [(k, i, True, m, limit) for k in kinds for m in methods for i in range(args.cases)]
    tasks += [(k, i, False, m, limit) for k in kinds for m in methods for i in range(quiet)]
    results: dict[tuple[str, str, bool], list[tuple[str, int]]] = {}
    with Pool(args.workers) as pool:
        for kind, method, change, status, n in pool.imap_unordered(run_case, tasks, 8):
            results.setdefault((kind, method, change), []).append((status, n))
    print(f"reference_reproduce: {N} commits, steps {STEPS}, up to {limit} restarts a case")
    print(f"{'kind':<10} {'method':<6} {'real changes':>12} {'not in range':>13}"
          f" {'no-change':>10} {'ruled out':>10} {'restarts (mean)':>16}")
    for kind in kinds:
        for method in methods:
            real = results.get((kind, method, True), [])
            flat = results.get((kind, method, False), [])
            wrong = sum(1 for s, _ in real if s in ("not_reproducible", "reversed"))
            out = [n for s, n in flat if s == "not_reproducible"]
            mean = f"{sum(out) / len(out):.1f}" if out else "-"
            print(f"{kind:<10} {method:<6} {len(real):>12} {wrong:>13}"
                  f" {len(flat):>10} {len(out):>10} {mean:>16}")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
