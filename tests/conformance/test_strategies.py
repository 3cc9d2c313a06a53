"""The strategy contract (`orchestrator/strategies/base.py`), run by every strategy on a tiny
pure oracle: one planted cause, 2% restart noise, results arriving out of order from two nodes.

Every strategy (bisect, isolate, the sweep) must: end within its budget with the planted
answer; be pure (no file, socket or process while it runs: the controller, the benchmarks and
these tests drive the same code); and be deterministic, so the same observations give the same
proposals and the same verdict. The strategies behind `Strategy` (`propose(observations,
pending, k)` / `verdict(observations)`) must also respect `k` and the points in flight, state a
verdict whose fields agree with each other, and reach the same verdict when a resumed run
hands every stored observation to a fresh instance at once.

The sweep is driven through its own `propose(k)` / `record(work, value)`: it asks and tells an
Optuna study, whose state is the search, so it is not behind `Strategy` (the docstring of
`orchestrator/strategies/sweep/__init__.py` says why); the contract it shares with the others
is checked through `run_sweep`.
"""

from __future__ import annotations

import builtins
import io
import math
import random
import socket
import subprocess
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import pytest

from orchestrator.records import Candidate
from orchestrator.strategies.base import (
    STATUSES,
    TERMINAL_STATUSES,
    Observation,
    Proposal,
    Strategy,
    Verdict,
)
from orchestrator.strategies.bisect import BisectStrategy
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.strategies.sweep.search import SweepSearch, SweepSettings
from orchestrator.strategies.sweep.space import SearchSpace
from orchestrator.strategies.sweep.study import make_sampler, open_study

NODES = 2
CV = 0.02


def _noise(rng: random.Random) -> float:
    return 1.0 + CV * rng.gauss(0.0, 1.0)


@dataclass
class Run:
    """What one run of a strategy against the oracle did and concluded."""

    asked: list[str]  # every proposal, in order (their repr: equal runs ask equal things)
    answer: object  # the planted cause it named, in the oracle's terms
    status: str
    spent: int
    budget: int
    done: bool


# -- the strategies behind `Strategy` ----------------------------------------------------------
Resumed = tuple[Strategy, list[Observation]]


@dataclass
class BaseCase:
    """A `Strategy`, the oracle of its points and how to read its answer."""

    make: Callable[[], Strategy]
    measure: Callable[[Strategy, int, random.Random], float | None]
    answer: Callable[[Verdict], object]
    planted: object
    budget: int
    # A fresh instance and the observations as a resumed run reads them from the store.
    resume: Callable[[Strategy, list[Observation]], Resumed]


CULPRIT = 7  # bisect: the first slow commit of 12; every commit from it on is 50% slower


def _bisect_measure(strategy: Strategy, point: int, rng: random.Random) -> float:
    return (150.0 if point >= CULPRIT else 100.0) * _noise(rng)


CAUSE = 2  # isolate: of four differences, the third makes it 40% slower


def _isolate_measure(strategy: Strategy, point: int, rng: random.Random) -> float:
    return (140.0 if CAUSE in strategy.subset(point) else 100.0) * _noise(rng)


def _bisect_resume(live: Strategy, observations: list[Observation]) -> Resumed:
    return BisectStrategy(12, max_trials=60), observations


def _isolate_resume(live: Strategy, observations: list[Observation]) -> Resumed:
    """As `commands/isolate.py` does: each stored trial's subset gets a point of the fresh
    strategy (the numbers may differ from the live run's: they are labels)."""
    fresh = IsolateStrategy(4, max_trials=60)
    return fresh, [replace(o, point=fresh.point_of(live.subset(o.point))) for o in observations]


BASE_CASES = {
    "bisect": BaseCase(lambda: BisectStrategy(12, max_trials=60), _bisect_measure,
                       lambda v: v.top.point if v.top else None, CULPRIT, 60, _bisect_resume),
    "isolate": BaseCase(lambda: IsolateStrategy(4, max_trials=60), _isolate_measure,
                        lambda v: sorted(c.differences for c in v.culprits), [(CAUSE,)], 60,
                        _isolate_resume),
}


def drive(case: BaseCase, strategy: Strategy, seed: int = 0, *,
          check: Callable[[list[Observation], list[int], list[Proposal]], None] | None = None,
          ) -> tuple[Run, list[Observation]]:
    """The controller's loop: keep NODES points in flight, finish one at random, repeat."""
    rng = random.Random(seed)
    observations: list[Observation] = []
    pending: list[int] = []
    asked: list[str] = []
    for _ in range(10 * case.budget):
        verdict = strategy.verdict(observations)
        if not verdict.done and len(pending) < NODES:
            batch = strategy.propose(observations, list(pending), NODES - len(pending))
            if check is not None:
                check(list(observations), list(pending), batch)
            asked += [repr(p) for p in batch]
            pending += [p.point for p in batch]
        if not pending:
            break
        point = pending.pop(rng.randrange(len(pending)))
        observations.append(Observation(point, case.measure(strategy, point, rng),
                                        trial_id=len(observations)))
    verdict = strategy.verdict(observations)
    return Run(asked, case.answer(verdict), verdict.status, len(observations), case.budget,
               verdict.done), observations


# -- the sweep, through its own loop -----------------------------------------------------------
SPACE = {"name": "tiny", "params": {"NCCL_PROTO": {"values": [None, "LL", "Simple"]},
                                    "NCCL_ALGO": {"values": [None, "Ring", "Tree"]}}}
BEST_SETTING, BEST = "NCCL_PROTO", "LL"  # 30% more throughput; nothing else matters


