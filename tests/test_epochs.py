"""One system per comparison: the isolate strategy decides again on a new system epoch's
trials alone, an answer whose node changed says so first and does not count as explained, and
the final check never pools its restarts across a change of the node."""

from __future__ import annotations

import io
import math
import random

import pytest
from rich.console import Console

from orchestrator.answer.epochs import mark_system_change
from orchestrator.commands.final_check import (
    FINAL_PHASE,
    final_check,
    next_round,
    owed,
    refreshed,
    set_aside,
    total_rows,
)
from orchestrator.commands.investigate_answer import epoch_parts
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.store import TrialRow
from orchestrator.strategies.base import Observation
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.system.watch import latest_epoch


def _run(lock_after: int | None, seed: int = 0):
    """One difference (+16%); after `lock_after` trials every configuration runs 30% slower
    (a clock lock set from outside), and the trials carry epoch 1 from there on."""
    rng = random.Random(seed)
    strategy = IsolateStrategy(1, confidence=0.99)
    observations: list[Observation] = []
    while not strategy.verdict(observations).done:
        proposals = strategy.propose(observations, [], 1)
        if not proposals:
            break
        point = proposals[0].point
        changed = lock_after is not None and len(observations) >= lock_after
        value = 20.0 * (1.16 if strategy.subset(point) else 1.0) * (1.3 if changed else 1.0)
        observations.append(Observation(point, value * math.exp(rng.gauss(0, 0.02)),
                                        epoch=int(changed)))
    return strategy, strategy.verdict(observations), observations


def test_a_new_epoch_is_measured_again_and_never_mixed():
    for seed in range(5):
        strategy, verdict, observations = _run(lock_after=6, seed=seed)
        assert verdict.status == "found", verdict.message
        assert [c.differences for c in verdict.culprits] == [(0,)]
        # The total is the new system's alone: +16%, not a mix with the slower trials.
        assert 10.0 < verdict.total_effect_pct < 22.0, verdict.message
        assert strategy.discarded >= 1
        assert strategy.evidence.n_trials == sum(o.epoch == 1 for o in observations)


def test_without_a_change_nothing_is_discarded():
    strategy, verdict, _ = _run(lock_after=None)
    assert verdict.status == "found" and strategy.discarded == 0


def test_an_answer_whose_node_changed_says_so_first():
    answer = {"sentence": "verify_ms +10.0% ... = NCCL_ALGO +9.2%", "status": "explained",
              "explains": True, "next": ""}
    change = {"node": "local-0", "before_trial": 7, "after_trial": 9,
              "summary": "SM clock lock: none -> 1700 MHz"}
    mark_system_change(answer, [change], remeasured=["isolate"],
                       not_comparable=["the reference re-measured now"])
    assert answer["sentence"].startswith("the node's system changed during the run (SM clock")
    assert "not comparable: the reference re-measured now" in answer["sentence"]
    assert answer["status"] == "system_changed" and answer["explains"] is False
    assert "holds still" in answer["next"]


# The final check within one system epoch: its helpers read rows, so a node that changes
# halfway through the check is built from rows alone (a power limit lowered from outside).

def _fp(power: int) -> dict:
    return {"gpu": {"driver_version": "590.48.01",
                    "gpus": [{"index": 0, "name": "H200", "power_limit_w": power,
                              "sm_clock_locked_mhz": None}]},
            "packages": {"torch": "2.9.1"}, "host": {"kernel": "6.8.0"}}


def _row(tid: int, cand: Candidate, value: float, *, power: int = 700,
         phase: str = FINAL_PHASE) -> TrialRow:
    result = TrialResult(Outcome.OK, measurements=(Measurement(0, {"verify_ms": value}),),
                         node="local-0", fingerprint=_fp(power))
    return TrialRow(id=tid, candidate_id=ord(cand.commit[0]), candidate=cand, node="local-0",
                    phase=phase, attempt=1, state="done", outcome=Outcome.OK, detail="",
                    started_at=None, ended_at=None, log_path="", suspect=False, result=result)


GOOD, BAD = Candidate.make("a" * 40), Candidate.make("b" * 40)


