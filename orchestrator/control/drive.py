"""The experiment loop: ask the strategy, keep every node busy, feed results back.

Pure strategies on one side, the Ray controller on the other; this loop is the only place that
translates between strategy points and stored trials. It rebuilds its observations from the
store, so a resumed run continues exactly where the interrupted one stopped: every finished
trial is reused, none is repeated.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from orchestrator.control.repetitions import RepetitionDesign, change_size
from orchestrator.records import NOT_EVIDENCE_PHASES, RETRYABLE, Candidate
from orchestrator.run.blocks import level_candidate, lifetime_of
from orchestrator.store import TrialRow
from orchestrator.strategies.base import Observation, Strategy, Verdict
from orchestrator.system.watch import SystemChange, SystemWatch

if TYPE_CHECKING:  # the loop itself needs no Ray: any object with the Controller's surface
    from orchestrator.control.controller import Controller


def observation(row: TrialRow, point: int, metric: str, final_attempt: int,
                epoch: int = 0) -> Observation | None:
    """A stored trial as the strategy sees it, or None when it is not evidence.

    Interrupted trials are not evidence (they are re-run); a failure that was retried is not
    either (its retry is); the last failed attempt makes the point untestable (value None), and
    so does a failure the controller never retries (`prepare_failed`, `env_mismatch`: the same
    candidate fails the same way), whatever its attempt number. Were that one "not evidence",
    the experiment would propose the same trial again, and again, forever."""
    if row.outcome is None or row.outcome.value == "interrupted":
        return None
    lifetime = lifetime_of(row.result.fingerprint if row.result else None)
    if row.outcome.measured:
        value = row.result.value(metric) if row.result else None
        if value is None:
            return Observation(point, None, row.suspect, row.id, epoch, lifetime=lifetime)
        reps = row.result.values(metric)
        logs = [math.log(v) for v in reps if v > 0]
        spread = statistics.variance(logs) if len(logs) >= 2 and len(logs) == len(reps) else None
        return Observation(point, value, row.suspect, row.id, epoch, len(reps), spread,
                           lifetime=lifetime)
    if row.attempt >= final_attempt or row.outcome not in RETRYABLE:
        return Observation(point, None, row.suspect, row.id, epoch, lifetime=lifetime)
    return None


def unreported(rows: Sequence[TrialRow], metric: str,
               points: Sequence[Candidate] | PointMap | None = None) -> str | None:
    """A line for the user when trials ran fine but did not report ``metric``.

    Such trials count as unmeasurable points (an experiment cannot use them), so a run whose
    target never reports the metric ends "could not be measured"; this says why, and what
    the trials did report. Only this experiment's trials count (those of ``points`` when given,
    never reference trials): a plain-decode reference in the same run has no ``verify_ms`` on
    purpose."""
    pmap = _as_map(points) if points is not None else None
    silent = [r for r in rows if r.outcome is not None and r.outcome.measured and r.result
              and r.phase not in NOT_EVIDENCE_PHASES
              and (pmap is None or pmap.point(r.candidate) is not None)
              and r.result.value(metric) is None]
    if not silent:
        return None
    reported = sorted({k for r in silent for k in r.result.metric_names()})
    return (f"{len(silent)} trial(s) ran but reported no {metric}"
            + (f"; they reported: {', '.join(reported)}" if reported else "")
            + ". Check that the server exports it, or choose one of those with metric=NAME.")


class PointMap(Protocol):
    """Strategy points <-> candidates. A list of candidates is the fixed case (bisect); an
    isolating strategy grows its points (subsets of differences) as it goes."""

    def candidate(self, point: int) -> Candidate: ...

    def point(self, candidate: Candidate) -> int | None: ...


class FixedPoints:
    def __init__(self, candidates: Sequence[Candidate]):
        self.candidates = list(candidates)
        self._index = {c.key: i for i, c in enumerate(self.candidates)}

    def candidate(self, point: int) -> Candidate:
        return self.candidates[point]

    def point(self, candidate: Candidate) -> int | None:
        return self._index.get(candidate.key)


def _as_map(points: Sequence[Candidate] | PointMap) -> PointMap:
    return FixedPoints(points) if isinstance(points, Sequence) else points


def _pending(points: PointMap, inflight) -> list[int | None]:
    """The points an evaluation in flight will measure: all of a lifetime's levels."""
    live = tuple(getattr(inflight, "live", ()) or ())
    if not live:
        return [points.point(inflight.candidate)]
    return [points.point(level_candidate(inflight.candidate, level)) for level in live]