def run_sweep(seed: int = 0) -> Run:
    space = SearchSpace.from_conf(SPACE)
    settings = SweepSettings(budget=12, maximize=True, sampler="grid", seed=seed,
                             confirm_rounds=4)
    sampler = make_sampler(settings.sampler, space, seed=seed, budget=settings.budget)
    study = open_study(name="conformance", storage=None, sampler=sampler, maximize=True)
    search = SweepSearch(space, study, Candidate.make("b" * 40), {}, settings)
    rng = random.Random(seed)
    in_flight: deque = deque()
    asked: list[str] = []
    for _ in range(10 * settings.total):
        if search.done:
            break
        batch = search.propose(NODES - len(in_flight))
        asked += [f"{w.phase} {sorted(w.candidate.env_dict.items())}" for w in batch]
        in_flight.extend(batch)
        if not in_flight:
            break
        work = in_flight.popleft()
        best = work.candidate.env_dict.get(BEST_SETTING) == BEST
        search.record(work, (130.0 if best else 100.0) * _noise(rng))
    result = search.result()
    # The planted setting; the other one has no effect, so any of its levels ties.
    answer = result.best.config.assignment.get(BEST_SETTING) if result.best else None
    return Run(asked, answer, result.status, search.spent, settings.total, search.done)


def _run_base(name: str, seed: int = 0) -> Run:
    case = BASE_CASES[name]
    return drive(case, case.make(), seed)[0]


RUNS: dict[str, tuple[Callable[[int], Run], object, str]] = {
    "bisect": (lambda seed: _run_base("bisect", seed), CULPRIT, "found"),
    "isolate": (lambda seed: _run_base("isolate", seed), [(CAUSE,)], "found"),
    "sweep": (run_sweep, BEST, "found"),
}


@pytest.fixture(params=sorted(RUNS))
def strategy_run(request) -> tuple[Callable[[int], Run], object, str]:
    """Every strategy: how to run it on its oracle, the planted answer, the status naming it."""
    return RUNS[request.param]


@pytest.fixture(params=sorted(BASE_CASES))
def case(request) -> BaseCase:
    """Every strategy behind the `Strategy` base."""
    return BASE_CASES[request.param]


# -- every strategy ----------------------------------------------------------------------------
def test_ends_within_its_budget_naming_the_planted_cause(strategy_run):
    run, planted, status = strategy_run
    result = run(0)
    assert result.done and result.spent <= result.budget, result
    assert (result.status, result.answer) == (status, planted), result


@contextmanager
def no_io() -> Iterator[None]:
    """Files, sockets and processes refused while a strategy runs (imports are done by then:
    the module imports above). Not a monkeypatch: the suite's own teardown reads /proc."""
    def refuse(*args, **kwargs):
        raise AssertionError(f"a strategy did I/O: {args[:1]}")

    guarded = ((builtins, "open"), (io, "open"), (socket, "socket"),
               (socket, "create_connection"), (subprocess, "Popen"))
    saved = [getattr(owner, name) for owner, name in guarded]
    for owner, name in guarded:
        setattr(owner, name, refuse)
    try:
        yield
    finally:
        for (owner, name), value in zip(guarded, saved, strict=True):
            setattr(owner, name, value)


def test_is_pure(strategy_run):
    run, planted, _ = strategy_run
    with no_io():
        result = run(1)
    assert result.answer == planted


def test_the_same_observations_give_the_same_proposals_and_answer(strategy_run):
    run, _, _ = strategy_run
    first, second = run(3), run(3)
    assert first.asked and first.asked == second.asked
    assert (first.answer, first.status, first.spent) == (second.answer, second.status,
                                                         second.spent)


# -- strategies behind the base ----------------------------------------------------------------
def test_proposals_respect_k_and_the_points_in_flight(case):
    def check(observations: list[Observation], pending: list[int], batch: list[Proposal]):
        assert len(batch) <= NODES - len(pending)
        assert all(isinstance(p, Proposal) and p.phase and p.point >= 0 for p in batch)

    strategy = case.make()
    run, observations = drive(case, strategy, check=check)
    assert run.done
    assert strategy.propose(observations, [], 0) == []
    assert strategy.propose(observations, [], NODES) == []  # done: nothing more to measure


def test_the_verdict_states_what_it_knows(case):
    strategy = case.make()
    first = strategy.verdict([])
    assert first.status in STATUSES and not first.done and first.n_trials == 0
    run, observations = drive(case, strategy)
    verdict = strategy.verdict(observations)
    assert verdict.status in TERMINAL_STATUSES and verdict.done
    assert verdict.n_trials == len(observations)
    assert 0.0 <= verdict.confidence <= 1.0 and verdict.message.strip()
    assert verdict.top is not None and 0.0 < verdict.top.probability <= 1.0
    assert verdict.total_effect_pct is not None and verdict.total_effect_pct > 0
    lo, hi = verdict.total_effect_ci
    assert lo <= verdict.total_effect_pct <= hi
    assert all(math.isfinite(p) and 0.0 <= p <= 1.0 for p in verdict.posterior)


def test_a_resumed_run_reaches_the_same_verdict_from_the_stored_observations(case):
    """Every experiment rebuilds its state from the store: a fresh strategy handed all the
    observations at once must conclude what the one that saw them arrive concluded."""
    live = case.make()
    _, observations = drive(case, live)
    resumed, stored = case.resume(live, observations)
    assert repr(resumed.verdict(stored)) == repr(live.verdict(observations))


def test_trials_that_measure_nothing_still_end_the_run(case):
    """A candidate that never runs (build or launch failure) is a trial spent, not a loop."""
    broken = BaseCase(case.make, lambda strategy, point, rng: None, case.answer, None,
                      case.budget, case.resume)
    run, _ = drive(broken, broken.make())
    assert run.done and run.spent <= run.budget and run.status in TERMINAL_STATUSES
    assert run.status != "found"