def _interleaved(n: int, power: int, start: int = 1, good: float = 20.0,
                 bad: float = 24.0) -> list[TrialRow]:
    """`n` rounds of the two endpoints, good then bad, with a little restart noise."""
    rows = []
    for i in range(n):
        wobble = 1.0 + 0.01 * ((i % 3) - 1)
        rows += [_row(start + 2 * i, GOOD, good * wobble, power=power),
                 _row(start + 2 * i + 1, BAD, bad / wobble, power=power)]
    return rows


def test_the_final_check_owes_its_rounds_on_the_new_state_and_sets_the_old_aside():
    before = _interleaved(2, 700)
    assert owed(before, [GOOD, BAD], "verify_ms") == [] and set_aside(before) == 0
    # The power limit drops from outside after the two rounds: one restart of bad on the
    # new state is not a window, and the four from before are set aside, not pooled.
    changed = [*before, _row(5, BAD, 30.0, power=500)]
    assert owed(changed, [GOOD, BAD], "verify_ms") == [GOOD, BAD]
    assert set_aside(changed) == 4
    again = [*changed, *_interleaved(2, 500, start=6, good=25.0, bad=30.0)]
    assert owed(again, [GOOD, BAD], "verify_ms") == []
    # With a reference only the bad endpoint is measurable: owed only once the node changed.
    assert owed([], [BAD], "verify_ms") == []
    assert owed(changed, [BAD], "verify_ms") == [BAD]
    assert owed([*changed, _row(6, BAD, 30.0, power=500)], [BAD], "verify_ms") == []


def test_a_total_is_read_within_one_epoch_or_said_to_be_from_before_the_change():
    before = _interleaved(2, 700)
    changed = [*before, _row(5, BAD, 30.0, power=500)]
    rows, now = total_rows(changed, [GOOD.key, BAD.key], "verify_ms")
    assert not now and [r.id for r in rows] == [1, 2, 3, 4]  # good is not on the new state
    rows, now = total_rows(changed, [BAD.key], "verify_ms")
    assert now and [r.id for r in rows] == [5]
    assert total_rows(before, [GOOD.key, BAD.key], "verify_ms") == (before, True)
    parts = epoch_parts(changed, {"after_trial": 5}, {"isolate": 1}, total_now=False,
                        set_aside=4)
    assert any(p.startswith("the total (") for p in parts["not_comparable"])
    assert any(p.startswith("the remainder") for p in parts["not_comparable"])
    assert "the final check (4 restarts from before the change set aside)" in parts["remeasured"]
    fresh = epoch_parts(changed, {"after_trial": 5}, {"isolate": 1})
    assert "the total (the bad state now)" in fresh["remeasured"]
    assert not any(p.startswith("the remainder") for p in fresh["not_comparable"])


def test_the_next_round_and_a_cause_effect_count_only_the_new_state():
    """Six rounds before the change and two after: the total's window has two restarts a
    side on the new state, so it is what an added restart narrows most (counting all eight
    would pick the cause); a cause's effect re-read after the change is the new state's
    (+10%), not a mix with the old one's (+50%: pooled, +19%)."""
    cause_a, cause_b = Candidate.make("c" * 40), Candidate.make("d" * 40)
    rows = _interleaved(6, 700)
    rows += [_row(13, cause_a, 20.0, power=700, phase="isolate"),
             _row(14, cause_b, 30.0, power=700, phase="isolate")]
    rows += _interleaved(2, 500, start=15, good=25.0, bad=30.0)
    n = 19
    for i in range(3):
        wobble = 1.0 + 0.01 * (i - 1)
        rows += [_row(n, cause_a, 25.0 * wobble, power=500),
                 _row(n + 1, cause_b, 27.5 / wobble, power=500)]
        n += 2
    answer = {"causes": [{"keys": [cause_a.key, cause_b.key]}]}
    assert next_round(rows, answer, [GOOD, BAD], "verify_ms", window=True) == [GOOD, BAD]
    doc = {"findings": [{"probability": 0.999, "before_key": cause_a.key,
                         "after_key": cause_b.key, "effect_detail": {}}]}
    (finding,) = refreshed(doc, rows, "verify_ms")["findings"]
    assert 8.0 < finding["effect_detail"]["verify_ms"]["pct"] < 12.0


