"""Measurement noise of the simulated node, with the structure real trials have.

- restart level: one multiplicative factor drawn per launch (a server lifetime), so repeats
  inside one trial agree with each other better than with another trial — the reason the
  trial, not the repetition, is the statistical unit;
- request level: a factor per forward pass (kernel timing jitter);
- drift: a slow linear change with modeled uptime (thermal soak, a neighbour's load);
- outlier restarts: with probability ``outlier_rate`` a launch lands in a bad state (a slow
  NCCL ring, a JIT compile on the critical path) and the whole lifetime runs ``outlier_factor``
  times slower, as real GPU restarts now and then do.

Factors are lognormal with mean 1 and the given coefficient of variation; cv 0 is exactly 1.
Everything comes from one seeded `random.Random`, so a fixed `--sim-seed` replays a run.
"""

from __future__ import annotations

import math
import os
import random


def lognormal_factor(rng: random.Random, cv: float) -> float:
    """A factor with mean 1 and coefficient of variation `cv` (exactly 1.0 when cv == 0)."""
    if cv <= 0:
        return 1.0
    sigma = math.sqrt(math.log1p(cv * cv))
    return math.exp(rng.gauss(-0.5 * sigma * sigma, sigma))


class Noise:
    def __init__(
        self,
        seed: int | None,
        restart_cv: float,
        request_cv: float,
        drift_pct_per_hour: float = 0.0,
        outlier_rate: float = 0.0,
        outlier_factor: float = 3.0,
    ):
        self.seed = seed if seed is not None else int.from_bytes(os.urandom(8), "little")
        self.rng = random.Random(self.seed)
        self.restart_cv = restart_cv
        self.request_cv = request_cv
        self.drift_pct_per_hour = drift_pct_per_hour
        self.restart_factor = lognormal_factor(self.rng, restart_cv)
        # Drawn only when enabled, so seeded runs without outliers replay as before.
        self.outlier = outlier_rate > 0 and self.rng.random() < outlier_rate
        if self.outlier:
            self.restart_factor *= outlier_factor

    @property
    def stochastic(self) -> bool:
        """Whether per-request randomness (including draft acceptance) is on."""
        return self.request_cv > 0

    def pass_factor(self, modeled_uptime_s: float) -> float:
        """Multiplier for one forward pass starting at `modeled_uptime_s`."""
        drift = 1.0 + self.drift_pct_per_hour / 100.0 * modeled_uptime_s / 3600.0
        return self.restart_factor * max(drift, 0.05) * lognormal_factor(self.rng, self.request_cv)