class Epochs:
    """The system epoch of each trial: it goes up with every change of a node's system seen
    between trials (:mod:`orchestrator.system.watch`), so that a strategy compares trials of
    one system with each other. Fed finished rows in store order."""

    def __init__(self) -> None:
        self.watch = SystemWatch()
        self.epoch = 0

    def feed(self, row: TrialRow) -> tuple[int, SystemChange | None]:
        change = self.watch.feed(row) if row.finished else None
        if change is not None:
            self.epoch += 1
        return self.epoch, change


def replay(rows: Sequence[TrialRow], points: PointMap, metric: str, retries: int,
           epochs: Epochs | None = None) -> list[Observation]:
    """Observations from the stored trials of these points: a same candidate measured earlier
    in the run is evidence too (:func:`drive` reports a node whose system changed in between,
    and the observations carry the system epoch); reference trials are not."""
    obs = []
    epochs = epochs or Epochs()
    for row in rows:
        epoch, _ = epochs.feed(row)
        if row.phase in NOT_EVIDENCE_PHASES:
            continue
        point = points.point(row.candidate)
        if point is None:
            continue
        o = observation(row, point, metric, retries + 1, epoch)
        if o is not None:
            obs.append(o)
    return obs


def drive(
    controller: Controller,
    strategy: Strategy,
    points: Sequence[Candidate] | PointMap,
    *,
    metric: str,
    on_verdict: Callable[[Verdict, int], None] | None = None,
    on_system_change: Callable[[SystemChange], None] | None = None,
    repetitions: RepetitionDesign | None = None,
    record: Callable[[Verdict, Sequence[Observation]], None] | None = None,
) -> Verdict:
    """Run trials until the strategy is done (or proposes nothing while nothing runs).

    ``record`` hears every verdict with the observations it was computed from (the bisect
    keeps its posterior history this way, instead of replaying it at the end).

    ``on_system_change`` hears of every change of a node's system state between its trials
    (:mod:`orchestrator.system.watch`), including one across an interruption: the first trial
    of a resumed run is compared with the node's last trial before it.

    ``repetitions`` chooses each new trial's benchmark repetitions from what the stored trials
    say about the two noise levels and the costs (:mod:`orchestrator.control.repetitions`);
    without it every trial runs ``bench.repetitions``.
    """
    pmap = _as_map(points)
    stored = controller.store.trials()
    epochs = Epochs()  # changes among the stored trials were told when they happened
    observations = replay(stored, pmap, metric, controller.retries, epochs)
    final_attempt = controller.retries + 1
    verdict = strategy.verdict(observations)
    if record:
        record(verdict, observations)
    rows = list(stored)
    while True:
        if not verdict.done:
            idle = controller.idle_nodes()
            if idle:
                pending = [p for f in controller.in_flight() for p in _pending(pmap, f)]
                proposals = strategy.propose(observations, pending, len(idle))[: len(idle)]
                count = None
                if repetitions is not None and proposals:
                    count = repetitions.update(rows, (o.trial_id for o in verdict.outliers
                                                      if o.trial_id is not None),
                                               change_size(verdict))
                launch = getattr(pmap, "launch", None)
                for proposal in proposals:
                    if launch is not None:  # several points within one server lifetime
                        cand, live = launch(proposal.point)
                        controller.submit(cand, phase=proposal.phase, repetitions=count,
                                          live=live)
                    else:
                        controller.submit(pmap.candidate(proposal.point), phase=proposal.phase,
                                          repetitions=count)
        if not controller.in_flight():
            break
        expand = getattr(controller, "blocks_of", None)
        for row in [b for r in controller.wait() for b in (expand(r) if expand else [r])]:
            rows.append(row)
            epoch, change = epochs.feed(row)
            if change is not None and on_system_change is not None:
                on_system_change(change)
            o = observation(row, pmap.point(row.candidate), metric, final_attempt, epoch)
            if o is not None:
                observations.append(o)
        if repetitions is not None:
            repetitions.tally(rows)
        verdict = strategy.verdict(observations)
        if record:
            record(verdict, observations)
        if on_verdict:
            on_verdict(verdict, len(observations))
    return strategy.verdict(observations)
