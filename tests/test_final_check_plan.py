"""The final check's budget, planned from the noise the run measured
(`orchestrator/commands/final_check.py: plan`): as many restarts as the remainder's interval
needs to reach the min effect, at most the cap; past it, the resolution the cap can reach,
said up front and stated in the answer."""

from __future__ import annotations

import math

import pytest

from orchestrator.answer.combine import LogChange
from orchestrator.commands.final_check import plan


def _answer(sigma: float, n: tuple[int, int], bound: float = 4.0, rest: float = 0.0) -> dict:
    se = sigma * math.sqrt(1 / n[0] + 1 / n[1])
    return {"total": {**LogChange(math.log(1.3), se, 10).to_json(), "n": list(n)},
            "unexplained": {"log": [rest, se, 10]}, "min_effect": {"pct": bound},
            "causes": []}


def test_both_endpoints_now_the_plan_is_the_rounds_the_noise_needs():
    """3% restart noise, two restarts a side in the window: the half-width 1.96 x 3% is past
    4%; three more rounds (six restarts) bring it to 1.96 x 0.03 x sqrt(2/5) = 3.7%."""
    got = plan([], _answer(0.03, (2, 2)), "verify_ms", cap=48, spent=4, window=True)
    assert got["needed"] == 6 and got["budget"] == 10 and "resolution" not in got
    assert "about 6 more restarts resolve the remainder to the 4.0% min effect" in got["line"]
    assert "3.0% a restart" in got["line"]


def test_a_reference_whose_noise_no_restart_now_can_beat_gets_the_resolution_said():
    """5% noise and a three-restart reference: however often now is measured, the half-width
    stays above 1.96 x 5% / sqrt(3) = 5.7%; the plan says what its 48 restarts reach."""
    got = plan([], _answer(0.05, (3, 4)), "verify_ms", cap=48, spent=0, window=False)
    assert got["needed"] is None and got["budget"] == 48
    reach = 100 * math.expm1(1.959964 * 0.05 * math.sqrt(1 / 3 + 1 / 52))
    assert got["resolution"]["pct"] == pytest.approx(reach, abs=0.01)
    assert got["resolution"]["sigma_pct"] == pytest.approx(5.0, abs=0.01)
    assert f"can resolve the remainder to +-{reach:.1f}% only" in got["line"]


def test_an_estimate_off_zero_asks_for_a_narrower_interval_and_a_fixed_budget_is_kept():
    near = plan([], _answer(0.03, (2, 2), rest=math.log(1.02)), "verify_ms", cap=48, spent=4,
                window=True)
    centred = plan([], _answer(0.03, (2, 2)), "verify_ms", cap=48, spent=4, window=True)
    assert near["needed"] > centred["needed"]
    fixed = plan([], _answer(0.03, (2, 2)), "verify_ms", cap=12, spent=4, window=True,
                 fixed=True)
    assert fixed["budget"] == 12
