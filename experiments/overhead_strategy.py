"""Decision time of `BisectStrategy` as the number of commits grows (part of overhead.py).

A virtual oracle answers every proposal at once (a culprit at 60% of the range, +20%, 2%
restart noise, one node), so only the strategy's own time is measured: each `propose()` and
each `verdict()` call of the drive loop (`orchestrator/control/drive.py` calls both once per finished
trial). Each call is timed by the wall clock and by the process's CPU time: on a shared machine
the CPU time is what the strategy itself costs, the wall time adds other users' load. With
`profile`, cProfile's top functions by own time say where it goes.

    python experiments/overhead_strategy.py --sizes 1000,10000,50000 --profile
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.strategies.base import Observation  # noqa: E402
from orchestrator.strategies.bisect import BisectStrategy  # noqa: E402

MAX_DECISIONS = 120


def _value(point: int, culprit: int, rng: random.Random) -> float:
    return (1.2 if point >= culprit else 1.0) * (1.0 + 0.02 * rng.gauss(0.0, 1.0))


def one_size(n: int, seed: int = 0, profile: bool = False) -> dict:
    rng = random.Random(seed)
    culprit = int(n * 0.6)
    strategy = BisectStrategy(n, direction="increase", confidence=0.99)
    observations: list[Observation] = []
    propose_s: list[float] = []
    verdict_s: list[float] = []
    propose_cpu: list[float] = []
    verdict_cpu: list[float] = []
    prof = cProfile.Profile() if profile else None
    verdict = strategy.verdict(observations)
    for _ in range(MAX_DECISIONS):
        if verdict.done:
            break
        if prof:
            prof.enable()
        t, c = time.perf_counter(), time.process_time()
        proposals = strategy.propose(observations, [], 1)
        propose_s.append(time.perf_counter() - t)
        propose_cpu.append(time.process_time() - c)
        if prof:
            prof.disable()
        if not proposals:
            break
        point = proposals[0].point
        observations.append(Observation(point, _value(point, culprit, rng),
                                        trial_id=len(observations) + 1))
        if prof:
            prof.enable()
        t, c = time.perf_counter(), time.process_time()
        verdict = strategy.verdict(observations)
        verdict_s.append(time.perf_counter() - t)
        verdict_cpu.append(time.process_time() - c)
        if prof:
            prof.disable()
    row = {
        "commits": n,
        "decisions": len(propose_s),
        "propose_ms": round(statistics.median(propose_s) * 1e3, 2),
        "propose_max_ms": round(max(propose_s) * 1e3, 2),
        "verdict_ms": round(statistics.median(verdict_s) * 1e3, 2),
        "verdict_max_ms": round(max(verdict_s) * 1e3, 2),
        "propose_cpu_ms": round(statistics.median(propose_cpu) * 1e3, 2),
        "verdict_cpu_ms": round(statistics.median(verdict_cpu) * 1e3, 2),
        "load": round(os.getloadavg()[0], 2),
        "status": verdict.status,
        "found": bool(verdict.top and verdict.top.point == culprit),
    }
    if prof:
        row["profile"] = _top(prof, len(propose_s) + len(verdict_s))
    return row


def _top(prof: cProfile.Profile, calls: int, n: int = 8) -> list[str]:
    """The functions with the most own time, as ms per decision."""
    stats = pstats.Stats(prof).stats  # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    rows = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:n]
    out = []
    for (file, line, name), (_, ncalls, tottime, _cum, _) in rows:
        where = f"{Path(file).name}:{line}({name})" if line else name
        out.append(f"{tottime * 1e3 / max(1, calls):7.3f} ms/decision  {ncalls:>8} calls  {where}")
    return out


def strategy_timings(sizes: list[int], profile: bool = False) -> list[dict]:
    return [one_size(n, profile=profile) for n in sizes]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="1000,10000,50000")
    p.add_argument("--profile", action="store_true")
    a = p.parse_args()
    for row in strategy_timings([int(s) for s in a.sizes.split(",")], a.profile):
        lines = row.pop("profile", [])
        print(row)
        for line in lines:
            print("   ", line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
