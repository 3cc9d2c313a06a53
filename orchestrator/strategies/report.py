"""Turn the bisection state into a :class:`Verdict` with a sentence a human can act on."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from orchestrator.strategies.base import (
    Culprit,
    Verdict,
    probability_relation,
    probability_text,
)

if TYPE_CHECKING:
    from orchestrator.strategies.bisect import BisectStrategy, Segment

NOT_REPRODUCIBLE_MESSAGE = (
    "the good commit now measures like the bad one: the cause is probably outside this commit "
    "range; compare against a reference run"
)

_PHASE_STATUS = {"reproduce": "reproducing", "search": "searching", "verify": "verifying"}


def _pct(value: float) -> str:
    return f"{value:+.1f}%"


def _interval(ci: tuple[float, float] | None) -> str:
    if ci is None:
        return ""
    return f" [{ci[0]:+.1f}%, {ci[1]:+.1f}%]"


def _culprit_sentence(culprit: Culprit) -> str:
    if culprit.range is not None:
        lo, hi = culprit.range
        where = (
            f"the first bad commit is one of points {lo + 1}..{hi} (untestable commits hide "
            f"which) with probability {probability_text(culprit.probability)}"
        )
    else:
        where = f"point {culprit.point} is the first bad commit with probability " \
            f"{probability_text(culprit.probability)}"
    if culprit.effect_pct is None:
        return where
    sentence = f"{where}; against its parent it changes the metric by " \
        f"{_pct(culprit.effect_pct)}{_interval(culprit.effect_ci)}"
    if culprit.explained is not None and np.isfinite(culprit.explained):
        sentence += f", {100.0 * culprit.explained:.0f}% of the change across its range"
    return sentence


def _best_guess(strategy: BisectStrategy, segment: Segment) -> Culprit | None:
    if not segment.reproduced:
        return None
    first, last, mass = strategy.posterior(segment).best_block()
    return Culprit(point=last, probability=mass, range=(first - 1, last) if last > first else None)


def _posterior_vector(strategy: BisectStrategy) -> list[float]:
    vector = np.zeros(strategy.n)
    searched = [s for s in strategy.segments if s.reproduced]
    active = [s for s in searched if s.active]
    chosen = active[0] if active else (searched[-1] if searched else None)
    if chosen is not None:
        post = strategy.posterior(chosen)
        vector[chosen.lo : chosen.hi + 1] = post.mass
    return vector.tolist()


def describe(strategy: BisectStrategy) -> Verdict:
    ev, cfg = strategy.evidence, strategy.settings
    top = strategy.segments[0]
    total_pct = total_ci = None
    total = ev.compare(0, strategy.n - 1, cfg.reproduce_confidence)
    if total is not None:
        total_pct = ev.to_pct(total.diff)
        if np.isfinite(total.lo):
            total_ci = ev.ci_pct(total.lo, total.hi)
    found = sorted(
        (s.culprit for s in strategy.segments if s.outcome == "found" and s.culprit is not None),
        key=lambda c: c.point,
    )
    status = strategy._terminal_status()
    done = status is not None
    common = {
        "n_trials": ev.n_trials,
        "confidence": cfg.confidence,
        "total_effect_pct": total_pct,
        "total_effect_ci": total_ci,
        "posterior": _posterior_vector(strategy),
        "expected_remaining": strategy.expected_remaining(),
    }
    change = f"{_pct(total_pct)}{_interval(total_ci)}" if total_pct is not None else "unmeasured"
    if status in ("not_reproducible", "reversed", "inconclusive"):
        if status == "not_reproducible":
            message = f"{NOT_REPRODUCIBLE_MESSAGE} (endpoint change {change})."
        elif status == "reversed":
            message = (
                f"The bad commit measures better than the good one (endpoint change {change} on "
                f"a metric expected to {strategy.direction}): the endpoints look swapped or the "
                "cause is outside this range."
            )
        else:
            message = f"Inconclusive: {top.note}."
        return Verdict(done=True, status=status, message=message, **common)

    active = [s for s in strategy.segments if s.active]
    culprits = list(found)
    if status == "budget_exhausted":
        guess = _best_guess(strategy, active[0]) if active else None
        if guess is not None:
            culprits.append(guess)
        message = f"Trial budget of {strategy.max_trials} spent before reaching " \
            f"{cfg.confidence:.2f}"
        message += f"; best guess: {_culprit_sentence(guess)}." if guess else "."
    elif status == "found":
        sentences = [_culprit_sentence(c) for c in culprits]
        lead = "Found" if len(culprits) == 1 else f"Found {len(culprits)} culprits"
        message = f"{lead} (endpoint change {change}): " + "; ".join(sentences) + "."
        unexplained = [s for s in strategy.segments if s.note == "partial"]
        if unexplained and len(culprits) == len(unexplained):
            message += " Part of the change could not be attributed to a commit in this range."
    else:
        phase = strategy.phase(active[0])
        status = _PHASE_STATUS[phase]
        guess = _best_guess(strategy, active[0])
        message = f"{status.capitalize()} points {active[0].lo}..{active[0].hi} after " \
            f"{ev.n_trials} trials (endpoint change so far {change})"
        if guess is not None:
            message += f"; most likely first bad commit: point {guess.point} " \
                f"(P {probability_relation(guess.probability)})"
        message += "."
    top_culprit = max(culprits, key=lambda c: c.probability) if culprits else None
    return Verdict(
        done=done,
        status=status,
        culprits=culprits,
        range=top_culprit.range if top_culprit is not None else None,
        message=message,
        **common,
    )