class _Node:
    """A controller over one node whose power limit drops from outside after `change_after`
    restarts: what `final_check` asks of a controller, no Ray, no server."""

    def __init__(self, change_after: int):
        self.nodes, self.rows, self.running = ["local-0"], [], []
        self.change_after = change_after
        self.store = self

    def trials(self) -> list[TrialRow]:
        return list(self.rows)

    def idle_nodes(self) -> list[str]:
        return [] if self.running else list(self.nodes)

    def in_flight(self) -> int:
        return len(self.running)

    def submit(self, cand: Candidate, phase: str) -> None:
        self.running.append((cand, phase))

    def wait(self) -> list[TrialRow]:
        cand, phase = self.running.pop(0)
        n = len(self.rows) + 1
        changed = n > self.change_after
        value = (20.0 if cand is GOOD else 24.0) * (1.25 if changed else 1.0)
        self.rows.append(_row(n, cand, value * (1.0 + 0.01 * (n % 3 - 1)),
                              power=500 if changed else 700, phase=phase))
        return self.rows[-1:]


def test_a_final_check_whose_node_changes_measures_the_new_state_within_its_budget():
    seen: list[tuple[list, dict | None]] = []

    def answer_of(rows, check):
        seen.append((rows, check))
        return {"status": "explained"}

    for budget, done in ((12, True), (4, False)):
        seen.clear()
        node = _Node(change_after=3)
        final_check(node, [GOOD, BAD], answer_of, budget, Console(file=io.StringIO()),
                    metric="verify_ms")
        rows, check = seen[-1]
        assert check["spent"] <= budget and check["set_aside"] == 3
        new = latest_epoch(rows)
        assert all(r.result.fingerprint == _fp(500) for r in new)
        # Two rounds on the new state when the budget allows them; else the total is
        # stated as from before the change, never pooled across it.
        assert (owed(rows, [GOOD, BAD], "verify_ms") == []) is done
        assert total_rows(rows, [GOOD.key, BAD.key], "verify_ms")[1] is done


def _undecided(n_then: int, se: float, rest: float = 0.0) -> dict:
    """An investigation's answer against a reference of `n_then` restarts, undecided."""
    return {"status": "undecided", "min_effect": {"pct": 4.0, "stated": False},
            "total": {"log": [math.log(1.3), se, 12], "n": [n_then, 6]},
            "unexplained": {"log": [math.log1p(rest / 100.0), se, 12]}}


def test_a_final_check_that_no_restart_now_can_decide_spends_none():
    """A one-restart reference in 2.5% restart noise keeps the remainder's interval at least
    +-4.9% wide however often now is measured: past a 4% min effect, "explained" is out of
    reach, and with the estimate near zero so is "a remainder". The check says so and spends
    nothing; a reference of three restarts (floor 2.8%), or an estimate far enough out that
    more restarts could still show a remainder, is measured as before."""
    from orchestrator.answer.compose import _check_words
    from orchestrator.commands.final_check import reference_floor

    sigma = 0.025
    one = _undecided(1, sigma * math.sqrt(1 + 1 / 6))
    floor = reference_floor(one)
    assert floor == {"pct": pytest.approx(5.02, abs=0.05), "n_then": 1}
    assert reference_floor(_undecided(3, sigma * math.sqrt(1 / 3 + 1 / 6))) is None
    assert reference_floor(_undecided(1, sigma * math.sqrt(1 + 1 / 6), rest=12.0)) is None
    seen: list[dict | None] = []

    def answer_of(rows, check):
        seen.append(check)
        return one

    node = _Node(change_after=1000)
    final_check(node, [BAD], answer_of, 12, Console(file=io.StringIO()), metric="verify_ms")
    assert node.rows == [] and seen[-1]["floor"] == floor and seen[-1]["spent"] == 0
    words = _check_words(seen[-1])
    assert words.startswith(" (the reference's 1 restart alone keeps its interval +-5.0% wide"
                            " however often now is measured: the final check stopped after 0"
                            " of 12 restarts"), words
