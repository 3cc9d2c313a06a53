"""Reference strategies the localization benchmark compares against.

* :class:`ThresholdBisectStrategy` — classic ``git bisect run`` on a metric: each endpoint
  measured once, a threshold halfway between them, one trial per step, every verdict trusted.
* :class:`BayesectStrategy` — the method of the ``git_bayesect`` package (Beta-Bernoulli
  bisection: posterior over the culprit with the unknown pass/fail rates integrated out, next
  commit by greatest expected entropy reduction) on observations thresholded halfway between the
  endpoint means. The package's own ``Bisector`` is used when it is installed; otherwise
  :class:`BetaBernoulliBisector`, a line-by-line port of its core (same formulas, same
  tie-breaking), stands in. ``BAYESECT_IMPLEMENTATION`` says which one is active.

Both are pure strategies driven through the same ``propose``/``verdict`` loop as
:class:`~orchestrator.strategies.bisect.BisectStrategy`, so trial counts compare like for like.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy.special import loggamma, logsumexp

from orchestrator.strategies.base import Culprit, Observation, Proposal, Strategy, Verdict
from orchestrator.strategies.bisect.history import History


class BetaBernoulliBisector:
    """Port of ``git_bayesect.Bisector`` (v1.2): index 0 is the newest commit.

    There is an index B such that P(yes | index <= B) = p_new and P(yes | index > B) = p_old,
    both unknown with Beta(0.5, 0.5) (Jeffreys) priors integrated out analytically.
    """

    def __init__(self, prior_weights: Sequence[float], alpha: float = 0.5, beta: float = 0.5):
        self.prior_weights = np.asarray(prior_weights, dtype=np.float64).copy()
        self.obs_yes = np.zeros(self.prior_weights.size, dtype=np.int64)
        self.obs_total = np.zeros(self.prior_weights.size, dtype=np.int64)
        self.alpha = alpha
        self.beta = beta

    def record(self, index: int, observation: bool | None) -> None:
        if observation is None:
            self.prior_weights[index] = 0.0
            return
        self.obs_total[index:] += 1
        if observation:
            self.obs_yes[index:] += 1

    @property
    def distribution(self) -> np.ndarray:
        a, b = self.alpha, self.beta
        total_left = self.obs_total
        total_right = self.obs_total[-1] - total_left
        yes_left = self.obs_yes
        yes_right = yes_left[-1] - yes_left
        no_left = total_left - yes_left
        no_right = total_right - yes_right

        def log_beta(x: np.ndarray, y: np.ndarray) -> np.ndarray:
            return loggamma(x) + loggamma(y) - loggamma(x + y)

        log_like = (log_beta(a + yes_left, b + no_left) - log_beta(a, b)) + (
            log_beta(a + yes_right, b + no_right) - log_beta(a, b)
        )
        with np.errstate(divide="ignore"):
            log_prior = np.where(self.prior_weights > 0, np.log(self.prior_weights), -np.inf)
        log_post = log_prior + log_like
        return np.exp(log_post - logsumexp(log_post))

    def select(self) -> int:
        post = self.distribution
        a, b = self.alpha, self.beta
        total_left = self.obs_total
        total_right = self.obs_total[-1] - total_left
        yes_left = self.obs_yes
        yes_right = yes_left[-1] - yes_left
        p_new = (a + yes_left) / (a + b + total_left)
        p_old = (a + yes_right) / (a + b + total_right)

        def wlog(w: np.ndarray) -> np.ndarray:
            with np.errstate(divide="ignore", invalid="ignore"):
                return np.where(w > 0.0, w * np.log2(w), 0.0)

        def split(w_new: np.ndarray, w_old: np.ndarray) -> np.ndarray:
            return (np.cumsum(w_old) - w_old) + np.cumsum(w_new[::-1])[::-1]

        expected = np.zeros_like(post)
        for w_new, w_old in (
            (post * p_new, post * p_old),
            (post * (1.0 - p_new), post * (1.0 - p_old)),
        ):
            p_obs = split(w_new, w_old)
            p_log = split(wlog(w_new), wlog(w_old))
            with np.errstate(divide="ignore", invalid="ignore"):
                entropy = np.where(p_obs > 0, np.log2(p_obs) - p_log / p_obs, 0.0)
            expected += entropy * p_obs
        best = np.flatnonzero(np.isclose(expected, expected.min(), rtol=1e-12, atol=1e-15))
        return int(best[np.argmin(np.abs(best - expected.size // 2))])


try:  # pragma: no cover - depends on the environment
    from git_bayesect import Bisector as _PackageBisector

    BAYESECT_IMPLEMENTATION = "git_bayesect package"
except ImportError:  # pragma: no cover - depends on the environment
    _PackageBisector = None
    BAYESECT_IMPLEMENTATION = "port of git_bayesect 1.2 (package not installed)"


def _make_bisector(prior: np.ndarray):
    if _PackageBisector is not None:
        return _PackageBisector(prior.copy())
    return BetaBernoulliBisector(prior)


def _endpoint_threshold(
    observations: Sequence[Observation], n: int, per_endpoint: int
) -> tuple[float | None, list[int]]:
    """Midpoint of the endpoint means once each endpoint has ``per_endpoint`` values."""
    good = [o.value for o in observations if o.point == 0 and o.value is not None]
    bad = [o.value for o in observations if o.point == n - 1 and o.value is not None]
    missing = []
    for index in range(per_endpoint):  # interleaved: good, bad, good, bad ...
        missing += [0] * (index >= len(good)) + [n - 1] * (index >= len(bad))
    if missing:
        return None, missing
    good_mean = sum(good[:per_endpoint]) / per_endpoint
    bad_mean = sum(bad[:per_endpoint]) / per_endpoint
    return 0.5 * (good_mean + bad_mean), []


class ThresholdBisectStrategy(Strategy):
    """Classic bisection on a thresholded metric: one trial per step, no repeats.

    Untestable midpoints are skipped like ``git bisect skip`` (the nearest untested point in the
    open range is tried instead); if every point between the last good and first bad one is
    untestable, the answer is that range. With ``parents`` (a commit graph in topological
    order) it bisects the graph as ``git bisect`` does: a bad reading keeps only the point's
    ancestors as candidates, a good one removes them, and the next point is the one whose
    ancestors split the candidates most evenly.
    """

    def __init__(self, n: int, *, direction: str = "increase",
                 parents: Sequence[Sequence[int]] | None = None) -> None:
        if n < 2:
            raise ValueError("bisection needs at least the two endpoints (n >= 2)")
        self.n = n
        self.sign = 1.0 if direction == "increase" else -1.0
        self.history = History(n, parents) if parents is not None else None

    def _graph_candidates(self, observations: Sequence[Observation]
                          ) -> tuple[np.ndarray, set[int]] | None:
        threshold, _ = _endpoint_threshold(observations, self.n, 1)
        if threshold is None:
            return None
        history = self.history
        assert history is not None
        candidates = np.isin(np.arange(history.n), history.hypotheses)
        skipped: set[int] = set()
        for obs in observations:
            if obs.point in (0, self.n - 1):
                continue
            if obs.value is None:
                skipped.add(obs.point)
                continue
            above = history.reads_bad(obs.point, np.arange(self.n))
            if self.sign * (obs.value - threshold) > 0:
                candidates &= above
            else:
                candidates &= ~above
        return candidates, skipped

    def _graph_split(self, candidates: np.ndarray, skipped: set[int]) -> int | None:
        history = self.history
        assert history is not None
        total = int(candidates.sum())
        best, best_score = None, 0
        for point in range(1, self.n - 1):
            if point in skipped:
                continue
            inside = int((history.reads_bad(point, np.arange(self.n)) & candidates).sum())
            score = min(inside, total - inside)
            if score > best_score:
                best, best_score = point, score
        return best

    def _graph_propose(self, observations, pending, k) -> list[Proposal]:
        state = self._graph_candidates(observations)
        if state is None:
            _, missing = _endpoint_threshold(observations, self.n, 1)
            wanted = [p for p in missing if p not in pending]
            return [Proposal(p, "reproduce", "endpoint for the threshold") for p in wanted[:k]]
        point = self._graph_split(*state)
        if point is None or point in pending:
            return []
        return [Proposal(point, "search", "halves the candidate commits")]

    def _graph_verdict(self, observations) -> Verdict:
        state = self._graph_candidates(observations)
        done = state is not None and self._graph_split(*state) is None
        culprits: list[Culprit] = []
        if state is not None and done and state[0].any():
            culprits = [Culprit(int(np.flatnonzero(state[0])[0]), 1.0)]
        return Verdict(
            done=done,
            status="found" if culprits else "searching",
            culprits=culprits,
            message=f"first bad commit: point {culprits[0].point}" if culprits else "bisecting",
            n_trials=len(observations),
            confidence=1.0,
        )

    def _bracket(self, observations: Sequence[Observation]) -> tuple[int, int, list[int]] | None:
        """``(last good, first bad, untested points between)``; None before the threshold."""
        threshold, _ = _endpoint_threshold(observations, self.n, 1)
        if threshold is None:
            return None
        lo, hi = 0, self.n - 1
        skipped: set[int] = set()
        for obs in observations:
            if not lo < obs.point < hi:
                continue
            if obs.value is None:
                skipped.add(obs.point)
            elif self.sign * (obs.value - threshold) > 0:
                hi = obs.point
            else:
                lo = obs.point
        return lo, hi, [p for p in range(lo + 1, hi) if p not in skipped]

    def propose(
        self, observations: Sequence[Observation], pending: Sequence[int], k: int
    ) -> list[Proposal]:
        if k <= 0:
            return []
        if self.history is not None:
            return self._graph_propose(observations, pending, k)
        bracket = self._bracket(observations)
        if bracket is None:
            _, missing = _endpoint_threshold(observations, self.n, 1)
            wanted = [p for p in missing if p not in pending]
            return [Proposal(p, "reproduce", "endpoint for the threshold") for p in wanted[:k]]
        lo, hi, open_points = bracket
        if not open_points:
            return []
        mid = (lo + hi) // 2
        point = min(open_points, key=lambda p: (abs(p - mid), p))
        return [] if point in pending else [Proposal(point, "search", "midpoint")]

    def verdict(self, observations: Sequence[Observation]) -> Verdict:
        if self.history is not None:
            return self._graph_verdict(observations)
        bracket = self._bracket(observations)
        done = bracket is not None and not bracket[2]
        culprits: list[Culprit] = []
        if bracket is not None and done:
            lo, hi, _ = bracket
            culprits = [Culprit(hi, 1.0, (lo, hi) if hi - lo > 1 else None)]
        return Verdict(
            done=done,
            status="found" if done else "searching",
            culprits=culprits,
            range=culprits[0].range if culprits else None,
            message=f"first bad commit: point {culprits[0].point}" if culprits else "bisecting",
            n_trials=len(observations),
            confidence=1.0,
        )


class BayesectStrategy(Strategy):
    """Beta-Bernoulli Bayesian bisection (git_bayesect) on thresholded trial values."""

    def __init__(
        self,
        n: int,
        *,
        direction: str = "increase",
        confidence: float = 0.99,
        endpoint_trials: int = 1,
        max_trials: int | None = None,
    ) -> None:
        if n < 2:
            raise ValueError("bisection needs at least the two endpoints (n >= 2)")
        self.n = n
        self.sign = 1.0 if direction == "increase" else -1.0
        self.confidence = confidence
        self.endpoint_trials = endpoint_trials
        self.max_trials = max_trials

    def _bisector(self, observations: Sequence[Observation]):
        threshold, missing = _endpoint_threshold(observations, self.n, self.endpoint_trials)
        if threshold is None:
            return None, missing
        prior = np.ones(self.n)
        prior[self.n - 1] = 0.0  # index n-1 is the good endpoint: it cannot be the first bad one
        bisector = _make_bisector(prior)
        for obs in observations:
            index = self.n - 1 - obs.point  # git_bayesect counts from the newest commit
            failed = None if obs.value is None else self.sign * (obs.value - threshold) > 0
            bisector.record(index, failed)
        return bisector, []

    def _finished(self, observations: Sequence[Observation], bisector) -> bool:
        if self.max_trials is not None and len(observations) >= self.max_trials:
            return True
        return bisector is not None and float(np.max(bisector.distribution)) >= self.confidence

    def propose(
        self, observations: Sequence[Observation], pending: Sequence[int], k: int
    ) -> list[Proposal]:
        bisector, missing = self._bisector(observations)
        if k <= 0 or self._finished(observations, bisector):
            return []
        if bisector is None:
            return [Proposal(missing[0], "reproduce", "endpoint for the threshold")]
        return [Proposal(self.n - 1 - bisector.select(), "search", "min expected entropy")]

    def verdict(self, observations: Sequence[Observation]) -> Verdict:
        bisector, _ = self._bisector(observations)
        done = self._finished(observations, bisector)
        culprits: list[Culprit] = []
        posterior: list[float] = []
        if bisector is not None:
            dist = np.asarray(bisector.distribution)
            best = int(np.argmax(dist))
            culprits = [Culprit(self.n - 1 - best, float(dist[best]))]
            posterior = dist[::-1].tolist()
        reached = bool(culprits) and culprits[0].probability >= self.confidence
        status = "found" if reached else ("budget_exhausted" if done else "searching")
        return Verdict(
            done=done,
            status=status,
            culprits=culprits,
            posterior=posterior,
            message=f"thresholded Beta-Bernoulli bisection: {status}",
            n_trials=len(observations),
            confidence=self.confidence,
        )
