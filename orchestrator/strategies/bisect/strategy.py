"""Noise-aware Bayesian bisection over a commit history (a chain, or the full graph).

Phases, each justified by what one trial costs (a server restart):

1. **reproduce** (:mod:`.reproduce`): measure both endpoints interleaved until an
   interval on the log ratio confirms the change in the expected direction, shows it reversed,
   or shows the good endpoint now measures like the bad one. A reproduction found by one of
   many looks is audited (:mod:`.audit`: the endpoints keep being re-measured) until a
   culprit is verified, and withdrawn, saying so, if it does not hold up.
2. **search**, stage by stage: the change-point posterior of :mod:`.model` over every
   commit (outlier restarts flagged and left out, drift and system epochs as nuisance terms,
   the steps of culprits already found as known terms), next points by expected information,
   in batches for idle nodes, until one commit holds ``confidence``.
3. **verify** (:mod:`.verify`): the culprit against its git parent(s), interleaved.
4. **what is left** (:mod:`.remainders`, :mod:`.later`): after each culprit the
   change between the anchors it leaves (on both sides, with intervals) is re-tested as
   evidence arrives; a part
   that does not vanish is searched as a further stage (a second culprit, a step of a
   staircase, a later partial fix in the other direction) or, when it cannot be pinned on one
   commit within the stage's allowance, reported with its size.

Tuning lives in :mod:`.settings`, the shape of history (chain or graph) in
:mod:`.history`. Decisions that change the plan (reproduced, a culprit accepted) are
sticky: the strategy
replays observations in order and records them as they happen. Results depend only on the
observation sequence.

Size: the strategy's driver (state, sync, the phase transitions); each phase lives in its
own module of this package over :class:`~orchestrator.strategies.bisect.state.BisectState`.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from orchestrator.strategies.base import Observation, Proposal, Strategy, Verdict
from orchestrator.strategies.bisect.audit import audit_point, ready_but_unconfirmed, too_costly
from orchestrator.strategies.bisect.evidence import Evidence
from orchestrator.strategies.bisect.forecast import stage_forecast
from orchestrator.strategies.bisect.history import History
from orchestrator.strategies.bisect.later import signalled, suggestive_points
from orchestrator.strategies.bisect.model import (
    FIXED_DF,
    StageData,
    StagePosterior,
    stage_posterior,
)
from orchestrator.strategies.bisect.plan import Remainder, Reproduction, Stage
from orchestrator.strategies.bisect.posterior import range_log_prior
from orchestrator.strategies.bisect.remainders import remainders
from orchestrator.strategies.bisect.reproduce import (
    check_reproduced,
    confirmed,
    refuted,
)
from orchestrator.strategies.bisect.search import search_points
from orchestrator.strategies.bisect.settings import BisectSettings
from orchestrator.strategies.bisect.verdict import describe
from orchestrator.strategies.bisect.verify import check_reverified, check_verified, verify_target


class BisectStrategy(Strategy):
    """Find the commit(s) that moved a continuous metric, with a calibrated probability.

    ``n`` candidates including both endpoints (0 good, n-1 bad); hypothesis ``c`` means "commit
    ``c`` is the first bad one". ``parents`` (optional): the commit graph, one tuple of earlier
    points per point; without it the points are a chain. ``assumed_good``: points listed only
    to verify against (parents from outside the range), good under every hypothesis. ``direction`` "increase" when bad is
    higher (latency), "decrease" when bad is lower (throughput). ``prior_weights[i]``: relative
    prior that commit ``i`` is the culprit (entry 0 ignored); weights are floored at
    ``prior_floor`` times the largest. ``min_effect_pct``: changes smaller than this do not
    count as reproducing the regression. ``max_trials``: budget of trials (all of them); without
    it ``default_budget`` applies, and is stated. ``noise_prior``: ``(sigma, df)``, the restart
    noise on the signed log scale that earlier runs on the node measured, and on how many
    degrees of freedom (a scaled inverse chi-square prior of the posterior's sigma).
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
        parents: Sequence[Sequence[int]] | None = None,
        assumed_good: Sequence[int] = (),
        reference_value: float | None = None,
        noise_prior: tuple[float, float] | None = None,
    ) -> None:
        if n < 2:
            raise ValueError("bisection needs at least the two endpoints (n >= 2)")
        self.check_arguments(direction, confidence, max_trials)
        base = settings or BisectSettings()
        self.settings = replace(base, confidence=confidence)
        self.n = n
        self.history = History(n, parents, assumed_good)
        self.direction = direction
        self.sign = 1.0 if direction == "increase" else -1.0
        self.max_trials = max_trials
        self.budget = max_trials if max_trials is not None else self.settings.default_budget
        self.min_effect = None
        self.min_effect_pct = min_effect_pct
        if min_effect_pct is not None:
            if min_effect_pct <= 0:
                raise ValueError("min_effect_pct must be positive")
            fraction = min_effect_pct / 100.0
            self.min_effect = math.log1p(fraction) if direction == "increase" else -math.log1p(
                -min(fraction, 0.99)
            )
        if reference_value is not None and not (math.isfinite(reference_value)
                                                and reference_value > 0):
            raise ValueError("reference_value must be a positive metric value")
        self.reference_value = reference_value
        if noise_prior is not None:
            s0, df0 = (float(v) for v in noise_prior)
            if not (math.isfinite(s0) and s0 > 0 and math.isfinite(df0) and df0 > 0):
                raise ValueError("noise_prior must be (sigma > 0, degrees of freedom > 0)")
            noise_prior = (s0, df0)
        self.noise_prior = noise_prior
        self.negligible = math.log1p(self.settings.negligible_pct / 100.0)  # signed-log floor
        self.log_prior = self._log_prior(prior_weights)
        self.range_log_prior = range_log_prior(self.log_prior, self.settings.null_prior_top)
        self._prior_runs: dict[tuple[int, ...], dict[tuple[int, int], float]] = {}
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
        for point in self.evidence.pending_points():  # a surprising reading: measure it again
            if len(proposals) < k and in_flight[point] == 0:
                in_flight[point] += 1
                proposals.append(Proposal(point, self._phase_label(), "replicate a surprising "
                                          "reading (an outlier or a new level)"))
        if len(proposals) < k:
            proposals += self._propose_work(in_flight, k - len(proposals))
        return proposals

    def verdict(self, observations: Sequence[Observation]) -> Verdict:
        self._sync(observations)
        return describe(self)

    # ------------------------------------------------------------------------ state & replay

    def _reset(self) -> None:
        self.evidence = Evidence(self.n, self.sign, self.settings.outlier_k)
        self.reproduction: Reproduction | None = None
        self.reproduced_order = 0
        self.first_forecast: int | None = None
        self.outcome: str | None = None  # not_reproducible | reversed | inconclusive | budget
        self.chase_ruled_out = False  # not reproducible: under half the change being chased
        self.note = ""
        self.retracted: str | None = None
        self.stopped_early: str | None = None
        self.stages: list[Stage] = []
        self.reverify: list[Stage] = []
        self._consumed = []
        self._post_cache: dict[int, tuple[int, StagePosterior]] = {}
        self._chain_cache: dict[tuple[int, bool], tuple] = {}
        self.far_forecasts: list[bool] = []
        self.far_checked_at = -1

    def _sync(self, observations: Sequence[Observation]) -> None:
        done = len(self._consumed)
        if len(observations) < done or list(observations[:done]) != self._consumed:
            self._reset()
            done = 0
        for observation in observations[done:]:
            epoch_before = self.evidence.latest_epoch
            self.evidence.add(observation)
            self._consumed.append(observation)
            if self.evidence.latest_epoch != epoch_before:
                self._new_epoch()
            self._advance()

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

    def _new_epoch(self) -> None:
        """The node's system changed: culprits found on the old system are measured again."""
        for stage in self.stages:
            if stage.outcome == "found" and stage not in self.reverify:
                self.reverify.append(stage)

    def effective_min_effect(self) -> float | None:
        """The smallest change that counts (signed log): the stated ``min_effect_pct``, or
        half of the change from a reference run's level to the bad endpoint's now."""
        if self.min_effect is not None:
            return self.min_effect
        if self.reference_value is None:
            return None
        bad = self.evidence.values_at(self.n - 1)
        shift = self.evidence.shift
        if len(bad) < 2 or shift is None:
            return None
        expected = sum(bad) / len(bad) - (self.sign * math.log(self.reference_value) - shift)
        return 0.5 * expected if expected > 2.0 * self.negligible else None

    def found(self) -> list[Stage]:
        return [s for s in self.stages if s.outcome == "found" and s.culprit is not None]

    def current(self) -> Stage | None:
        active = [s for s in self.stages if s.active]
        return active[0] if active else None

    def _terminal_status(self) -> str | None:
        if self.outcome in ("not_reproducible", "reversed", "inconclusive"):
            return self.outcome
        if self.outcome == "budget_exhausted" or self.evidence.n_trials >= self.budget:
            return "budget_exhausted"
        if self.reproduction is not None and self.found() and not self._has_work():
            return "found"
        return None

    # ------------------------------------------------------------------------- posteriors

    def stage_posterior(self, stage: Stage, sigma: float | None = None) -> StagePosterior:
        """The stage's posterior; with `sigma`, the same with the noise fixed at that value
        (the naming rule's stress test, :func:`.verify.stress_mass`)."""
        cached = self._post_cache.get(stage.index)
        if sigma is None and cached is not None and cached[0] == self.evidence.version:
            return cached[1]
        ev = self.evidence
        points, values, blocks, epochs = ev.kept()
        known = tuple(s.culprit.point for s in self.found() if s.index < stage.index
                      or (s is not stage and s.outcome == "found"))
        hyps = self.history.hypotheses
        if known:
            hyps = hyps[~np.isin(hyps, known)]
        first = stage.index == 0
        data = StageData(
            points=points, values=values, blocks=blocks, epochs=epochs, known=known, hyps=hyps,
            log_prior=self.log_prior[hyps],
            null_prior=self.settings.null_prior_top if first else self.settings.null_prior_later,
            g=self._step_scale() ** 2, one_sided=first, r_weights=ev.r_weights(),
            weights=ev.kept_weights(), prior_runs=self._prior_runs.setdefault(known, {}),
            **self._noise_prior(sigma),
        )
        result = stage_posterior(self.history, data)
        if sigma is None:
            self._post_cache[stage.index] = (ev.version, result)
        return result

    def _noise_prior(self, sigma: float | None) -> dict[str, float]:
        """The posterior's noise prior: sigma fixed (``FIXED_DF`` pseudo degrees of freedom)
        when given, else the earlier run's restarts (``noise_prior``), else none."""
        if sigma is not None:
            return {"noise_ss": FIXED_DF * sigma * sigma, "noise_df": FIXED_DF}
        if self.noise_prior is not None:
            s0, df0 = self.noise_prior
            return {"noise_ss": df0 * s0 * s0, "noise_df": df0}
        return {}

    def _step_scale(self) -> float:
        """Prior scale of a culprit's step in sigma units: twice the change being hunted."""
        total = self.evidence.compare(0, self.n - 1, 0.5)
        sigma = self.evidence.sigma()
        if total is None or not math.isfinite(sigma) or sigma <= 0.0:
            return 4.0
        biggest = abs(total.diff)
        for stage in self.found():
            if stage.culprit is not None and stage.culprit.effect_pct is not None:
                biggest = max(biggest, abs(math.log1p(stage.culprit.effect_pct / 100.0)))
        return min(max(2.0 * biggest / sigma, 1.0), 50.0)

    def remainders(self) -> list[Remainder]:
        return remainders(self, self.settings.verify_confidence)

    def expected_remaining(self) -> int | None:
        """Forecast of the trials still needed (:mod:`forecast`) for the current stage; None
        while the endpoints reproduce, when the noise is not yet measured, or when done."""
        if self._terminal_status() is not None or self.reproduction is None:
            return None
        stage = self.current()
        if stage is None:
            return None
        return stage_forecast(self, stage)

    # ------------------------------------------------------------------------- transitions

    def _advance(self) -> None:
        for _ in range(2 * self.settings.max_culprits + 4):
            if not self._step():
                return

    def _step(self) -> bool:
        """Apply at most one sticky transition; True if one happened."""
        if (self.outcome is None and self.evidence.n_trials >= self.budget
                and self.reproduction is not None and not self.found() and not confirmed(self)):
            # The same reading as the early stop's (audit.too_costly): a reproduction
            # that the repeated looks never confirmed is a fluke until shown otherwise, and a
            # spent budget must not leave it standing as "budget exhausted" behind a search.
            self.withdraw(f"it is not confirmed beyond the luck of repeated looks, and the "
                          f"budget of {self.budget} trials is spent")
            return True
        if self._terminal_status() is not None:
            return False
        cfg = self.settings
        if self.reproduction is None:
            return check_reproduced(self)
        if not self.found():
            why = refuted(self)
            if why is not None:
                self.withdraw(why)
                return True
        for stage in list(self.reverify):
            if check_reverified(self, stage):
                self.reverify.remove(stage)
                return True
        if not self.stages:
            self.stages.append(Stage(0, self.evidence.n_trials))
            self.first_forecast = stage_forecast(self, self.stages[0])
            return True
        stage = self.current()
        if stage is None:
            return False
        if too_costly(self, stage):
            return True
        post = self.stage_posterior(stage)
        if stage.index == 0:
            if post.null_mass >= cfg.confidence:
                self.withdraw("no commit in the range explains a change")
                return True
        else:
            if not signalled(self):
                return False
            if self.evidence.n_trials - stage.opened_at >= cfg.later_max_trials:
                stage.outcome = "spread"
                return True
        if self.phase(stage) != "verify":
            stage.held_since = None
            return False
        target = verify_target(self, stage)
        pair = (target[0], *target[1])
        if stage.verify_pair != pair:  # a new head-to-head: its trials count from now
            stage.verify_pair, stage.verify_since = pair, self.evidence.n_trials
            stage.held_since = None
        if stage.index > 0:
            culprit, _, _ = verify_target(self, stage)
            stage.sign = float(post.step_sign[np.flatnonzero(post.hyps == culprit)[0]])
        elif not confirmed(self):
            return False  # the first culprit waits until the change is confirmed beyond luck
        if check_verified(self, stage):
            if len(self.found()) < cfg.max_culprits:
                self.stages.append(Stage(len(self.stages), self.evidence.n_trials))
            return True
        return False

    def withdraw(self, why: str) -> None:
        self.outcome = "not_reproducible"
        self.note = why
        if self.reproduction is not None:
            pct = self.evidence.to_pct(self.reproduction.diff)
            self.retracted = (f"the change that seemed to reproduce after "
                              f"{self.reproduction.at_trial} trials ({pct:+.1f}%) did not hold "
                              f"up: {why}")

    # ---------------------------------------------------------------------------- proposals

    def phase(self, stage: Stage) -> str:
        if self.reproduction is None:
            return "reproduce"
        if stage.index > 0 and not signalled(self):
            return "measure"
        _, _, mass = verify_target(self, stage)
        return "verify" if mass >= self.settings.verify_handoff else "search"

    def _phase_label(self) -> str:
        stage = self.current()
        if self.reproduction is None or stage is None:
            return "reproduce" if self.reproduction is None else "verify"
        phase = self.phase(stage)
        return "search" if phase == "measure" else phase

    def _has_work(self) -> bool:
        """Does anything still want trials (used to tell "found" from "still working")?"""
        if self.reverify or self.evidence.pending_points():
            return True
        stage = self.current()
        if stage is None:
            # No stage left to search (a later one gave up as spread, or the culprit cap):
            # the parts the named steps leave are still measured until each is resolved;
            # a caller that asked for one culprit only (isolate's chains) is done at it.
            return self._measures_after_stages() and bool(suggestive_points(self))
        if stage.index > 0 and self.phase(stage) == "measure":
            return bool(suggestive_points(self))
        return True

    def _propose_work(self, in_flight: Counter, slots: int) -> list[Proposal]:
        ev, cfg = self.evidence, self.settings
        good, bad = 0, self.n - 1
        if self.reproduction is None:
            cap = cfg.reproduce_max_per_endpoint + cfg.endpoint_max_failures
            labels = ("good endpoint", "bad endpoint")
            least = cfg.reproduce_min_per_endpoint
            proposals = self._alternate((good, bad), in_flight, slots, "reproduce", least,
                                        labels)
            ahead = self._ahead_of_reproduction(in_flight) if len(proposals) < slots else None
            if ahead is not None:
                proposals.append(ahead)
            return proposals + self._alternate((good, bad), in_flight, slots - len(proposals),
                                               "reproduce", cap, labels)
        proposals: list[Proposal] = []
        for stage in self.reverify:
            culprit = stage.culprit
            assert culprit is not None
            sides = (*culprit.parents, culprit.point)
            latest = ev.latest_epoch
            need = [p for p in sides if ev.epoch_count(p, latest) + in_flight[p]
                    < cfg.verify_min_per_side]
            if need:
                proposals += self._alternate(sides, in_flight, slots - len(proposals), "verify",
                                             None, None)
        audit = audit_point(self, in_flight) if len(proposals) < slots else None
        if audit is not None:
            in_flight[audit] += 1
            name = "good" if audit == good else "bad"
            proposals.append(Proposal(audit, "search", f"{name} endpoint, audit of the "
                                      "reproduction"))
        stage = self.current()
        if len(proposals) >= slots:
            return proposals
        if stage is None:
            if self._measures_after_stages():
                proposals += self._measure_points(in_flight, slots - len(proposals))
            return proposals
        phase = self.phase(stage)
        left = slots - len(proposals)
        if phase == "verify" and stage.index == 0 and not confirmed(self) and \
                ready_but_unconfirmed(self, stage):
            proposals += self._alternate((good, bad), in_flight, left, "verify", None,
                                         ("good endpoint, to confirm the change",
                                          "bad endpoint, to confirm the change"))
        elif phase == "verify":
            culprit, parents, _ = verify_target(self, stage)
            sides = (*parents, culprit)
            # Interleave by the head-to-head's own trials, not by all trials: a side the
            # search measured often must not be left out while the other catches up.
            since = stage.verify_since if stage.verify_pair == (culprit, *parents) else \
                ev.n_trials
            fresh = {p: len(ev.values_since(p, since)) for p in sides}
            cap = max(min(fresh[p] + in_flight[p] for p in sides) + 1, cfg.verify_fresh_per_side)
            if any(in_flight[p] for p in sides) and all(
                    fresh[p] + in_flight[p] >= cfg.verify_fresh_per_side for p in sides):
                # The head-to-head's minimum is measured or running: a free node waits for
                # it rather than start a side's next restart that a clear step never needs.
                return proposals
            labels = tuple(f"parent of the culprit {culprit}" for _ in parents) + ("culprit",)
            proposals += self._alternate(sides, in_flight, left, "verify", cap, labels, fresh)
        elif phase == "measure":
            proposals += self._measure_points(in_flight, left)
        else:
            proposals += self.search_points(stage, in_flight, left)
        return proposals

    def _ahead_of_reproduction(self, in_flight: Counter) -> Proposal | None:
        """The search's first point, measured on a node that would otherwise run a third
        endpoint trial while the endpoints' first ones are still running.

        With several nodes the trials end one by one: the first node to finish used to start
        the good endpoint's third restart while the bad endpoint's second still ran, and a
        large change then reproduced with three a side. The point the search would measure
        first (the prior's median on a line) is needed as soon as the change reproduces; if
        it does not, one restart was spent ahead. Only while a minimum of trials is still in
        flight, so a long reproduction (a small change) keeps every node on the endpoints."""
        ev, cfg = self.evidence, self.settings
        ends = (0, self.n - 1)
        least = cfg.reproduce_min_per_endpoint
        if self.n < 3 or not self.history.linear or ev.n_trials == 0:
            return None
        if min(ev.count(p) for p in ends) >= least:
            return None
        if any(ev.count(p) + in_flight[p] < least for p in ends):
            return None
        prior = np.exp(self.log_prior[1:] - self.log_prior[1:].max())
        median = 1 + int(np.searchsorted(np.cumsum(prior) / prior.sum(), 0.5))
        if median >= self.n - 1 or in_flight[median] or ev.count(median):
            return None
        in_flight[median] += 1
        return Proposal(median, "search", "ahead of the reproduction: the search's first "
                        "point, while the endpoints' last trials run")

    def _measures_after_stages(self) -> bool:
        return bool(self.found()) and self.settings.max_culprits > 1

    def _measure_points(self, in_flight: Counter, slots: int) -> list[Proposal]:
        proposals: list[Proposal] = []
        for point in suggestive_points(self):
            if len(proposals) < slots and in_flight[point] == 0:
                in_flight[point] += 1
                proposals.append(Proposal(point, "search", "an anchor of an unexplained "
                                          "part of the change"))
        return proposals

    def search_points(self, stage: Stage, in_flight: Counter, slots: int) -> list[Proposal]:
        """Where the search measures next (:mod:`.search`); a seam for references."""
        return search_points(self, stage, in_flight, slots)

    def _alternate(
        self,
        sides: Sequence[int],
        in_flight: Counter,
        slots: int,
        phase: str,
        cap: int | None,
        labels: Sequence[str] | None,
        counts: dict[int, int] | None = None,
    ) -> list[Proposal]:
        """Interleave points (the first first), keeping their trial counts (or ``counts``)
        balanced."""
        ev = self.evidence
        if counts is None:
            counts = {p: ev.count(p) + int(ev.failures[p]) for p in sides}
        planned = {p: counts[p] + in_flight[p] for p in sides}
        proposals: list[Proposal] = []
        while len(proposals) < slots:
            point = min(sides, key=lambda p: (planned[p], sides.index(p)))
            if cap is not None and planned[point] >= cap:
                break
            planned[point] += 1
            in_flight[point] += 1
            label = labels[sides.index(point)] if labels else f"point {point}"
            proposals.append(Proposal(point, phase, f"{label} ({planned[point]} trials)"))
        return proposals
