"""One system per comparison: the isolate strategy decides again on a new system epoch's
trials alone, and an answer whose node changed says so first and does not count as explained."""

from __future__ import annotations

import math
import random

from orchestrator.answer.epochs import mark_system_change
from orchestrator.strategies.base import Observation
from orchestrator.strategies.isolate import IsolateStrategy


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
