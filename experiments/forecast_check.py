"""How good is the bisect strategy's forecast of the trials it still needs (the ETA's basis)?

For each regime of the localization benchmark, runs the strategy on the virtual oracle and
compares the forecast with the trials it actually went on to spend, at two moments: when the
endpoints have just reproduced (the first forecast) and halfway through the rest of the run.
Prints the median and the 10th/90th percentiles of forecast / actual.

Run: ``python -m experiments.forecast_check`` (``CASES=N``, default 30 per regime).
"""

from __future__ import annotations

import os
import sys

import numpy as np

from experiments.bench_localize import MAX_TRIALS, N_COMMITS, REGIMES, VirtualOracle
from orchestrator.strategies import BisectStrategy, Observation


def forecasts(regime_name: str, case: int) -> list[tuple[int, int | None]]:
    """``(trials so far, forecast of the rest)`` before every proposal, and the final count."""
    regime = next(r for r in REGIMES if r.name == regime_name)
    oracle = VirtualOracle(regime, case)
    strategy = BisectStrategy(N_COMMITS, max_trials=MAX_TRIALS)
    observations: list[Observation] = []
    seen: list[tuple[int, int | None]] = []
    while True:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        seen.append((len(observations), strategy.expected_remaining()))
        point = proposals[0].point
        observations.append(Observation(point, oracle.measure(point), trial_id=len(observations)))
    seen.append((len(observations), None))
    return seen


def ratios(regime_name: str, cases: int) -> dict[str, np.ndarray]:
    first, halfway = [], []
    for case in range(cases):
        seen = forecasts(regime_name, case)
        total = seen[-1][0]
        made = [(done, left) for done, left in seen if left is not None]
        if not made:
            continue
        start = made[0][0]
        first.append(made[0][1] / max(total - start, 1))
        middle = next((d, left) for d, left in made if d >= (start + total) // 2)
        halfway.append(middle[1] / max(total - middle[0], 1))
    return {"first": np.array(first), "halfway": np.array(halfway)}


def no_change_forecasts(cases: int) -> tuple[np.ndarray, np.ndarray]:
    """Largest forecast of the rest seen during each no-change run, and its total trials: the
    forecast of a lucky reproduction may climb, but never silently (the run stops when it keeps
    exceeding twice the budget)."""
    largest, totals = [], []
    for case in range(cases):
        seen = forecasts("no_change", case)
        made = [left for _, left in seen if left is not None]
        largest.append(max(made) if made else 0)
        totals.append(seen[-1][0])
    return np.array(largest), np.array(totals)


def main() -> int:
    cases = int(os.environ.get("CASES", "30"))
    print(f"forecast / actual remaining trials, {cases} cases per regime (median [p10, p90])")
    for regime in ("seed_verify", "decode_like", "subtle"):
        row = ratios(regime, cases)
        cells = [f"{name} {np.median(r):.2f} [{np.percentile(r, 10):.2f}, "
                 f"{np.percentile(r, 90):.2f}]" for name, r in row.items()]
        print(f"{regime:<12} " + "   ".join(cells))
    largest, totals = no_change_forecasts(cases)
    print(f"no_change    largest forecast during a run: median {np.median(largest):.0f}, max "
          f"{largest.max():.0f}; trials per run: mean {totals.mean():.1f}, max {totals.max()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
