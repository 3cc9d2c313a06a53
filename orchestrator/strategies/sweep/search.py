"""The sweep's experiment: Optuna proposes configurations, restarts measure them, the best is
confirmed head-to-head against the baseline (`confirm.py`).

Pure apart from the Optuna study (which may live in memory): no processes, no Ray. The command
feeds it the controller's finished trials; the benchmark feeds it a virtual oracle. Both go
through `propose(k)` / `record(work, value)`.

How the search budget (`trials`) is spent:
  1. the baseline, `restarts` times (the reference every later number is compared with);
  2. Optuna asks a configuration (TPE starts with `startup` x budget random ones); it gets
     `restarts` restarts, one after the other, unless its first is obviously worse than the
     incumbent (then it is pruned and never restarted again); a configuration the sampler
     proposes again gets one more restart;
  3. the last `intensify` x budget restarts go to the leaders: the configuration the additive
     model (`effects.py`) predicts best, then the least-measured of the top of the ranking.
Then the confirmation runs, outside the search budget.

Size: the sweep's phases (baseline, search, leaders, confirmation hand-off) share one
state machine; the confirmation, noise, effects and work records are their own modules.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.trial import TrialState

from orchestrator.records import Candidate
from orchestrator.stats.effect import Effect
from orchestrator.strategies.sweep.confirm import (
    Confirmation,
    Confirmed,
    SweepResult,
    confirmation_effect,
    outcome,
)
from orchestrator.strategies.sweep.effects import AdditiveModel
from orchestrator.strategies.sweep.noise import prune_decision, restart_sd
from orchestrator.strategies.sweep.space import Assignment, SearchSpace
from orchestrator.strategies.sweep.work import ConfigStats, SweepSettings, Work, parse_phase, phase

__all__ = ["MAX_GRID", "ConfigStats", "SweepResult", "SweepSearch", "SweepSettings", "Work",
           "parse_phase", "phase"]

MAX_GRID = 200_000  # sampler=grid materialises the configurations in a shuffled order
MAX_PREDICTED = 50_000  # the model's best is searched over every configuration up to this


@dataclass
class _Evaluation:
    """An asked Optuna trial and the restarts it still needs."""

    trial: optuna.Trial
    key: str
    needed: int
    new_config: bool
    done: int = 0
    in_flight: bool = False


class SweepSearch:
    def __init__(self, space: SearchSpace, study: optuna.Study, base: Candidate,
                 target_conf: Mapping[str, Any], settings: SweepSettings):
        self.space = space
        self.study = study
        self.base = base
        self.target_conf = dict(target_conf)
        self.settings = settings
        self.configs: dict[str, ConfigStats] = {}
        self.baseline: ConfigStats | None = None
        self.baseline = self._config(space.baseline(target_conf))
        self._open: dict[int, _Evaluation] = {}
        self._in_flight: list[Work] = []
        self.spent = 0  # finished restarts (evidence), every phase
        self._search_spent = 0
        self._converged = False
        self.confirmation = Confirmation(settings)
        self._grid: list[Assignment] | None = None
        self._grid_walked_at: int | None = None  # search restarts planned when it was walked
        self._model: AdditiveModel | None = None
        self._model_at = -1
        self._all: list[Assignment] | None = None  # every configuration, for the model's best
        self._all_rows: tuple | None = None
        self.events: list[str] = []

    # -- configurations -------------------------------------------------------------------------
    def _config(self, assignment: Mapping[str, Any]) -> ConfigStats:
        norm = self.space.normalize(assignment) if assignment else dict(assignment)
        cand = self.space.candidate(self.base, norm, self.target_conf)
        stats = self.configs.get(cand.key)
        if stats is None:
            label = self.space.label(norm, self.baseline.assignment if self.baseline else None)
            stats = self.configs[cand.key] = ConfigStats(norm, cand, label)
        return stats

    def _better(self, a: float, b: float) -> bool:
        return a > b if self.settings.maximize else a < b

    def incumbent(self) -> ConfigStats | None:
        """What a new configuration must not be obviously worse than: the best of the baseline
        (measured without being selected, so a fair reference from its first restart) and the
        configurations measured at least twice (one lucky restart does not set the bar)."""
        best = None
        for c in self.configs.values():
            if (len(c.search) >= 2 or (c is self.baseline and c.search)) and not c.pruned \
                    and not c.failed:
                if best is None or self._better(c.mean(), best.mean()):
                    best = c
        return best

    def restart_sd(self) -> float:
        return restart_sd((c.search for c in self.configs.values()), self.settings.prior_cv)

    # -- proposing ------------------------------------------------------------------------------
    @property
    def search_over(self) -> bool:
        return self.confirmation.started

    @property
    def done(self) -> bool:
        return self.search_over and not self._in_flight and self._next_confirm(peek=True) is None

    def propose(self, k: int) -> list[Work]:
        """Up to k restarts to start now (fewer while the search drains before confirming)."""
        out: list[Work] = []
        while len(out) < k:
            work = self._next()
            if work is None:
                break
            self._in_flight.append(work)
            out.append(work)
        return out

    def _next(self) -> Work | None:
        if not self.search_over and self.baseline.failed:
            self._end_search()  # nothing can be compared with a baseline that does not run
        if not self.search_over:
            in_flight = sum(1 for w in self._in_flight if w.kind != "confirm")
            if self._search_spent + in_flight < self.settings.search_budget:
                work = self._next_search(self._search_spent + in_flight)
                if work is not None:
                    return work
            if in_flight:
                return None  # the ranking needs every search restart before confirming
            self._end_search()
        return self._next_confirm()

    def _next_search(self, planned_search: int) -> Work | None:
        b = self.baseline
        planned = b.restarts + sum(1 for w in self._in_flight if w.kind == "baseline")
        if planned < self.settings.restarts and not b.failed:
            return Work(b.candidate, phase("baseline"))
        for number, ev in self._open.items():
            if not ev.in_flight and ev.done < ev.needed:
                ev.in_flight = True
                return Work(self.configs[ev.key].candidate, phase("search", number))
        s = self.settings
        # A grid visits every configuration once before it repeats any: its re-measuring of
        # the leaders (`intensify`'s share of the budget) waits until the grid is walked.
        grid = s.sampler == "grid"
        if not grid and planned_search >= s.search_budget - s.intensify_budget:
            work = self._intensify()
            if work is not None:
                return work
        if self._converged:
            return self._after_grid(planned_search) if grid else None
        for _ in range(self.settings.max_free_asks):
            work = self._ask()
            if work is not None:
                return work
            if self._converged:
                return self._after_grid(planned_search) if grid else None
        self._converged = True
        self.events.append("the sampler keeps proposing measured configurations: search converged")
        return None

    def _after_grid(self, planned_search: int) -> Work | None:
        """Once every grid point was proposed: up to `intensify_budget` restarts of leaders."""
        if self._grid_walked_at is None:
            self._grid_walked_at = planned_search
        if planned_search >= self._grid_walked_at + self.settings.intensify_budget:
            return None
        return self._intensify()

    def _intensify(self) -> Work | None:
        """One more restart of a leader: the configuration the additive model predicts best
        (measured or not), else the least measured of the top of the ranking (the winner's
        curse is worst for one that looks best after a lucky restart)."""
        busy = {ev.key for ev in self._open.values()}
        leaders = self.ranking()[: self.settings.leaders]
        predicted = self.predicted_best()
        if predicted is not None and not predicted.pruned and not predicted.failed:
            leaders = [predicted, *[c for c in leaders if c.key != predicted.key]]
        leaders = [c for c in leaders if c.key not in busy]
        if not leaders:
            return None
        pick = min(leaders, key=lambda c: len(c.search))  # first among equals: the prediction
        self.study.enqueue_trial(dict(pick.assignment), user_attrs={"intensify": True})
        return self._ask(enqueued=True)

    def _ask(self, enqueued: bool = False) -> Work | None:
        """Ask Optuna for a configuration; known-bad ones are answered without a restart."""
        if self.settings.sampler == "grid" and not enqueued and not self._enqueue_next_grid_point():
            self._converged = True
            self.events.append("every configuration of the grid was proposed")
            return None
        trial = self.study.ask()
        stats = self._config(self.space.suggest(trial))
        trial.set_user_attr("candidate", stats.key)
        trial.set_user_attr("label", stats.label)
        if stats.failed:
            trial.set_user_attr("note", "untestable (failed to launch earlier)")
            self.study.tell(trial, state=TrialState.FAIL)
            return None
        if stats.pruned:
            trial.report(stats.search[0], 0)
            trial.set_user_attr("note", "pruned earlier")
            self.study.tell(trial, state=TrialState.PRUNED)
            return None
        busy = any(ev.key == stats.key for ev in self._open.values())
        seen = bool(stats.search) or busy
        needed = 1 if seen else self.settings.restarts
        self._open[trial.number] = _Evaluation(trial, stats.key, needed, not seen, in_flight=True)
        return Work(stats.candidate, phase("search", trial.number))

    def _enqueue_next_grid_point(self) -> bool:
        """sampler=grid: every distinct configuration once, in a seeded shuffled order."""
        if self._grid is None:
            size = self.space.size()
            if size is None or size > MAX_GRID:
                raise ValueError(f"a grid of {size} configurations is too large: use tpe/random")
            self._grid = list(self.space.configurations())
            random.Random(self.settings.seed).shuffle(self._grid)
        asked = {t.user_attrs.get("candidate") for t in self.study.get_trials(deepcopy=False)}
        asked.add(self.baseline.key)  # measured as the baseline (perhaps still running)
        while self._grid:
            assignment = self._grid.pop(0)
            if self._config(assignment).key not in asked:
                self.study.enqueue_trial(assignment, skip_if_exists=True)
                return True
        return False

    # -- results --------------------------------------------------------------------------------
    def record(self, work: Work, value: float | None, *, suspect: bool = False,
               evidence: bool = True) -> None:
        """A restart finished. `value` None: untestable; `evidence=False`: interrupted."""
        match = next(w for w in self._in_flight
                     if w.phase == work.phase and w.candidate.key == work.candidate.key)
        self._in_flight.remove(match)
        kind, index = parse_phase(work.phase) or ("", None)
        ev = self._open.get(index) if kind == "search" else None
        if ev is not None:
            ev.in_flight = False
        if not evidence:  # interrupted: the same restart is proposed again
            if kind == "confirm":
                self.confirmation.issued[(index, work.candidate.key)] -= 1
            return
        stats, usable = self._count(kind, index, work.candidate, value, suspect)
        if kind == "confirm":
            return
        if kind == "baseline":
            self._tell_baseline()
        elif ev is not None:
            self._advance(index, ev, stats, value if usable else None)

    def _count(self, kind: str, index: int | None, candidate: Candidate, value: float | None,
               suspect: bool) -> tuple[ConfigStats, bool]:
        """Book one finished restart (live or replayed) into its configuration's statistics;
        returns them and whether the value is usable evidence."""
        self.spent += 1
        stats = self.configs.get(candidate.key) or self._config_of(candidate)
        usable = value is not None and not suspect and math.isfinite(value)
        if kind == "confirm":
            self.confirmation.finished[(index, candidate.key)] += 1
            if usable:
                stats.confirm.append(float(value))
            return stats, usable
        self._search_spent += 1
        stats.restarts += 1
        if value is None:
            stats.failed = True
        elif usable:
            stats.search.append(float(value))
        return stats, usable

    def _config_of(self, candidate: Candidate) -> ConfigStats:
        """A stored trial of a candidate this process has not built (replay)."""
        stats = ConfigStats({}, candidate, candidate.label)
        self.configs[candidate.key] = stats
        return stats

    def _advance(self, number: int, ev: _Evaluation, stats: ConfigStats,
                 value: float | None) -> None:
        ev.done += 1
        trial = ev.trial
        if stats.failed:
            trial.set_user_attr("note", "untestable: the server did not run this configuration")
            self._close(number, TrialState.FAIL)
            return
        if value is not None:
            trial.report(value, ev.done - 1)
        if self.settings.prune and ev.new_config and ev.done == 1 and value is not None:
            inc = self.incumbent()
            if inc is not None and inc.key != stats.key:
                decision = prune_decision(value, inc.search, self.restart_sd(),
                                          maximize=self.settings.maximize,
                                          sigmas=self.settings.prune_sigmas)
                if decision.prune:
                    stats.pruned = True
                    trial.set_user_attr("note", f"pruned: {decision.reason}")
                    self.events.append(f"pruned {stats.label}: {decision.reason}")
                    self._close(number, TrialState.PRUNED)
                    return
        if ev.done >= ev.needed:
            self._close(number, TrialState.COMPLETE if stats.search else TrialState.FAIL)

    def _close(self, number: int, state: TrialState) -> None:
        ev = self._open.pop(number)
        stats = self.configs[ev.key]
        if state == TrialState.COMPLETE:
            self.study.tell(ev.trial, stats.mean())
        else:
            self.study.tell(ev.trial, state=state)

    def _tell_baseline(self) -> None:
        """Once measured, the baseline joins the study: the sampler and the dashboard see it."""
        b = self.baseline
        if len(b.search) < self.settings.restarts or not self.space.representable(b.assignment):
            return
        if any(t.user_attrs.get("baseline") for t in self.study.get_trials(deepcopy=False)):
            return
        self.study.add_trial(optuna.trial.create_trial(
            params=dict(b.assignment), distributions=self.space.distributions(b.assignment),
            value=b.mean(), user_attrs={"baseline": True, "candidate": b.key, "label": "baseline"}))

    # -- ranking --------------------------------------------------------------------------------
    def model(self) -> AdditiveModel:
        """The additive model of every search restart so far (see `effects.py`)."""
        if self._model is None or self._model_at != self._search_spent:
            observations = [(c.assignment, v) for c in self.configs.values() for v in c.search]
            self._model = AdditiveModel(self.space, observations, self.baseline.assignment,
                                        sd=self.restart_sd(), maximize=self.settings.maximize,
                                        prior_sd=self.settings.prior_effect_sd)
            self._model_at = self._search_spent
        return self._model

    def predicted_best(self) -> ConfigStats | None:
        """The configuration the model predicts best over the whole space (when enumerable)."""
        if self._all is None:
            size = self.space.size()
            self._all = [] if size is None or size > MAX_PREDICTED else list(
                self.space.configurations())
        model = self.model()
        signature = tuple(map(repr, model.columns))
        if self._all_rows is None or self._all_rows[0] != signature:
            self._all_rows = (signature, model.rows(self._all))
        best = model.best(self._all, self._all_rows[1])
        return None if best is None else self._config(best)

    def score(self, stats: ConfigStats, sd: float | None = None) -> float:
        """Estimated log metric of a measured configuration: the model's prediction plus its
        own deviation from it, shrunk by how many restarts back that deviation up. `sd`: the
        restart noise, when the caller scores many configurations at once (it costs a pass
        over every configuration)."""
        model = self.model()
        pred = model.predict(stats.assignment)
        logs = [math.log(v) for v in stats.search if v > 0]
        if not logs:
            return pred
        sd = self.restart_sd() if sd is None else sd
        tau = self.settings.interaction_sd
        weight = len(logs) * tau * tau / (len(logs) * tau * tau + sd * sd)
        return pred + weight * (statistics.fmean(logs) - pred)

    def ranking(self) -> list[ConfigStats]:
        """Search results, best first by `score`: measured, not pruned, not failed, not the
        baseline. A configuration measured once with a lucky restart ranks below one whose
        levels the other restarts also found good."""
        pool = [c for c in self.configs.values() if c.search and not c.pruned and not c.failed
                and c.key != self.baseline.key]
        sign = -1.0 if self.settings.maximize else 1.0
        sd = self.restart_sd()
        return sorted(pool, key=lambda c: sign * self.score(c, sd))

    def _end_search(self) -> None:
        for number in list(self._open):
            ev = self._open[number]
            stats = self.configs[ev.key]
            if stats.pruned:
                self._close(number, TrialState.PRUNED)
            else:
                self._close(number, TrialState.COMPLETE if stats.search else TrialState.FAIL)
        top = self.ranking()[: self.settings.confirm_top]
        keys = [self.baseline.key] + [c.key for c in top] if top else []
        if self.baseline.failed or not self.baseline.search:
            keys = []
        self.confirmation.keys = keys
        self.study.set_user_attr("confirm", keys)
        labels = ", ".join(c.label for c in top) or "nothing"
        self.events.append(f"search done after {self._search_spent} restarts; confirming "
                           f"{labels} against the baseline")

    # -- confirmation ---------------------------------------------------------------------------
    def _decisive(self, confidence: float) -> bool:
        """Whether the confirmation's leader already differs from the baseline."""
        sides = [self.configs[k] for k in (self.confirmation.keys or [])
                 if k != self.baseline.key and self.configs[k].confirm]
        sign = 1.0 if self.settings.maximize else -1.0
        best = max(sides, key=lambda c: sign * c.mean(c.search + c.confirm), default=None)
        e = self.effect(best, confidence) if best is not None else None
        return e is not None and (e.ci[0] > 0 or e.ci[1] < 0)

    def _next_confirm(self, peek: bool = False) -> Work | None:
        return self.confirmation.next(self.configs, self._decisive, peek)

    # -- resume ---------------------------------------------------------------------------------
    def replay(self, finished: Sequence[tuple[str, Candidate, float | None, bool]]) -> None:
        """Rebuild the state of an interrupted sweep from its stored trials and its study.

        `finished`: (phase, candidate, value, suspect) of every finished restart, oldest first.
        Evaluations that were open when the run stopped are closed with what they measured (the
        restarts they still needed are not run: nothing finished is ever repeated)."""
        for t in self.study.get_trials(deepcopy=False):
            if t.params and not t.user_attrs.get("baseline"):
                stats = self._config(t.params)
                stats.pruned = stats.pruned or t.state == TrialState.PRUNED
        attrs = self.study.user_attrs
        for text, cand, value, suspect in finished:
            parsed = parse_phase(text)
            if parsed is None:
                continue  # a trial of another experiment of the same run
            kind, index = parsed
            if kind == "confirm":
                self.confirmation.issued[(index, cand.key)] += 1
            self._count(kind, index, cand, value, suspect)
        for t in self.study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
            stats = self._config(t.params)
            if stats.search and not stats.failed:
                self.study.tell(t.number, stats.mean())
            else:
                self.study.tell(t.number, state=TrialState.FAIL)
        self._tell_baseline()
        if "confirm" in attrs:
            self.confirmation.keys = list(attrs["confirm"])

    # -- outcome --------------------------------------------------------------------------------
    def effect(self, stats: ConfigStats, confidence: float | None = None) -> Effect | None:
        return confirmation_effect(self.baseline, stats, self.configs,
                                   confidence or self.settings.confidence)

    def result(self) -> SweepResult:
        keys = [k for k in (self.confirmation.keys or []) if k != self.baseline.key]
        confirmed = [Confirmed(self.configs[k], self.effect(self.configs[k])) for k in keys]
        return outcome(self.baseline, confirmed, maximize=self.settings.maximize,
                       spent=self.spent,
                       n_configurations=sum(1 for c in self.configs.values() if c.restarts),
                       min_effect_pct=self.settings.min_effect_pct)
