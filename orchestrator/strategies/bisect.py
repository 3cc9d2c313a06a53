"""Noise-aware Bayesian bisection over an ordered list of commits.

Three phases per searched range, each justified by what one trial costs (a server restart):

1. **reproduce** (:mod:`bisect_reproduce`) — measure both endpoints interleaved until a
   pooled-variance t-interval on the log ratio confirms the change in the expected direction,
   shows it reversed, or shows the good endpoint now measures like the bad one.
2. **search** — the Bayesian change-point posterior of :mod:`posterior` (continuous metric,
   unknown levels and noise integrated out, endpoint trials informing both levels), next points
   by expected entropy reduction, in batches for idle nodes, until one commit (or a range hidden
   by untestable commits) holds ``confidence`` of the mass, while it keeps testing the
   reproduction on the endpoint trials it takes (a reproduction can be luck).
3. **verify** (:mod:`bisect_verify`) — the culprit against its parent, interleaved, until an
   effect interval exists; if the culprit explains clearly less than the range's change, the
   ranges on either side are searched again for more culprits.

Range bookkeeping lives in :mod:`bisect_plan`.

Decisions that change the plan (a range reproduced, a culprit accepted, a range split) are sticky:
the strategy replays observations in order and records them as they happen, so later trials in a
sub-range cannot silently undo a finished answer. Replays are memoised on the observation
prefix; results depend only on the observation sequence.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from orchestrator.strategies.base import Observation, Proposal, Strategy, Verdict
from orchestrator.strategies.bisect_plan import Segment
from orchestrator.strategies.bisect_reproduce import check_reproduced, refuted
from orchestrator.strategies.bisect_verify import check_verified, verify_plan
from orchestrator.strategies.evidence import Evidence
from orchestrator.strategies.forecast import range_forecast
from orchestrator.strategies.placement import channel_error, choose_points
from orchestrator.strategies.posterior import RangePosterior, range_posterior
from orchestrator.strategies.report import describe


@dataclass(frozen=True)
class BisectSettings:
    """Tuning of :class:`BisectStrategy`; defaults are what the benchmark validates."""

    confidence: float = 0.99
    reproduce_confidence: float = 0.90
    reproduce_min_per_endpoint: int = 2
    # A +5% change in 5% restart noise still fails a 90% interval at 24 restarts per endpoint
    # about 4% of the time; 48 makes that rare. Changes under `negligible_pct` are not
    # regressions worth a bisect: a change reproduces only when its estimate reaches it, and an
    # interval confidently within +-`negligible_pct` ends the run: the endpoints measure alike.
    # Checked after every pair, the interval still passes by luck in about one no-change run in
    # five (2% or 5% noise); `bisect_reproduce.refuted` ends those once the endpoints' later
    # trials say so.
    reproduce_max_per_endpoint: int = 48
    negligible_pct: float = 1.0
    # The endpoints' later trials are tested sequentially for "no change" against "a change of
    # at least this fraction of the reproduced one".
    refute_fraction: float = 0.5
    reversed_confidence: float = 0.99
    reversed_min_per_endpoint: int = 4  # a 99% interval from 2-3 restarts can still be luck
    subrange_max_per_endpoint: int = 8
    subrange_max_trials: int = 60
    verify_confidence: float = 0.95
    verify_min_per_side: int = 2
    verify_max_per_side: int = 6
    verify_fresh_per_side: int = 1
    verify_handoff: float = 0.95
    verify_split_min_per_side: int = 4
    explain_fraction: float = 0.8
    null_prior_top: float = 0.1
    null_prior_sub: float = 0.5
    endpoint_max_failures: int = 2
    prior_floor: float = 0.01


class BisectStrategy(Strategy):
    """Find the commit(s) that moved a continuous metric, with a calibrated probability.

    ``n`` candidates including both endpoints (0 good, n-1 bad); hypothesis ``c`` means "commit
    ``c`` is the first bad one". ``direction`` "increase" when bad is higher (latency), "decrease"
    when bad is lower (throughput). ``prior_weights[i]``: relative prior that commit ``i`` is the
    culprit (entry 0 ignored); weights are floored at ``prior_floor`` times the largest so that a
    prior can down-weight a commit but never rule it out. ``min_effect_pct``: changes smaller than
    this do not count as reproducing the regression. ``max_trials``: budget of trials (all of
    them: failed, suspect, every phase).
    """

    def __init__(
        self,
        n: int,
        *,
        direction: str = "increase",
        confidence: float = 0.99,
        max_trials: int | None = None,
        prior_weights: Sequence[float] | None = None,
        min_effect_pct: float | None = None,
        settings: BisectSettings | None = None,
    ) -> None:
        if n < 2:
            raise ValueError("bisection needs at least the two endpoints (n >= 2)")
        if direction not in ("increase", "decrease"):
            raise ValueError(f"direction must be 'increase' or 'decrease', got {direction!r}")
        if not 0.5 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
        if max_trials is not None and max_trials < 4:
            raise ValueError("max_trials must allow at least reproducing (>= 4)")
        base = settings or BisectSettings()
        self.settings = BisectSettings(**{**base.__dict__, "confidence": confidence})
        self.n = n
        self.direction = direction
        self.sign = 1.0 if direction == "increase" else -1.0
        self.max_trials = max_trials
        self.min_effect = None
        if min_effect_pct is not None:
            if min_effect_pct <= 0:
                raise ValueError("min_effect_pct must be positive")
            fraction = min_effect_pct / 100.0
            self.min_effect = math.log1p(fraction) if direction == "increase" else -math.log1p(
                -min(fraction, 0.99)
            )
        self.negligible = math.log1p(self.settings.negligible_pct / 100.0)  # signed-log floor
        self.log_prior = self._log_prior(prior_weights)
        self._consumed: list[Observation] = []
        self._reset()

    # ----------------------------------------------------------------------------- public API

    def propose(
        self, observations: Sequence[Observation], pending: Sequence[int], k: int
    ) -> list[Proposal]:
        self._sync(observations)
        if k <= 0 or self._terminal_status() is not None:
            return []
        in_flight = Counter(int(p) for p in pending)
        proposals: list[Proposal] = []
        for segment in self.segments:
            if not segment.active or len(proposals) >= k:
                continue
            proposals += self._propose_for(segment, in_flight, k - len(proposals))
        return proposals

    def verdict(self, observations: Sequence[Observation]) -> Verdict:
        self._sync(observations)
        return describe(self)

    # ------------------------------------------------------------------------ state & replay

    def _reset(self) -> None:
        self.evidence = Evidence(self.n, self.sign)
        self.segments: list[Segment] = [Segment(0, self.n - 1)]
        self._consumed = []
        self._posterior_cache: dict[tuple[int, int], tuple[int, RangePosterior]] = {}

    def _sync(self, observations: Sequence[Observation]) -> None:
        done = len(self._consumed)
        if len(observations) < done or list(observations[:done]) != self._consumed:
            self._reset()
            done = 0
        for observation in observations[done:]:
            self._note_fresh(observation)
            self.evidence.add(observation)
            self._consumed.append(observation)
            self._advance()

    def _note_fresh(self, observation: Observation) -> None:
        """Keep the trials that arrive while their point is under head-to-head verification."""
        if observation.value is None or observation.suspect or observation.value <= 0:
            return
        for segment in self.segments:
            if not segment.active or not segment.reproduced or segment.fresh_pair is None:
                continue
            if observation.point in segment.fresh_pair and self.phase(segment) == "verify":
                first, last, _ = self.posterior(segment).best_block()
                if (first - 1, last) == segment.fresh_pair:
                    segment.fresh[observation.point].append(
                        self.evidence.signed_log(observation.value)
                    )

    def _log_prior(self, prior_weights: Sequence[float] | None) -> np.ndarray:
        if prior_weights is None:
            return np.zeros(self.n)
        weights = np.asarray(prior_weights, dtype=float)
        if weights.shape != (self.n,):
            raise ValueError(f"prior_weights needs {self.n} entries, got {weights.shape}")
        if not np.all(np.isfinite(weights)) or np.any(weights < 0) or weights[1:].max() <= 0:
            raise ValueError("prior_weights must be finite, non-negative and not all zero")
        floored = np.maximum(weights, self.settings.prior_floor * weights[1:].max())
        return np.log(floored)

    def _terminal_status(self) -> str | None:
        top = self.segments[0]
        if top.outcome in ("not_reproducible", "reversed", "inconclusive"):
            return top.outcome
        if all(not s.active for s in self.segments):
            return "found"
        if self.max_trials is not None and self.evidence.n_trials >= self.max_trials:
            return "budget_exhausted"
        return None

    def posterior(self, segment: Segment) -> RangePosterior:
        key = (segment.lo, segment.hi)
        cached = self._posterior_cache.get(key)
        if cached is not None and cached[0] == self.evidence.version:
            return cached[1]
        is_top = segment is self.segments[0]
        result = range_posterior(
            segment.lo,
            segment.hi,
            self.evidence.stats(segment.lo, segment.hi),
            self.evidence.untestable_mask(segment.lo, segment.hi),
            self.log_prior[segment.lo : segment.hi + 1],
            step_scale=self._step_scale(),
            null_prior=self.settings.null_prior_top if is_top else self.settings.null_prior_sub,
        )
        self._posterior_cache[key] = (self.evidence.version, result)
        return result

    def _step_scale(self) -> float:
        """Prior scale of a culprit's step in sigma units: twice the change being hunted."""
        total = self.evidence.compare(0, self.n - 1, 0.5)
        sigma = self.evidence.sigma()
        if total is None or not math.isfinite(sigma) or sigma <= 0.0:
            return 4.0
        return min(max(2.0 * abs(total.diff) / sigma, 1.0), 50.0)

    def expected_remaining(self) -> int | None:
        """Forecast of the trials still needed (:mod:`forecast`) for the active ranges; None
        while a range reproduces, when the noise is not yet measured, or when all is done."""
        if self._terminal_status() is not None:
            return None
        total = 0
        for segment in self.segments:
            if not segment.active:
                continue
            if segment.reproduction is None:
                return None
            spent = self.evidence.n_trials - segment.reproduction.at_trial
            left = range_forecast(self.posterior(segment), self.evidence.sigma(), spent)
            if left is None:
                return None
            total += left
        return total

    def phase(self, segment: Segment) -> str:
        if not segment.reproduced:
            return "reproduce"
        post = self.posterior(segment)
        if post.null_mass >= self.settings.confidence:
            return "no_change"
        _, _, mass = post.best_block()
        return "verify" if mass >= self.settings.verify_handoff else "search"

    # ------------------------------------------------------------------------- transitions

    def _advance(self) -> None:
        changed = True
        while changed:
            changed = False
            for segment in list(self.segments):
                if segment.active and self._step(segment):
                    changed = True

    def _step(self, segment: Segment) -> bool:
        """Apply at most one sticky transition to ``segment``; True if one happened."""
        is_top = segment is self.segments[0]
        spent = self.evidence.n_trials - segment.opened_at
        if not is_top and spent >= self.settings.subrange_max_trials:
            segment.outcome = "no_change"
            segment.note = "unresolved: the trial allowance for this sub-range ran out"
            return True
        if not segment.reproduced:
            return check_reproduced(self, segment)
        why = refuted(self, segment) if is_top else None
        if why is not None:
            segment.outcome = "not_reproducible"
            segment.note = f"the endpoints' change did not hold up: {why}"
            return True
        phase = self.phase(segment)
        if phase == "no_change":
            segment.outcome = "not_reproducible" if is_top else "no_change"
            segment.note = "no commit in the range explains a change"
            return True
        if phase != "verify":
            return False
        return check_verified(self, segment)

    # ---------------------------------------------------------------------------- proposals

    def _propose_for(self, segment: Segment, in_flight: Counter, slots: int) -> list[Proposal]:
        phase = self.phase(segment)
        if phase == "reproduce":
            return self._alternate(segment, segment.lo, segment.hi, in_flight, slots, phase)
        if phase == "verify":
            parent, culprit, counts, target = verify_plan(self, segment)
            if min(counts.values()) >= target:  # undecided: one more pair per call
                target = min(counts.values()) + 1
            return self._alternate(segment, parent, culprit, in_flight, slots, phase,
                                   counts=counts, cap=target)
        return self._search(segment, in_flight, slots)

    def _alternate(
        self,
        segment: Segment,
        a: int,
        b: int,
        in_flight: Counter,
        slots: int,
        phase: str,
        counts: dict[int, int] | None = None,
        cap: int | None = None,
    ) -> list[Proposal]:
        """Interleave two points (good side first), keeping their trial counts balanced.

        Reproduction fills every slot (its length is unknown in advance); verification asks
        only for the trials its ``cap`` still needs.
        """
        ev, cfg = self.evidence, self.settings
        if counts is None:
            counts = {p: ev.count(p) + int(ev.failures[p]) for p in (a, b)}
        if cap is None:
            is_top = segment is self.segments[0]
            cap = cfg.reproduce_max_per_endpoint if is_top else cfg.subrange_max_per_endpoint
            cap += cfg.endpoint_max_failures
        planned = {p: counts[p] + in_flight[p] for p in (a, b)}
        proposals: list[Proposal] = []
        while len(proposals) < slots:
            point = a if planned[a] <= planned[b] else b
            if planned[point] >= cap:
                point = b if point == a else a
                if planned[point] >= cap:
                    break
            planned[point] += 1
            in_flight[point] += 1
            role = "good endpoint" if point == a else "bad endpoint"
            if phase == "verify":
                role = "parent of the culprit" if point == a else "culprit"
            proposals.append(Proposal(point, phase, f"{role} ({planned[point]} trials)"))
        return proposals

    def _search(self, segment: Segment, in_flight: Counter, slots: int) -> list[Proposal]:
        ev = self.evidence
        post = self.posterior(segment)
        # Endpoints are candidates too: re-measuring them pins down the levels and is what tells
        # "no change" from "a step right next to an endpoint".
        points = np.arange(segment.lo, segment.hi + 1)
        usable = points[~ev.untestable_mask(segment.lo, segment.hi)]
        if in_flight:
            usable = usable[~np.isin(usable, [p for p, c in in_flight.items() if c > 0])]
        flying = [p for p, c in in_flight.items() if c > 0 for _ in range(c)]
        step = ev.compare(segment.lo, segment.hi, 0.5)
        error = channel_error(step.diff if step else math.nan, ev.sigma())
        chosen = choose_points(post, usable.astype(np.int64), flying, slots, error)
        cdf = post.cdf()
        proposals = []
        for point in chosen:
            in_flight[point] += 1
            reason = f"P(first bad <= {point}) = {cdf[point - segment.lo]:.2f}"
            proposals.append(Proposal(point, "search", reason))
        return proposals
