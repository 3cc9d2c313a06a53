"""What does not knowing the good and bad levels cost a bisection, on identical data?

The localization benchmark's oracle is told the true levels and the noise; sleuth has to learn
them from the same restarts. This experiment separates that price from everything else: one
trial sequence per case, placed by the known-levels oracle (posterior median, then the
culprit and its parent), is read by five posteriors, and each is stopped where it first holds
one commit with probability 0.99:

- ``known``: told the levels and the noise (the oracle itself);
- ``noise_told``: told the noise, levels learned (flat prior on both);
- ``learned``: levels and noise learned (flat priors, ``p(sigma) ~ 1/sigma``);
- ``sleuth``: sleuth's own posterior (:func:`range_posterior`: levels and noise learned, a
  half-normal step prior twice the true change wide, 10% prior on "no change");
- ``plug_in``: the levels and noise sleuth's posterior estimates, plugged into the known-levels
  formula as if they were the truth: the shortcut that looks cheap.

No reproduction, no verification: besides the oracle's search trials there are only two
trials per endpoint (the fewest sleuth reproduces with), and they count. Cases, noise and
culprits are the localization benchmark's (:class:`VirtualOracle`).

Run: ``python -m experiments.level_cost`` (``CASES=N``, default 200 per regime;
``REGIMES=subtle``).
"""

from __future__ import annotations

import math
import os
import sys

import numpy as np

from experiments.bench_localize import (
    BASE_VALUE,
    MAX_TRIALS,
    N_COMMITS,
    REGIMES,
    Regime,
    VirtualOracle,
)
from orchestrator.strategies.bisect.posterior import PointStats, range_posterior

CONFIDENCE = 0.99
ENDPOINT_TRIALS = 2
NULL_PRIOR = 0.1
VARIANTS = ("known", "noise_told", "learned", "sleuth", "plug_in")


class _Data:
    """Per-commit counts, sums and sums of squares of log values."""

    def __init__(self) -> None:
        self.counts = np.zeros(N_COMMITS)
        self.sums = np.zeros(N_COMMITS)
        self.squares = np.zeros(N_COMMITS)

    def add(self, point: int, y: float) -> None:
        self.counts[point] += 1
        self.sums[point] += y
        self.squares[point] += y * y

    def split(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, float]:
        """For hypotheses c = 1..N-1: left counts/sums, right counts/sums, total square sum."""
        n_left = np.cumsum(self.counts)[:-1]
        s_left = np.cumsum(self.sums)[:-1]
        return (n_left, s_left, self.counts.sum() - n_left, self.sums.sum() - s_left,
                float(self.squares.sum()))


def _normalise(log_post: np.ndarray) -> np.ndarray:
    """Hypotheses 1..N-1 as log weights -> probabilities indexed by commit (0 is never bad)."""
    log_post = log_post - log_post.max()
    post = np.exp(log_post)
    return np.concatenate(([0.0], post / post.sum()))


def _known(data: _Data, good: float, bad: float, sigma: float) -> np.ndarray:
    llr = (bad - good) * (data.sums - data.counts * (good + bad) / 2.0) / sigma**2
    return _normalise(np.cumsum(llr[::-1])[::-1][1:])


def _noise_told(data: _Data, sigma: float) -> np.ndarray:
    n_left, s_left, n_right, s_right, squares = data.split()
    rss = squares - s_left**2 / n_left - s_right**2 / n_right
    return _normalise(-rss / (2.0 * sigma**2) - 0.5 * np.log(n_left * n_right))


def _learned(data: _Data) -> np.ndarray:
    """Levels and noise integrated out under flat priors: the textbook change-point posterior."""
    n_left, s_left, n_right, s_right, squares = data.split()
    rss = squares - s_left**2 / n_left - s_right**2 / n_right
    dof = data.counts.sum() - 2.0
    return _normalise(-0.5 * dof * np.log(rss) - 0.5 * np.log(n_left * n_right))


