"""What the final check's reference floor saves and what it costs, on simulated restarts.

An investigation against a reference: "then" is the reference's `n_then` restarts, fixed;
"now" is the bad state, and one named cause compares two candidates measured now. The answer's
remainder is the total (then vs now) less the cause, judged against the run's min effect with
the same functions the answer uses (:func:`orchestrator.answer.combine.decide`). The final
check then measures, a round at a time, the term an added restart narrows most (the total's
bad side, or both sides of the cause), up to 12 restarts, until the remainder decides:

- ``before``: that loop alone;
- ``floor``: the same, but stopping at once when
  :func:`orchestrator.commands.final_check.reference_floor` says no restart now can decide.

For each setting it prints how often each ends decided (and decided right: "explained" when
the true remainder is within the min effect, "a remainder" when it is beyond it), the restarts
spent, and the runs the floor stopped that the loop would have decided (lost decisions).

    python -m experiments.final_check_floor            # 2000 runs a setting
    RUNS=500 python -m experiments.final_check_floor
"""

from __future__ import annotations

import math
import os

import numpy as np

from orchestrator.answer.combine import (
    EXPLAINED,
    REMAINDER,
    LogChange,
    decide,
    min_effect,
    min_effect_pct,
)
from orchestrator.answer.phases import log_change
from orchestrator.commands.final_check import reference_floor

BUDGET = 12
START = 6  # restarts of the bad state and of each side of the cause before the check


def _draw(rng: np.random.Generator, level: float, sigma: float, n: int, tail: bool) -> list[float]:
    z = rng.standard_t(3, n) / math.sqrt(3.0) if tail else rng.standard_normal(n)
    return list(np.exp(level + sigma * z))


def _answer(then, bad, side_a, side_b):
    """The decision and the answer fields `reference_floor` reads, restart noise pooled over
    every group measured now (as the run's pooled ss is)."""
    ss = {k: float(((np.log(g) - np.log(g).mean()) ** 2).sum())
          for k, g in (("bad", bad), ("a", side_a), ("b", side_b))}
    whole = log_change(then, bad, ss["a"] + ss["b"], len(side_a) + len(side_b) - 2)
    cause = log_change(side_a, side_b, ss["bad"], len(bad) - 1)
    decision = decide(whole, [cause], min_effect(whole))
    doc = {"total": {"log": [whole.diff, whole.se, whole.df], "n": [len(then), len(bad)]},
           "unexplained": {"log": [decision.rest.diff, decision.rest.se, decision.rest.df]},
           "min_effect": {"pct": min_effect_pct(decision.bound)}}
    return decision, doc


def one_run(rng, *, n_then: int, sigma: float, total: float, cause: float, tail: bool,
            floor_rule: bool) -> tuple[str, int, float]:
    """(status, restarts spent, true remainder on the log scale) of one final check."""
    then = _draw(rng, 0.0, sigma, n_then, tail)
    bad = _draw(rng, total, sigma, START, tail)
    side_a = _draw(rng, total - cause, sigma, START, tail)
    side_b = _draw(rng, total, sigma, START, tail)
    spent = 0
    while True:
        decision, doc = _answer(then, bad, side_a, side_b)
        if decision.status != "undecided" or spent >= BUDGET:
            return decision.status, spent, total - cause
        if floor_rule and reference_floor({**doc, "status": "undecided"}) is not None:
            return decision.status, spent, total - cause
        gain_total = 1 / len(bad) - 1 / (len(bad) + 1)
        gain_cause = (1 / len(side_a) - 1 / (len(side_a) + 1)
                      + 1 / len(side_b) - 1 / (len(side_b) + 1)) / 2
        if gain_total >= gain_cause:
            bad += _draw(rng, total, sigma, 1, tail)
            spent += 1
        else:
            side_a += _draw(rng, total - cause, sigma, 1, tail)
            side_b += _draw(rng, total, sigma, 1, tail)
            spent += 2


def right(status: str, rest: float, bound: float) -> bool | None:
    if status == EXPLAINED:
        return abs(rest) <= bound
    if status == REMAINDER:
        return abs(rest) > bound
    return None


def main() -> None:
    runs = int(os.environ.get("RUNS", "2000"))
    print("| reference restarts | noise | true remainder | rule | decided | wrong | restarts"
          " | lost decisions |")
    print("|---|---|---|---|---|---|---|---|")
    for n_then in (1, 2, 3):
        for sigma, tail in ((0.025, False), (0.05, True)):
            for rest_pct in (0.0, 8.0):
                total, rest = math.log(1.3), math.log1p(rest_pct / 100.0)
                cause = total - rest
                results = {}
                for rule in (False, True):  # run i draws from its own seed under both rules
                    results[rule] = [one_run(np.random.default_rng(
                        (n_then, int(sigma * 1000), int(rest_pct), tail, i)), n_then=n_then,
                        sigma=sigma, total=total, cause=cause, tail=tail, floor_rule=rule)
                        for i in range(runs)]
                bound = min_effect(LogChange(total, 0.0, math.inf))
                for rule in (False, True):
                    rows = results[rule]
                    decided = [r for r in rows if r[0] != "undecided"]
                    wrong = sum(1 for s, _, t in decided if right(s, t, bound) is False)
                    lost = sum(1 for a, b in zip(results[False], results[True], strict=True)
                               if a[0] != "undecided" and b[0] == "undecided") if rule else 0
                    noise = f"{sigma:.1%} {'t3' if tail else 'normal'}"
                    print(f"| {n_then} | {noise} | {rest_pct:+.0f}% | {'floor' if rule else 'before'}"
                          f" | {len(decided) / runs:.3f} | {wrong} | "
                          f"{np.mean([r[1] for r in rows]):.1f} | {lost if rule else '-'} |")


if __name__ == "__main__":
    main()
