"""References for the localization benchmark, not methods.

:class:`KnownLevelsOracle` is bisection that knows the answer's scale: it is told the true good
and bad levels and the noise of the regime, so every reading has an exact likelihood under each
hypothesis; it measures the posterior median (probabilistic bisection) and stops when one commit
holds ``confidence``. It never measures the endpoints, reproduces or verifies.

No real method knows the levels: sleuth has to learn them from the same trials.
:class:`OraclePlacedBisect` says how much of the gap is placement and how much is the rest: it
is sleuth with only its search placement handed to the oracle.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from orchestrator.strategies import BisectStrategy, Observation, Proposal, Strategy, Verdict
from orchestrator.strategies.base import Culprit
from orchestrator.strategies.bisect.history import History


class KnownLevelsOracle(Strategy):
    def __init__(self, n: int, good: float, bad: float, cv: float, *,
                 confidence: float = 0.99, max_trials: int | None = None,
                 parents: Sequence[Sequence[int]] | None = None,
                 outlier_rate: float = 0.0, outlier_factor: float = 3.0) -> None:
        self.n = n
        self.good, self.bad = math.log(good), math.log(bad)
        self.sigma = math.log1p(cv)
        # Told the noise means told all of it: where restarts land in a bad state, the
        # oracle's reading likelihood is the mixture that makes them.
        self.outlier_rate = outlier_rate
        self.outlier_shift = math.log(outlier_factor)
        self.confidence = confidence
        self.max_trials = max_trials
        self.history = History(n, parents) if parents is not None else None
        if self.history is not None:  # reads[p, c]: point p reads bad when c is the culprit
            points = np.arange(n)
            self._reads = self.history.bad_matrix(points, points).T

    def p_bad(self, post: np.ndarray) -> np.ndarray:
        """P(point p reads bad) for every point."""
        return np.cumsum(post) if self.history is None else self._reads @ post

    def posterior(self, observations: Sequence[Observation]) -> np.ndarray:
        """P(first bad commit = c), c = 1..n-1 (index 0 is the good endpoint: always 0)."""
        llr = np.zeros(self.n)  # log p(reading | bad) - log p(reading | good), summed per point
        for obs in observations:
            if obs.value is None or obs.suspect:
                continue
            y = math.log(obs.value)
            llr[obs.point] += self._log_like(y, self.bad) - self._log_like(y, self.good)
        if self.history is None:
            log_post = np.cumsum(llr[::-1])[::-1]  # hypothesis c: points c..n-1 read bad
        else:
            log_post = self._reads.T @ llr
            log_post[~np.isin(np.arange(self.history.n), self.history.hypotheses)] = -np.inf
        log_post[0] = -np.inf
        log_post -= log_post[1:].max()
        post = np.exp(log_post)
        return post / post.sum()

    def _log_like(self, y: float, level: float) -> float:
        z = (y - level) / self.sigma
        plain = -0.5 * z * z
        if not self.outlier_rate:
            return plain
        shifted = -0.5 * ((y - level - self.outlier_shift) / self.sigma) ** 2
        return float(np.logaddexp(math.log1p(-self.outlier_rate) + plain,
                                  math.log(self.outlier_rate) + shifted))

    def _done(self, observations: Sequence[Observation], post: np.ndarray) -> bool:
        budget = self.max_trials is not None and len(observations) >= self.max_trials
        return budget or float(post.max()) >= self.confidence

    def propose(self, observations: Sequence[Observation], pending: Sequence[int],
                k: int) -> list[Proposal]:
        post = self.posterior(observations)
        if k <= 0 or self._done(observations, post):
            return []
        point = int(np.argmin(np.abs(self.p_bad(post) - 0.5)))
        return [Proposal(point, "search", "posterior median")]

    def verdict(self, observations: Sequence[Observation]) -> Verdict:
        post = self.posterior(observations)
        best = int(np.argmax(post))
        done = self._done(observations, post)
        found = float(post[best]) >= self.confidence
        return Verdict(done=done, status="found" if found else "budget_exhausted",
                       culprits=[Culprit(best, float(post[best]))], posterior=post.tolist(),
                       message="known-levels oracle", n_trials=len(observations),
                       confidence=self.confidence)


class OraclePlacedBisect(BisectStrategy):
    """A second reference: sleuth's strategy with the *placement* of its search trials told
    the truth. Reproduction, the posterior, the stopping rule and verification are sleuth's
    own; only the next search point comes from :class:`KnownLevelsOracle`'s posterior median
    (once the oracle is sure, its culprit or the parent, whichever has fewer trials).

    It splits the gap between sleuth and the oracle in two: what sleuth's placement costs (this
    row against sleuth's) and what honest inference costs, learning the levels and the noise
    from the same restarts and checking the change and the culprit (the oracle's row against
    this one). The oracle's placement is not proven best for sleuth's inference; it is the one
    behind the reference figures the targets were set against.
    """

    def __init__(self, n: int, good: float, bad: float, cv: float, *,
                 parents: Sequence[Sequence[int]] | None = None, outlier_rate: float = 0.0,
                 outlier_factor: float = 3.0, **kwargs) -> None:
        super().__init__(n, parents=parents, **kwargs)
        self._placer = KnownLevelsOracle(n, good, bad, cv, parents=parents,
                                         outlier_rate=outlier_rate,
                                         outlier_factor=outlier_factor)

    def search_points(self, stage, in_flight: Counter, slots: int) -> list[Proposal]:
        if stage.index > 0:  # later culprits: the oracle knows one step only
            return super().search_points(stage, in_flight, slots)
        known = self._placer.posterior(self._consumed)
        point = int(np.argmin(np.abs(self._placer.p_bad(known) - 0.5)))  # P(bad) nearest 1/2
        if known.max() >= self.settings.confidence:
            best = int(np.argmax(known))
            parent = self.history.parents[best][0] if self.history.parents[best] else 0
            point = best if self.evidence.count(best) <= self.evidence.count(parent) else parent
        in_flight[point] += 1
        return [Proposal(point, "search", "known-levels posterior median")]
