"""The isolate strategy's verdict: named causes with effects, intervals and probabilities.

Effects are measured against the two configurations a user knows: ``effect_pct`` is the change
from applying the cause alone to the good configuration, ``remove_effect_pct`` the change from
taking it out of the bad one (negated, so a cause reads positive both ways on a latency). A pair
also carries its interaction, ``y(ij) - y(i) - y(j) + y(good)`` on the log scale: the part of the
joint effect that neither member has alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from orchestrator.strategies.base import (
    Verdict,
    interval_text,
    pct_text,
    probability_relation,
    probability_text,
)
from orchestrator.strategies.isolate.plan import CONFIRMED, NEEDS_PARTNER, SINGLE, VERIFYING
from orchestrator.strategies.isolate.stats import PRESENT, Subset

if TYPE_CHECKING:
    from orchestrator.strategies.isolate.state import IsolateState

KINDS = ("single", "interaction", "group")


@dataclass(frozen=True)
class IsolateCulprit:
    """A difference (or pair of differences) that causes part of the change.

    ``kind``: "single" (hurts on its own), "interaction" (the members hurt only together),
    "group" (differences that untestable subsets keep apart; one or more of them is the cause).
    ``probability``: posterior probability of the claims that name it (effect above zero, and for
    an interaction, a positive interaction term). ``verified``: False for a partial answer's
    best guesses that were not tested both ways.
    """

    differences: tuple[int, ...]
    labels: tuple[str, ...]
    kind: str
    probability: float
    effect_pct: float | None = None
    effect_ci: tuple[float, float] | None = None
    remove_effect_pct: float | None = None
    remove_effect_ci: tuple[float, float] | None = None
    interaction_pct: float | None = None
    interaction_ci: tuple[float, float] | None = None
    verified: bool = True
    note: str = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown culprit kind {self.kind!r}")


@dataclass(frozen=True)
class IsolateVerdict(Verdict):
    """:class:`Verdict` plus isolate's answer.

    ``culprits``: the named causes. ``cleared``: differences judged harmless (together they move
    the metric by less than ``tolerance_pct`` from either end). ``probability``: of the whole
    answer (every cause real, nothing else needed), to compare with ``confidence``.
    ``residual_pct``/``residual_ci``: bad without the named causes against good.
    """

    culprits: list[IsolateCulprit] = field(default_factory=list)  # type: ignore[assignment]
    cleared: list[int] = field(default_factory=list)
    probability: float = 0.0
    tolerance_pct: float | None = None
    residual_pct: float | None = None
    residual_ci: tuple[float, float] | None = None


_PHASE_STATUS = {"reproduce": "reproducing", "search": "searching", "verify": "verifying"}


def _interval(strategy: IsolateState, weights: dict[Subset, float]
              ) -> tuple[float | None, tuple[float, float] | None]:
    """A contrast as a percentage change of the metric, with its interval (None: unmeasured)."""
    contrast = strategy.evidence.contrast(weights)
    if contrast is None:
        return None, None
    lo, hi = contrast.interval(strategy.settings.interval_confidence)
    ci = strategy.evidence.ci_pct(lo, hi) if math.isfinite(lo) and math.isfinite(hi) else None
    return strategy.evidence.to_pct(contrast.estimate), ci


def _record(strategy: IsolateState, members: Subset, kind: str,
            claims: list[dict[Subset, float]], verified: bool, note: str,
            interaction: dict[Subset, float] | None = None) -> IsolateCulprit:
    probability = math.prod(strategy.claim_probability(PRESENT, w) for w in claims)
    effect, effect_ci = _interval(strategy, strategy.add_weights(members))
    removed, removed_ci = _interval(strategy, strategy.remove_weights(members))
    if strategy.untestable(members):  # cannot be applied alone: its removal is its effect
        effect, effect_ci = removed, removed_ci
    inter, inter_ci = (None, None)
    if interaction is not None:
        inter, inter_ci = _interval(strategy, interaction)
    ordered = tuple(sorted(members))
    return IsolateCulprit(
        differences=ordered,
        labels=tuple(strategy.labels[i] for i in ordered),
        kind=kind,
        probability=probability,
        effect_pct=effect,
        effect_ci=effect_ci,
        remove_effect_pct=removed,
        remove_effect_ci=removed_ci,
        interaction_pct=inter,
        interaction_ci=inter_ci,
        verified=verified,
        note=note,
    )


def culprits_of(strategy: IsolateState, include_guesses: bool) -> list[IsolateCulprit]:
    """Confirmed causes, and with ``include_guesses`` the ones still under test."""
    result: list[IsolateCulprit] = []
    for suspect in strategy.suspects:
        members = suspect.members
        kind = "single" if len(members) == 1 else "group"
        if suspect.state == SINGLE or (include_guesses and suspect.state == VERIFYING):
            claims = strategy.claims_for_single(members)
            result.append(_record(strategy, members, kind, claims, suspect.state == SINGLE,
                                  suspect.note))
    for pair in strategy.pairs:
        if pair.state == CONFIRMED or (include_guesses and pair.state == VERIFYING):
            inter = strategy.interaction_weights(pair)
            claims = [strategy.add_weights(pair.members), inter]
            result.append(_record(strategy, pair.members, "interaction", claims,
                                  pair.state == CONFIRMED, pair.note, interaction=inter))
    if include_guesses:
        for suspect in strategy.suspects:
            if suspect.state == NEEDS_PARTNER and not any(
                p.first == suspect.members for p in strategy.pairs
            ):
                claims = [strategy.remove_weights(suspect.members)]
                kind = "single" if len(suspect.members) == 1 else "group"
                result.append(_record(strategy, suspect.members, kind, claims, False,
                                      "hurts only with a partner that was not found yet"))
        listed = {c.differences for c in result}
        result.extend(g for g in _chain_guesses(strategy) if g.differences not in listed)
    return sorted(result, key=lambda c: -c.probability)


def _chain_guesses(strategy: IsolateState) -> list[IsolateCulprit]:
    """The most probable next cause of every chain still searching."""
    guesses = []
    for chain in strategy.chains:
        if chain.finished or not chain.bisect.evidence.n_trials:
            continue
        posterior = chain.current().posterior
        if not posterior or max(posterior) <= 0.0:
            continue
        point = max(range(len(posterior)), key=posterior.__getitem__)
        if point == 0:
            continue
        member = chain.order[point - 1]
        ordered = (member,)
        guesses.append(IsolateCulprit(
            differences=ordered, labels=(strategy.labels[member],),
            kind="single", probability=float(posterior[point]), verified=False,
            note=f"most probable step of the {chain.origin} chain, not tested both ways",
        ))
    return guesses


def remainder_stands(ci: tuple[float, float] | None) -> bool:
    """Does bad without the named causes still differ from good (its interval excludes 0)?"""
    return ci is not None and (ci[0] > 0 or ci[1] < 0)


def _culprit_sentence(culprit: IsolateCulprit) -> str:
    names = " + ".join(culprit.labels)
    if culprit.kind == "interaction":
        text = f"{names} together {pct_text(culprit.effect_pct)}{interval_text(culprit.effect_ci)}, " \
            f"interaction {pct_text(culprit.interaction_pct)}{interval_text(culprit.interaction_ci)}"
    elif culprit.kind == "group":
        text = f"one or more of {names} {pct_text(culprit.effect_pct)}{interval_text(culprit.effect_ci)}"
    else:
        text = f"{names} {pct_text(culprit.effect_pct)}{interval_text(culprit.effect_ci)}"
    text += f" (P {probability_relation(culprit.probability)}"
    text += ")" if culprit.verified else ", not verified)"
    return text


def describe(strategy: IsolateState) -> IsolateVerdict:
    ev = strategy.evidence
    total_pct, total_ci = _interval(strategy, {strategy.bad: 1.0, strategy.good: -1.0})
    status = strategy.terminal_status()
    done = status is not None
    named = strategy.named()
    residual_pct, residual_ci = (None, None)
    if strategy.reproduced and named != strategy.bad:
        rest = strategy.bad - named
        residual_pct, residual_ci = _interval(strategy, {rest: 1.0, strategy.good: -1.0})
    common = {
        "n_trials": ev.n_trials,
        "confidence": strategy.confidence,
        "total_effect_pct": total_pct,
        "total_effect_ci": total_ci,
        "tolerance_pct": strategy.log_to_pct(strategy.tolerance()),
        "residual_pct": residual_pct,
        "residual_ci": residual_ci,
    }
    change = f"{pct_text(total_pct)}{interval_text(total_ci)}"
    if status in ("not_reproducible", "reversed"):
        message = {
            "not_reproducible": f"Good and bad measure alike (change {change}): the slowdown "
            "is not reproduced by these differences.",
            "reversed": f"The bad configuration measures better than the good one (change "
            f"{change} on a metric expected to {strategy.direction}).",
        }[status]
        return IsolateVerdict(done=True, status=status, message=message, **common)

    found = status == "found"
    culprits = culprits_of(strategy, include_guesses=not found)
    probability = math.prod(strategy.claim_probabilities()) if strategy.reproduced else 0.0
    cleared = sorted(strategy.bad - named) if found else []
    sentences = "; ".join(_culprit_sentence(c) for c in culprits)
    if found:
        lead = "Found 1 cause" if len(culprits) == 1 else f"Found {len(culprits)} causes"
        message = f"{lead} of the {change} change: {sentences}. "
        if cleared and remainder_stands(residual_ci):
            # Not "cleared": the rest of bad still differs from good, and no named cause
            # accounts for it (a remainder of the other differences together, or of the named
            # causes acting differently in bad than alone).
            message += f"The other {len(cleared)} differences were not named one by one, but " \
                f"without the named causes bad still measures {pct_text(residual_pct)}" \
                f"{interval_text(residual_ci)} from good: that remainder is unexplained."
        elif cleared:
            message += f"The other {len(cleared)} differences are cleared: without the named " \
                f"causes bad measures {pct_text(residual_pct)}{interval_text(residual_ci)} from good."
        message += f" Probability of this answer {probability_text(probability)}."
    elif status == "inconclusive":
        message = f"Inconclusive after {ev.n_trials} trials: {strategy.note or 'no answer'}."
        if sentences:
            message += f" Best answer so far: {sentences}."
    elif status == "budget_exhausted":
        message = f"Trial budget of {strategy.max_trials} spent before reaching " \
            f"{strategy.confidence:.2f} (change {change})."
        message += f" Partial answer: {sentences}." if sentences else " No cause named yet."
    else:
        phase = "reproduce" if not strategy.reproduced else (
            "search" if any(not c.finished for c in strategy.chains) else "verify"
        )
        status = _PHASE_STATUS[phase]
        message = f"{status.capitalize()} after {ev.n_trials} trials (change so far {change})."
        if sentences:
            message += f" So far: {sentences}."
    return IsolateVerdict(
        done=done,
        status=status,
        culprits=culprits,
        cleared=cleared,
        probability=probability if found or status == "inconclusive" else 0.0,
        message=message,
        **common,
    )
