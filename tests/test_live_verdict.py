"""The server-state decision on realistic noise: seeded cases of a running server and fresh
starts of its command, with restart noise (log-normal), outlier restarts and a heavy tail, and
the adaptive rule the command follows (three fresh starts, more while unsettled, at most five).

"Never confidently wrong": no state where there is none, no "ruled out" where there is some."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.live import verdict as V

MIN_EFFECT = 4.0


def _restart(rng: random.Random, level: float, cv: float, outliers: float = 0.0) -> float:
    value = level * math.exp(rng.gauss(0.0, cv))
    if outliers and rng.random() < outliers:
        value *= rng.choice((1.15, 1.3))  # an outlier restart (a slow launch)
    return value


def _run(rng: random.Random, *, state_pct: float, cv: float, was: float | None = None,
         then: float | None = None, outliers: float = 0.0, heavy: bool = False,
         max_fresh: int = 5) -> V.StateVerdict:
    fresh_level = 19.0

    def noise() -> float:  # heavy: a Student-t-like tail (normal over a gamma's root)
        z = rng.gauss(0, 1)
        return cv * (z / math.sqrt(max(rng.gammavariate(1.5, 1 / 1.5), 0.05)) if heavy else z)

    live = fresh_level * (1 + state_pct / 100) * math.exp(noise())
    fresh: list[float] = []
    then = was if was is not None else then
    change = math.log(live / then) if then else None
    v = V.decide(live, fresh, MIN_EFFECT, change)
    while len(fresh) < max_fresh:
        fresh.append(_restart(rng, fresh_level, cv, outliers) if not heavy
                     else fresh_level * math.exp(noise()))
        if len(fresh) >= 3:
            v = V.decide(live, fresh, MIN_EFFECT, change)
            if V.settled(v, was, MIN_EFFECT):
                break
    return v


@pytest.mark.parametrize("cv, most", [(0.01, 2), (0.02, 4), (0.04, 8)])
def test_no_state_is_rarely_called_state(cv, most):
    """At most the 99% level's share (1% of 400 cases is 4; 2% at noise as large as the min
    effect, where one lifetime alone is off by more than it one time in three)."""
    rng = random.Random(f"no-state/{cv}")
    calls = [_run(rng, state_pct=0.0, cv=cv).status for _ in range(400)]
    assert calls.count(V.STATE) <= most, calls.count(V.STATE)


def test_outliers_and_heavy_tails_do_not_invent_state():
    rng = random.Random("outliers")
    out = [_run(rng, state_pct=0.0, cv=0.02, outliers=0.1).status for _ in range(400)]
    heavy = [_run(rng, state_pct=0.0, cv=0.02, heavy=True).status for _ in range(400)]
    assert out.count(V.STATE) <= 8 and heavy.count(V.STATE) <= 8, (
        out.count(V.STATE), heavy.count(V.STATE))


@pytest.mark.parametrize("state_pct", [20.0, 40.0])
def test_real_state_is_found_and_never_ruled_out(state_pct):
    rng = random.Random(f"state/{state_pct}")
    calls = [_run(rng, state_pct=state_pct, cv=0.02, was=19.0).status for _ in range(400)]
    assert calls.count(V.NO_STATE) == 0
    assert calls.count(V.STATE) >= 390, calls.count(V.STATE)


def test_ruling_state_out_against_the_change_being_chased():
    """A commit made it +40% slower, state is nothing: ruled out once under half the change;
    but a state that is half the change or more is never ruled out."""
    rng = random.Random("chase")
    none = [_run(rng, state_pct=0.0, cv=0.02, then=19.0 / 1.4).status for _ in range(400)]
    assert none.count(V.NO_STATE) >= 390 and V.STATE not in none, none.count(V.NO_STATE)
    # a state of +20% on a commit's +20%: half of the change is state
    half = [_run(rng, state_pct=20.0, cv=0.02, then=19.0 / 1.2).status for _ in range(400)]
    assert half.count(V.NO_STATE) == 0


def test_without_a_level_then_a_single_lifetime_is_undecided_rather_than_wrong():
    """No level then: "ruled out" needs +-4%, out of reach of one lifetime in 2% noise."""
    rng = random.Random("no-level")
    calls = [_run(rng, state_pct=0.0, cv=0.02).status for _ in range(200)]
    assert calls.count(V.STATE) <= 1
    assert calls.count(V.UNDECIDED) + calls.count(V.NO_STATE) >= 199


def test_the_answer_says_what_state_leaves_against_a_stated_level():
    v = V.decide(27.1, [19.0, 19.3, 18.8, 19.1], MIN_EFFECT, math.log(27.1 / 19.0))
    assert v.status == V.STATE
    doc = V.answer(v, "verify_ms", "ms", uptime="3 d 4 h", restarted=True, was=19.0,
                   min_effect_pct=None, observations=["resident memory 900 MiB against"
                                                      " 300 MiB after the same bench fresh"])
    assert doc["sentence"].startswith("the running server (up 3 d 4 h) measures verify_ms"
                                      " 27.1 ms; a fresh restart of the same command on the"
                                      " same node measures 19.05 ms (4 restarts): the slowdown"
                                      " is state inside the long-running server (+42.")
    assert "state explains the change" in doc["sentence"] and doc["explains"]
    assert doc["causes"][0]["kind"] == "state" and doc["status"] == "explained"
    untested = V.answer(V.decide(27.1, [], MIN_EFFECT), "verify_ms", "ms", uptime="2 h 1 min",
                        restarted=False, was=19.0, min_effect_pct=None)
    assert "server state was not tested" in untested["sentence"]
    assert not untested["explains"] and not untested["causes"]