def _sleuth(data: _Data, step_scale: float) -> np.ndarray:
    """sleuth's posterior over commits (what it leaves to "no change" is held by no commit)."""
    stats = PointStats(data.counts, data.sums, data.squares)
    posterior = range_posterior(0, N_COMMITS - 1, stats, np.zeros(N_COMMITS, dtype=bool),
                                np.zeros(N_COMMITS), step_scale, NULL_PRIOR)
    return posterior.mass


def _plug_in(data: _Data, sleuth_mass: np.ndarray) -> np.ndarray:
    """Levels and noise as sleuth's posterior estimates them, then treated as known."""
    n_left, s_left, n_right, s_right, squares = data.split()
    weights = sleuth_mass[1:] / sleuth_mass[1:].sum()
    good = float(weights @ (s_left / n_left))
    bad = float(weights @ (s_right / n_right))
    rss = squares - s_left**2 / n_left - s_right**2 / n_right
    sigma = math.sqrt(max(float(weights @ rss) / max(data.counts.sum() - 2.0, 1.0), 1e-12))
    return _known(data, good, bad, sigma)


def run_case(regime: Regime, case: int) -> dict[str, tuple[int, bool]]:
    """``{variant: (trials when it first reached the confidence, whether it named the culprit)}``."""
    oracle = VirtualOracle(regime, case)
    good, bad = math.log(BASE_VALUE), math.log(BASE_VALUE * (1.0 + regime.effect))
    sigma = math.log1p(regime.cv)
    data = _Data()

    def measure(point: int) -> None:
        data.add(point, math.log(oracle.measure(point)))

    for _ in range(ENDPOINT_TRIALS):
        measure(0)
        measure(N_COMMITS - 1)
    step_scale = 2.0 * (bad - good) / sigma
    stopped: dict[str, tuple[int, bool]] = {}
    while len(stopped) < len(VARIANTS) and data.counts.sum() < MAX_TRIALS:
        known = _known(data, good, bad, sigma)
        sleuth_mass = _sleuth(data, step_scale)
        posteriors = {
            "known": known,
            "noise_told": _noise_told(data, sigma),
            "learned": _learned(data),
            "sleuth": sleuth_mass,
            "plug_in": _plug_in(data, sleuth_mass),
        }
        for name, post in posteriors.items():
            if name in stopped:
                continue
            best = int(np.argmax(post))
            if post[best] >= CONFIDENCE:
                stopped[name] = (int(data.counts.sum()), best == oracle.culprit)
        measure(_oracle_point(known, data.counts))
    for name in VARIANTS:
        stopped.setdefault(name, (MAX_TRIALS, False))
    return stopped


def _oracle_point(known: np.ndarray, counts: np.ndarray) -> int:
    """The known-levels posterior median; once that is sure, the culprit or its parent."""
    best = int(np.argmax(known))
    if known[best] >= CONFIDENCE:
        return best if counts[best] <= counts[best - 1] else best - 1
    return int(np.argmin(np.abs(np.cumsum(known) - 0.5)))


def main() -> int:
    cases = int(os.environ.get("CASES", "200"))
    wanted = os.environ.get("REGIMES", "seed_verify,decode_like,subtle").split(",")
    print(f"one oracle-placed trial sequence per case, read by five posteriors; {cases} cases "
          f"per regime, stop at {CONFIDENCE}; {ENDPOINT_TRIALS} trials per endpoint counted")
    print(f"{'regime':<12} {'posterior':<11} {'accuracy':>8} {'mean':>7} {'p90':>6}")
    for regime in REGIMES:
        if regime.name not in wanted:
            continue
        results = [run_case(regime, case) for case in range(cases)]
        for name in VARIANTS:
            trials = np.array([r[name][0] for r in results], dtype=float)
            accuracy = float(np.mean([r[name][1] for r in results]))
            print(f"{regime.name:<12} {name:<11} {accuracy:>8.3f} {trials.mean():>7.1f} "
                  f"{np.percentile(trials, 90):>6.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
