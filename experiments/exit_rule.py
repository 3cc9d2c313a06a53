"""How often does the exit code say "answered" (0) while a cause is missing?

The exit rule (`orchestrator/errors.py`) gives 0 when the named causes carry the change: no
remainder beyond the min effect is shown and the remainder's 95% interval cannot hold half of
the total (`orchestrator/answer/compose.py: carried`); the answer then says how much may be left.
This measures the rule on simulated investigations in the shape of the seed's (a total between
then and now, a system cause and a code cause, each from its own restarts), with the answer's
own functions (`assemble`, `answer_exit`), on Student-t (3 df) restart noise, with a cause
nobody named of 0% (the named causes are the whole change), +5%, +10% or +20%.

Counted per row: the share of runs that exit 0, 3 and 4; with a missing cause, every 0 is a
run whose answer names causes that do not account for all of the change (its sentence still
says "up to +x% may be left", an interval that holds the missing part or not: both counted).

Run: ``python -m experiments.exit_rule [--cases 2000]``.
"""

from __future__ import annotations

import argparse
import math
import random
from collections import Counter

from orchestrator.answer import assemble
from orchestrator.answer.phases import log_change
from orchestrator.errors import answer_exit

BASE, POWER, COMMIT = 19.0, 1.30, 1.18


def _trials(level: float, n: int, cv: float, rng: random.Random, df: int = 3) -> list[float]:
    out = []
    for _ in range(n):
        z = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(df)) / df)
        out.append(level * math.exp(cv * z * math.sqrt((df - 2) / df)))
    return out


def one(rng: random.Random, cv: float, n: int, n_then: int, missing: float) -> tuple[int, bool]:
    """(exit code, whether the answer's stated bound holds the missing part)."""
    then = _trials(BASE, n_then, cv, rng)
    now = _trials(BASE * POWER * COMMIT * (1 + missing), n, cv, rng)
    restored = _trials(BASE, n, cv, rng)
    capped = _trials(BASE * POWER, n, cv, rng)
    parent = _trials(BASE * POWER, n, cv, rng)
    culprit = _trials(BASE * POWER * COMMIT, n, cv, rng)
    causes = []
    for label, change in (("power limit", log_change(restored, capped)),
                          ("commit", log_change(parent, culprit))):
        causes.append({"kind": "env", "id": label, "label": label, "probability": 0.999,
                       **change.to_json()})
    answer = assemble("verify_ms", log_change(then, now), causes, lead="")
    rest = answer.get("unexplained") or {}
    bound = rest.get("up_to")
    holds = bound is not None and bound >= 100 * missing
    return answer_exit(answer), holds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=2000)
    args = parser.parse_args(argv)
    print("| restart noise | restarts a side (then) | missing cause | exit 0 | exit 3 | exit 4 |"
          " exit 0 whose 'up to' holds the missing part |")
    print("|---|---|---|---|---|---|---|")
    for cv, n, n_then in ((0.02, 6, 3), (0.05, 6, 3), (0.05, 12, 3), (0.10, 12, 5),
                          (0.25, 12, 5)):
        for missing in (0.0, 0.05, 0.10, 0.20):
            rng = random.Random(f"{cv}-{n}-{missing}")
            codes, held = Counter(), 0
            for _ in range(args.cases):
                code, holds = one(rng, cv, n, n_then, missing)
                codes[code] += 1
                held += code == 0 and holds
            share = {c: codes[c] / args.cases for c in (0, 3, 4)}
            print(f"| {100 * cv:.0f}% Student-t(3) | {n} ({n_then}) | {100 * missing:+.0f}% |"
                  f" {share[0]:.3f} | {share[3]:.3f} | {share[4]:.3f} |"
                  f" {held} of {codes[0]} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
