"""Noisy delta debugging: which of the differences between a good and a bad configuration
cause the slowdown, alone or in pairs, with effects, intervals and a probability.

**Points are subsets.** The ``D`` differences (patches, env vars, clock policy, packages, ...)
are numbered ``0..D-1``; a configuration applies a subset ``S`` of them to the good one, so the
good configuration is ``{}`` and the bad one is all of them. ``Observation.point`` is an index
into a registry of subsets that the strategy grows as it proposes: point 0 is good, point 1 is
bad, :meth:`IsolateStrategy.subset` turns any point into its subset and
:meth:`IsolateStrategy.point_of` a subset into its point (registering it if new). The controller
builds the candidate of a proposal from ``subset(point)``; to resume a run it maps every stored
trial's candidate back with ``point_of`` before replaying. Decisions depend only on the sequence
of (subset, value) observations, never on how points happen to be numbered.

Plan, each step justified by what a trial costs (a server restart):

1. **reproduce** good vs bad, interleaved, until a pooled-variance interval confirms the change,
   shows it reversed, or finds none (as in the bisection strategy).
2. **search** a prefix chain ``{}, {d0}, {d0,d1}, ... , all`` with the bisection strategy (see
   :mod:`orchestrator.strategies.isolate.plan`): a Bayesian change-point search on the continuous
   metric, so a +28% cause is found in about log2(D) single trials and a +5% one in a few more.
3. **verify** what a chain points at in both directions, interleaved: added alone to good, and
   removed alone from bad (:mod:`orchestrator.strategies.isolate.verify`). Hurting both ways: a
   single cause. Hurting only when removed from bad: it needs a partner that is in bad; a second
   chain from the suspect alone through its context finds the partner, and the pair is
   confirmed by its interaction contrast ``y(ij) - y(i) - y(j) + y(good)``.
4. **explain**: with ``N`` the named differences, bad-without-N must measure like good and
   good-with-N like bad, both within the smallest effect worth naming (by default 10% of the
   total change, and at least one restart-noise sigma). A remaining change starts a new chain
   over the unnamed differences, from good (or from ``N``) towards bad; if that search comes
   back empty, another order is tried, then more trials decide. Reproduction, chains and this
   step are the transitions of :mod:`orchestrator.strategies.isolate.search`.
5. **final**: the answer is declared when the probability of all its claims together (each
   cause's effect is real; each explain check is within the tolerance) reaches ``confidence``;
   until then the weakest claim gets more trials, and a cause whose evidence turns against it
   goes back to verification. Claims use a spike-and-slab posterior
   (:class:`~orchestrator.strategies.isolate.stats.EffectPrior`) on the pooled restart noise,
   robust to being checked after every trial, so the steps before can decide at the cheaper
   ``route_confidence``: a wrong turn costs trials, and the final check catches it.

Every test is three-way (present / absent / unresolved -> more trials) and capped; a capped test
is decided by its estimate and leaves the answer's probability honest, below ``confidence``.
Batches for ``k`` idle nodes hold distinct subsets, never one already in flight.

Size: the strategy's driver (the registry of subsets, the phase transitions, proposals); the
chains, the verification, the explanation and the verdict are their own modules.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence

from orchestrator.strategies.base import Observation, Proposal, Strategy
from orchestrator.strategies.isolate.plan import (
    CONFIRMED,
    SINGLE,
    VERIFYING,
    Chain,
    Pair,
    Suspect,
)
from orchestrator.strategies.isolate.propose import wanted
from orchestrator.strategies.isolate.report import IsolateVerdict, describe
from orchestrator.strategies.isolate.search import (
    check_reproduced,
    explain,
    harvest,
    search_orders,
    start_chain,
)
from orchestrator.strategies.isolate.settings import UNTESTABLE, IsolateSettings, Weights
from orchestrator.strategies.isolate.stats import (
    ABSENT,
    PRESENT,
    Contrast,
    EffectPrior,
    Subset,
    SubsetEvidence,
    claim_probability,
    decide,
)
from orchestrator.strategies.isolate.verify import verify_pair, verify_suspect


class IsolateStrategy(Strategy):
    """Find the differences (singles and pairs) that reproduce a slowdown; see module docstring.

    ``direction``: "increase" when bad is higher (latency), "decrease" when lower (throughput).
    ``max_trials``: budget of trials of every kind (failed and suspect ones included).
    ``labels``: a name per difference, used in messages and verdict records.
    ``min_effect_pct``: smallest effect worth naming (default: see :class:`IsolateSettings`).
    """

    def __init__(
        self,
        n_differences: int,
        *,
        direction: str = "increase",
        confidence: float = 0.99,
        max_trials: int | None = None,
        labels: Sequence[str] | None = None,
        min_effect_pct: float | None = None,
        settings: IsolateSettings | None = None,
        live: Iterable[int] = (),
    ) -> None:
        if n_differences < 1:
            raise ValueError("isolate needs at least one difference")
        self.check_arguments(direction, confidence, max_trials)
        if labels is not None and len(labels) != n_differences:
            raise ValueError(f"labels needs {n_differences} entries, got {len(labels)}")
        if min_effect_pct is not None and not 0.0 < min_effect_pct < 100.0:
            raise ValueError("min_effect_pct must be in (0, 100)")
        self.settings = settings or IsolateSettings()
        self.n_differences = n_differences
        # Differences measured within server lifetimes: one trial of a subset measures every
        # combination of these too (orchestrator/stats/lifetimes.py).
        self.live = frozenset(int(i) for i in live)
        if not self.live <= frozenset(range(n_differences)):
            raise ValueError(f"live differences {sorted(self.live)} outside 0..{n_differences - 1}")
        self.direction = direction
        self.sign = 1.0 if direction == "increase" else -1.0
        self.confidence = confidence
        self.max_trials = max_trials
        self.labels = tuple(labels) if labels is not None else tuple(
            f"difference {i}" for i in range(n_differences)
        )
        self.min_effect = None if min_effect_pct is None else self.pct_to_log(min_effect_pct)
        self.good: Subset = frozenset()
        self.bad: Subset = frozenset(range(n_differences))
        self._subsets: list[Subset] = [self.good, self.bad]
        self._points: dict[Subset, int] = {self.good: 0, self.bad: 1}
        self.discarded = 0  # trials of an earlier system epoch: spent, no longer evidence
        self._reset()

    # ----------------------------------------------------------------------- point registry

    def subset(self, point: int) -> Subset:
        """The differences that ``point`` applies to the good configuration."""
        if not 0 <= point < len(self._subsets):
            raise ValueError(f"unknown point {point}: not proposed and not registered")
        return self._subsets[point]

    def siblings(self, subset: Subset) -> list[Subset]:
        """The subsets one trial of ``subset`` measures: its restart-level differences with
        every combination of the live ones (only itself without live differences)."""
        if not self.live:
            return [subset]
        base = subset - self.live
        live = sorted(self.live)
        return [base | frozenset(i for j, i in enumerate(live) if mask >> j & 1)
                for mask in range(2 ** len(live))]

    def point_of(self, subset: Iterable[int]) -> int:
        """The point of a subset of differences, registered on first use."""
        key = frozenset(int(i) for i in subset)
        if not key <= self.bad:
            raise ValueError(
                f"subset {sorted(key)} names differences outside 0..{self.n_differences - 1}"
            )
        if key not in self._points:
            self._points[key] = len(self._subsets)
            self._subsets.append(key)
        return self._points[key]

    def describe_subset(self, subset: Subset) -> str:
        """``good``, ``bad``, ``good + {a, b}`` or ``bad - {c}``, whichever is shorter."""
        if subset == self.good:
            return "good"
        if subset == self.bad:
            return "bad"
        added, removed = sorted(subset), sorted(self.bad - subset)
        if len(added) <= len(removed):
            return "good + {" + ", ".join(self.labels[i] for i in added) + "}"
        return "bad - {" + ", ".join(self.labels[i] for i in removed) + "}"

    # ---------------------------------------------------------------------------- public API

    def propose(
        self, observations: Sequence[Observation], pending: Sequence[int], k: int
    ) -> list[Proposal]:
        self._sync(observations)
        if k <= 0 or self.terminal_status() is not None:
            return []
        planned = Counter(self.subset(int(p)) for p in pending)
        proposals: list[Proposal] = []
        cap = self.settings.max_per_subset
        for subset, phase, reason in wanted(self, planned, k):
            if len(proposals) >= k:
                break
            if planned[subset] or self.untestable(subset) or self.evidence.trials[subset] >= cap:
                continue
            for sibling in self.siblings(subset):  # one lifetime measures them all
                planned[sibling] += 1
            proposals.append(Proposal(self.point_of(subset), phase, reason))
        if not proposals and not pending:
            # Nothing in flight and nothing worth a trial below the cap: waiting would never
            # end, and one more trial of a capped configuration would not be bounded.
            self.outcome = "inconclusive"
            self.note = (f"every configuration the answer still needs has had its {cap} trials"
                         if any(n >= cap for n in self.evidence.trials.values())
                         else "no test is left that could decide")
        return proposals

    def verdict(self, observations: Sequence[Observation]) -> IsolateVerdict:
        self._sync(observations)
        return describe(self)

    # --------------------------------------------------------------------- state and replay

    def _reset(self) -> None:
        self.evidence = SubsetEvidence(self.sign, self.live)
        self.consumed: list[Observation] = []
        self.outcome: str | None = None
        self.note = ""
        self.reproduced = False
        self.chains: list[Chain] = []
        self.suspects: list[Suspect] = []
        self.pairs: list[Pair] = []
        self.chain_keys: set[tuple[Subset, tuple[int, ...]]] = set()
        self._cache: dict[str, tuple[int, object]] = {}

    def _sync(self, observations: Sequence[Observation]) -> None:
        # One system per comparison: once a node's system changed between trials (a newer
        # epoch), every decision is taken again on the new system's trials alone. Mixing them
        # made a total of +1% next to a +16% cause; the earlier trials still count as spent.
        latest = max((int(getattr(o, "epoch", 0) or 0) for o in observations), default=0)
        if latest:
            kept = [o for o in observations if int(getattr(o, "epoch", 0) or 0) == latest]
            self.discarded = len(observations) - len(kept)
            observations = kept
        done = len(self.consumed)
        if len(observations) < done or list(observations[:done]) != self.consumed:
            self._reset()
            done = 0
        for observation in observations[done:]:
            subset = self.subset(observation.point)
            self.evidence.add(subset, observation)
            self.consumed.append(observation)
            for chain in self.chains:
                if not chain.finished:
                    chain.feed(subset, observation)
            while self._step():
                pass

    def terminal_status(self) -> str | None:
        if self.outcome is not None:
            return self.outcome
        if (self.max_trials is not None
                and self.evidence.n_trials + self.discarded >= self.max_trials):
            return "budget_exhausted"
        return None

    # --------------------------------------------------------------------------- quantities

    def pct_to_log(self, pct: float) -> float:
        fraction = pct / 100.0
        return math.log1p(fraction) if self.direction == "increase" else -math.log1p(-fraction)

    def log_to_pct(self, signed_log: float) -> float:
        if self.direction == "increase":
            return 100.0 * math.expm1(signed_log)
        return -100.0 * math.expm1(-signed_log)

    def total(self) -> Contrast | None:
        return self.evidence.difference(self.good, self.bad)

    def tolerance(self) -> float:
        """Smallest effect worth naming (signed log): explicit, or from the total change."""
        if self.min_effect is not None:
            return self.min_effect
        cached = self._cache.get("tolerance")
        if cached is not None and cached[0] == self.evidence.version:
            return cached[1]
        value = self._tolerance()
        self._cache["tolerance"] = (self.evidence.version, value)
        return value

    def _tolerance(self) -> float:
        floor = self.pct_to_log(self.settings.effect_floor_pct)
        sigma = self.evidence.sigma()
        if math.isfinite(sigma):
            floor = max(floor, self.settings.effect_noise_fraction * sigma)
        total = self.total()
        if total is None:
            return floor
        return max(floor, self.settings.effect_fraction * total.estimate)

    def prior(self) -> EffectPrior:
        """Prior of a tested effect: zero, or up to about the size of the whole change."""
        cached = self._cache.get("prior")
        if cached is not None and cached[0] == self.evidence.version:
            return cached[1]
        total = self.total()
        scale = 2.0 * self.tolerance()
        if total is not None:
            scale = max(scale, total.estimate)
        prior = EffectPrior(self.settings.prior_null, scale)
        self._cache["prior"] = (self.evidence.version, prior)
        return prior

    def untestable(self, subset: Subset) -> bool:
        return self.evidence.untestable(subset, self.settings.max_failures)

    def named(self) -> Subset:
        members: set[int] = set()
        for suspect in self.suspects:
            if suspect.state == SINGLE:
                members |= suspect.members
        for pair in self.pairs:
            if pair.state == CONFIRMED:
                members |= pair.members
        return frozenset(members)

    def add_weights(self, members: Subset) -> Weights:
        return {members: 1.0, self.good: -1.0}

    def remove_weights(self, members: Subset) -> Weights:
        return {self.bad: 1.0, self.bad - members: -1.0}

    def interaction_weights(self, pair: Pair) -> Weights:
        return {pair.members: 1.0, pair.first: -1.0, pair.second: -1.0, self.good: 1.0}

    def explain_checks(self, named: Subset) -> list[tuple[Weights, Subset, Subset]]:
        """``(weights, subset under test, base of the residual chain to start if it fails)``:
        bad without the named against good, and bad against good with the named. A check whose
        configuration cannot be built (patches that do not apply) is left out."""
        if named == self.bad:
            return []  # everything is named: nothing is left to clear
        checks = [({self.bad - named: 1.0, self.good: -1.0}, self.bad - named, self.good)]
        if named:
            checks.append(({self.bad: 1.0, named: -1.0}, named, named))
        return [check for check in checks if not self.untestable(check[1])]

    def claims_for_single(self, members: Subset) -> list[Weights]:
        """A single cause is claimed by its effect when added to good (or, if it cannot be
        applied alone, when removed from bad)."""
        if self.untestable(members):
            return [self.remove_weights(members)]
        return [self.add_weights(members)]

    def claims(self) -> list[tuple[str, Weights]]:
        """The answer as ``(present|absent, contrast weights)`` claims."""
        result: list[tuple[str, Weights]] = []
        for suspect in self.suspects:
            if suspect.state == SINGLE:
                result += [(PRESENT, w) for w in self.claims_for_single(suspect.members)]
        for pair in self.pairs:
            if pair.state == CONFIRMED:
                result.append((PRESENT, self.add_weights(pair.members)))
                result.append((PRESENT, self.interaction_weights(pair)))
        result += [(ABSENT, weights) for weights, _, _ in self.explain_checks(self.named())]
        return result

    def claim_probability(self, claim: str, weights: Weights) -> float:
        contrast = self.evidence.contrast(weights)
        return claim_probability(contrast, claim, self.tolerance(), self.prior())

    def claim_probabilities(self) -> list[float]:
        return [self.claim_probability(claim, weights) for claim, weights in self.claims()]

    def decision(self, weights: Weights, tested: Subset, cap: int, level: float | None = None
                 ) -> str | None:
        """Decide a claim at the routing level (or ``level``) once ``tested`` has its minimum
        trials; at ``cap`` trials the estimate decides. Either way the claim keeps its
        probability: the answer is only given when the claims together reach ``confidence``."""
        if self.untestable(tested):
            return UNTESTABLE
        count = self.evidence.count(tested)
        if count < self.settings.verify_min_per_side:
            return None
        contrast = self.evidence.contrast(weights)
        level = self.settings.route_confidence if level is None else level
        result = decide(contrast, self.tolerance(), level, self.prior())
        if result is None and count >= cap and contrast is not None:
            result = PRESENT if contrast.estimate >= self.tolerance() / 2.0 else ABSENT
        return result

    # ------------------------------------------------------------------------ transitions

    def _step(self) -> bool:
        """Apply the next sticky transition; True if one happened."""
        if self.outcome is not None:
            return False
        if not self.reproduced:
            return check_reproduced(self)
        changed = False
        for chain in self.chains:
            if not chain.finished:
                changed |= harvest(self, chain)
        for suspect in self.suspects:
            if suspect.state in (VERIFYING, SINGLE):
                changed |= verify_suspect(self, suspect)
        for pair in self.pairs:
            if pair.state in (VERIFYING, CONFIRMED):
                changed |= verify_pair(self, pair)
        if changed:
            return True
        return self.quiescent() and explain(self)

    def quiescent(self) -> bool:
        return (
            all(chain.finished for chain in self.chains)
            and all(s.state != VERIFYING for s in self.suspects)
            and all(p.state != VERIFYING for p in self.pairs)
        )

    def start_chain(
        self, base: Subset, order: tuple[int, ...], origin: str, owner: int | None = None
    ) -> bool:
        """Start a prefix chain unless it is empty or was searched before (partner searches in
        :mod:`.verify` start them too)."""
        return start_chain(self, base, order, origin, owner)

    def search_orders(self, differences: Sequence[int]) -> list[tuple[int, ...]]:
        """Orders to walk ``differences`` in, one per search attempt (:mod:`.search`)."""
        return search_orders(self.settings, differences)
