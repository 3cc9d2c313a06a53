"""Where a bisect's restarts go, beside what learning the levels alone costs.

The localization benchmark compares sleuth's mean restarts with the learned-levels bound of
:mod:`experiments.level_cost` (an oracle's placement read by a posterior that learns the levels
and the noise, two trials per endpoint, no reproduction, no verification). This splits sleuth's
restarts on the same cases by what each was for, as the strategy's proposals say:

- ``reproduce``: the endpoints, until the change reproduces;
- ``search``: placed by the posterior to locate the step;
- ``verify``: the culprit and its parent head to head, the naming rule's hold included;
- ``checks``: the end rule and the audits (anchors of the unexplained change, the endpoints
  measured again to confirm the change or to rule out a further step).

so that the ratio to the bound can be read per part: which parts a calibrated method pays that
the bound does not, and which part is placement.

Run: ``python -m experiments.bisect_phases`` (``CASES=N``, default 200 a regime;
``REGIMES=seed_verify,decode_like,subtle``; ``METHODS=sleuth,sleuth_prior``).
"""

from __future__ import annotations

import os
import sys
from collections import Counter

import numpy as np

from experiments.bench_localize import MAX_TRIALS, METHODS
from experiments.level_cost import run_case as level_case
from experiments.localize_cases import VirtualOracle, regime
from orchestrator.strategies import Observation

PARTS = ("reproduce", "search", "verify", "checks")
CHECK_WORDS = ("anchor", "confirm", "audit", "rule out")


def part_of(phase: str, reason: str) -> str:
    """Which part a proposal pays for (see the module docstring)."""
    if any(word in reason for word in CHECK_WORDS):
        return "checks"
    return phase


def split_case(method_name: str, regime_name: str, case: int) -> Counter:
    """Restarts of one case by part, as the method's own proposals label them."""
    reg = regime(regime_name)
    oracle = VirtualOracle(reg, case)
    method = next(m for m in METHODS if m.name == method_name)
    strategy = method.build(reg, oracle.case)
    observations: list[Observation] = []
    parts: Counter = Counter()
    while len(observations) < MAX_TRIALS:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        proposal = proposals[0]
        parts[part_of(proposal.phase, proposal.reason)] += 1
        observations.append(Observation(proposal.point, oracle.measure(proposal.point),
                                        trial_id=len(observations)))
    return parts


def main() -> int:
    cases = int(os.environ.get("CASES", "200"))
    regimes = os.environ.get("REGIMES", "seed_verify,decode_like,subtle").split(",")
    methods = os.environ.get("METHODS", "sleuth,sleuth_prior").split(",")
    print(f"restarts by part, mean over {cases} cases a regime; bound: learned levels "
          f"(experiments.level_cost), same cases")
    print(f"{'regime':<12} {'method':<13} " + " ".join(f"{p:>9}" for p in PARTS)
          + f" {'total':>7} {'bound':>7} {'ratio':>6}")
    for name in regimes:
        bound = float(np.mean([level_case(regime(name), c)["learned"][0] for c in range(cases)]))
        for method in methods:
            splits = [split_case(method, name, c) for c in range(cases)]
            means = {p: float(np.mean([s[p] for s in splits])) for p in PARTS}
            total = sum(means.values())
            print(f"{name:<12} {method:<13} " + " ".join(f"{means[p]:>9.1f}" for p in PARTS)
                  + f" {total:>7.1f} {bound:>7.1f} {total / bound:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
