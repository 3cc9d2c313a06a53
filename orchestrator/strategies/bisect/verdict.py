"""Turn the bisection state into a :class:`Verdict` with sentences a human can act on.

Every culprit is stated with its step against the parent(s) it was verified against and that
step's interval; what the named steps leave of the endpoints' change is stated too, on each
side, with its interval (so that no step is ever said to explain more than the intervals
allow); outlier restarts, a withdrawn reproduction, an early stop and a system change are said
in plain words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from orchestrator.strategies.base import (
    Culprit,
    Outlier,
    Unexplained,
    Verdict,
    interval_text,
    pct_text,
    probability_relation,
    probability_text,
)

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.plan import Stage
    from orchestrator.strategies.bisect.state import BisectState

NOT_REPRODUCIBLE_MESSAGE = (
    "the good commit now measures like the bad one: the cause is probably outside this commit "
    "range; compare against a reference run"
)

_PHASE_STATUS = {"reproduce": "reproducing", "search": "searching", "verify": "verifying",
                 "measure": "searching"}


def chased_change_pct(strategy: BisectState) -> float | None:
    """The change from a stated good level (a reference run's or ``was=``) to the bad
    endpoint now, in percent: what a range that does not reproduce was measured against."""
    if strategy.reference_value is None or strategy.min_effect is not None:
        return None
    floor = strategy.effective_min_effect()
    if floor is None:
        return None
    return 100.0 * float(np.expm1(strategy.sign * 2.0 * floor))


def chased_ruled_out(strategy: BisectState) -> bool:
    """The range was found not to reproduce because its change is confidently (at the
    reproduce check's level) under half of the change being chased: it does not hold the
    regression."""
    return strategy.outcome == "not_reproducible" and strategy.chase_ruled_out


def _culprit_sentence(culprit: Culprit, direction_word: str | None = None) -> str:
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
    against = "its parent"
    if culprit.parents:
        names = " and ".join(f"point {p}" for p in culprit.parents)
        against = f"its parent{'s' if len(culprit.parents) > 1 else ''} ({names})"
    sentence = f"{where}; against {against} it changes the metric by " \
        f"{pct_text(culprit.effect_pct)}{interval_text(culprit.effect_ci)}"
    if direction_word:
        sentence += f" ({direction_word})"
    share = culprit.explained_ci
    if (culprit.explained is not None and share is not None and np.isfinite(culprit.explained)
            and 0.0 < share[0] and share[1] <= 1.5):
        sentence += (f", {100.0 * culprit.explained:.0f}% "
                     f"[{100.0 * share[0]:.0f}, {min(100.0 * share[1], 150.0):.0f}] "
                     "of the endpoints' change")
    if culprit.latest_effect_pct is not None:
        sentence += (f"; on the system as it is now: {pct_text(culprit.latest_effect_pct)}"
                     f"{interval_text(culprit.latest_effect_ci)}")
    return sentence


def _best_guess(strategy: BisectState, stage: Stage | None) -> Culprit | None:
    if strategy.reproduction is None or stage is None:
        return None
    from orchestrator.strategies.bisect.verify import best_block

    members, mass = best_block(strategy, stage)
    linear = strategy.history.linear
    return Culprit(point=members[-1], probability=mass,
                   range=(members[0] - 1, members[-1]) if linear and len(members) > 1 else None)


def _posterior_vector(strategy: BisectState) -> list[float]:
    """The posterior of the stage searching now; once a later stage has nothing to search,
    that of the last stage that found a culprit (the one the answer rests on)."""
    vector = np.zeros(strategy.n)
    stage = strategy.current()
    found = strategy.found()
    if found and (stage is None or (stage.index > 0 and strategy.phase(stage) == "measure")):
        stage = found[-1]
    if stage is not None and strategy.reproduction is not None:
        post = strategy.stage_posterior(stage)
        vector[post.hyps] = post.mass
    return vector.tolist()


def _spread(strategy: BisectState, stage: Stage) -> Unexplained | None:
    """Where a stage that gave up holds most of its posterior, and how large that part is."""
    post = strategy.stage_posterior(stage)
    total = float(post.mass.sum())
    if total <= 0:
        return None
    order = np.argsort(-post.mass, kind="stable")
    top = order[: int(np.searchsorted(np.cumsum(post.mass[order]) / total, 0.9)) + 1]
    cands = tuple(sorted(int(h) for h in post.hyps[top]))
    lo, hi = cands[0] - 1, cands[-1]
    for rem in strategy.remainders():
        inside = all(strategy.history.descends(rem.hi, h)
                     and not strategy.history.descends(rem.lo, h) for h in cands)
        if inside:
            ev = strategy.evidence
            if strategy.history.linear:
                return Unexplained(lo, hi, ev.to_pct(rem.diff.diff),
                                   ev.ci_pct(rem.diff.lo, rem.diff.hi), rem.flagged, "spread",
                                   cands[:8])
            return Unexplained(rem.lo, rem.hi, ev.to_pct(rem.diff.diff),
                               ev.ci_pct(rem.diff.lo, rem.diff.hi), rem.flagged, "spread",
                               cands[:8])
    return None


def unexplained_parts(strategy: BisectState) -> list[Unexplained]:
    """The remainders and the spread parts; and, when the whole change the named steps leave
    excludes zero while no one part of it does (two small steps on either side of a culprit,
    or one whose part is measured less than the endpoints), that whole as a part of kind
    "total": the answer then says that part of the change is unexplained and how large,
    instead of only that each part alone is not distinguishable from no change."""
    from orchestrator.strategies.bisect.later import negligible_part, run_min_effect
    from orchestrator.strategies.bisect.remainders import unexplained_total

    ev = strategy.evidence
    # A part within the run's min effect is what the end rule stopped measuring: never called
    # unexplained (the answer's rule too), even where its interval clears zero.
    floor = run_min_effect(strategy)
    parts = [Unexplained(r.lo, r.hi, ev.to_pct(r.diff.diff), ev.ci_pct(r.diff.lo, r.diff.hi),
                         r.flagged and not negligible_part(r, floor))
             for r in strategy.remainders()]
    for stage in strategy.stages:
        if stage.outcome == "spread":
            spread = _spread(strategy, stage)
            if spread is not None:
                parts.append(spread)
    if not any(p.flagged for p in parts):
        whole = unexplained_total(strategy, strategy.settings.verify_confidence)
        if whole is not None and whole.flagged and not negligible_part(whole, floor):
            parts.append(Unexplained(whole.lo, whole.hi, ev.to_pct(whole.diff.diff),
                                     ev.ci_pct(whole.diff.lo, whole.diff.hi), True, "total"))
    return parts


def _open_bound(part: Unexplained) -> str:
    """What a part not distinguishable from no change may still hold, in the reader's terms:
    "a further step of up to +9.6% may lie between points 11 and 255". The interval says it
    too, but a reader who fixed the step named and is still slow asks exactly this."""
    if part.effect_ci is None:
        return ""
    lo, hi = part.effect_ci
    sizes = []
    if hi > 0.0:
        sizes.append(f"up to {pct_text(hi)}")
    if lo < 0.0:
        sizes.append(f"down to {pct_text(lo)}")
    if not sizes:
        return ""
    return f"a further step of {' or '.join(sizes)} may lie between points {part.lo} and {part.hi}"


def _parts_sentence(parts: list[Unexplained], culprits: list[Culprit]) -> str:
    if not culprits:
        return ""
    spread = [p for p in parts if p.kind == "spread"]
    flagged = [p for p in parts if p.kind == "remainder" and p.flagged]
    quiet = [p for p in parts if p.kind == "remainder" and not p.flagged]
    out = []
    for p in parts:
        if p.kind == "total":
            out.append(f"part of the change is unexplained: {pct_text(p.effect_pct)}"
                       f"{interval_text(p.effect_ci)} beyond the named steps in all, between "
                       f"points {p.lo} and {p.hi}; no one part of the range shows it alone, "
                       "so it is not pinned to a sub-range")
    for p in spread:
        out.append(f"a further change of {pct_text(p.effect_pct)}{interval_text(p.effect_ci)} is spread "
                   f"over points {p.lo + 1}..{p.hi}: no single commit there holds it "
                   f"(likeliest: {', '.join(str(c) for c in p.candidates[:4])})")
    for p in flagged:
        if any(s.lo <= p.lo and p.hi <= s.hi for s in spread):
            continue
        out.append(f"part of the change is unexplained: {pct_text(p.effect_pct)}"
                   f"{interval_text(p.effect_ci)} between points {p.lo} and {p.hi}")
    if quiet:
        rest = ", ".join(f"{pct_text(p.effect_pct)}{interval_text(p.effect_ci)} between points {p.lo} "
                         f"and {p.hi}" for p in quiet)
        lead = "its parts are" if any(p.kind == "total" for p in parts) else "what is left is"
        within = ("" if not any(p.effect_ci and (p.effect_ci[0] > 0 or p.effect_ci[1] < 0)
                                for p in quiet) else ", or within the run's min effect")
        out.append(f"{lead} not distinguishable from no change at this precision{within}"
                   f" ({rest})")
        bounds = [_open_bound(p) for p in quiet]
        bounds = [b for b in bounds if b]
        if bounds:
            out.append("left open: " + "; ".join(bounds) + " (the net change of each part; "
                       "steps inside one part that cancel are not seen)")
    return " ".join(s[0].upper() + s[1:] + "." for s in out)


def _budget_stop(strategy: BisectState) -> bool:
    """The reproduction was withdrawn because the budget (or the forecast against it) ran out
    before it was confirmed, not because the endpoints measured alike."""
    return bool(strategy.stopped_early) or "budget of" in (strategy.note or "")


def _verified_step(strategy: BisectState, stage) -> dict | None:
    """The step the head-to-head of a stage in verification reads now (culprit against its
    first parent), in percent with its interval."""
    pair = stage.verify_pair
    if not pair or len(pair) < 2:
        return None
    ev = strategy.evidence
    step = ev.compare(pair[1], pair[0], 0.95)
    if step is None:
        return None
    ci = ev.ci_pct(step.lo, step.hi) if np.isfinite(step.lo) else None
    return {"point": int(pair[0]), "pct": ev.to_pct(step.diff), "ci": ci}


def describe(strategy: BisectState) -> Verdict:
    ev, cfg = strategy.evidence, strategy.settings
    total_pct = total_ci = None
    total = ev.compare(0, strategy.n - 1, cfg.reproduce_confidence)
    if total is not None:
        total_pct = ev.to_pct(total.diff)
        if np.isfinite(total.lo):
            total_ci = ev.ci_pct(total.lo, total.hi)
    from orchestrator.strategies.bisect.verify import current_culprit

    found = sorted((s for s in strategy.found()), key=lambda s: s.culprit.point)
    culprits = [current_culprit(strategy, s) for s in found]
    status = strategy._terminal_status()
    done = status is not None
    notes = []
    if strategy.retracted:
        notes.append(f"retracted: {strategy.retracted}")
    if strategy.stopped_early and not strategy.retracted:
        notes.append(f"stopped early: {strategy.stopped_early}")
    epochs = ev.epochs_seen
    if len(epochs) > 1:
        first = ev.first_trial_of_epoch(epochs[-1])
        notes.append(f"the node's system changed during the run (trials from {first} on measure "
                     "the new system): commits are compared within one system, and every named "
                     "culprit is verified on the system as it is now")
    flagged = ev.flagged()
    if flagged:
        kinds = sum(f.status == "outlier" for f in flagged)
        notes.append(f"{len(flagged)} restart(s) left out of the likelihood as outliers "
                     f"({kinds} disagreeing with their commit's other restarts, "
                     f"{len(flagged) - kinds} far outside every level and not replicated)")
    parts = unexplained_parts(strategy) if found else []
    sigma = ev.sigma()
    total_log = None
    if total is not None and np.isfinite(total.se) and total.df > 0:
        total_log = (strategy.sign * float(total.diff), float(total.se), float(total.df))
    common = {
        "n_trials": ev.n_trials,
        "confidence": cfg.confidence,
        "total_effect_pct": total_pct,
        "total_effect_ci": total_ci,
        "posterior": _posterior_vector(strategy),
        "expected_remaining": strategy.expected_remaining(),
        "unexplained": parts,
        "outliers": [Outlier(f.trial_id, f.point, f.status, f.ratio) for f in flagged],
        "notes": notes,
        "budget": strategy.budget,
        "noise_pct": (100.0 * float(np.expm1(sigma)) if np.isfinite(sigma) and sigma > 0
                      else None),
        "total_log": total_log,
    }
    change = f"{pct_text(total_pct)}{interval_text(total_ci)}" if total_pct is not None else "unmeasured"
    if status in ("not_reproducible", "reversed", "inconclusive"):
        if status == "not_reproducible":
            message = f"{NOT_REPRODUCIBLE_MESSAGE} (endpoint change {change})."
            if strategy.retracted and _budget_stop(strategy):
                # Withdrawn at the budget, not measured alike: the change may be real and
                # too small for the restarts the budget allows (a +8% step in 5% noise under
                # a load step), so the range is not said to be clear of it.
                message = (f"Undecided: the endpoints' change ({change}) was not confirmed"
                           " beyond the luck of repeated looks within the budget; whether"
                           " this range holds it is not decided (max_trials=N, a quieter"
                           " node or more repetitions per restart would tell).")
            chased = chased_change_pct(strategy)
            if chased is not None:
                message += (f" The change being chased, from the good level "
                            f"{strategy.reference_value:.4g} to the bad commit now, is "
                            f"{pct_text(chased)}")
                message += (": this range holds less than half of it." if
                            chased_ruled_out(strategy) else ".")
            if strategy.retracted:
                message += f" Retracted: {strategy.retracted}."
        elif status == "reversed":
            message = (
                f"The bad commit measures better than the good one (endpoint change {change} on "
                f"a metric expected to {strategy.direction}): the endpoints look swapped or the "
                "cause is outside this range."
            )
        else:
            message = f"Inconclusive: {strategy.note}."
        return Verdict(done=True, status=status, message=message, **common)

    def word(stage: Stage) -> str | None:
        if stage.index > 0 and stage.sign < 0:
            return "a step the other way: it undoes part of the change"
        return None

    sentences = [_culprit_sentence(c, word(s)) for c, s in zip(culprits, found, strict=True)]
    if status == "budget_exhausted":
        current = strategy.current()
        guess = _best_guess(strategy, current) if current is not None else None
        if guess is not None:
            culprits.append(guess)
        message = f"Trial budget of {strategy.budget} spent before reaching {cfg.confidence:.2f}"
        if strategy.stopped_early:
            message = f"Stopped before the budget of {strategy.budget}: {strategy.stopped_early}"
        if sentences:
            message += "; found: " + "; ".join(sentences)
        message += (f"; best guess for the next: {_culprit_sentence(guess)}." if guess and found
                    else f"; best guess: {_culprit_sentence(guess)}." if guess else ".")
        message += " Raise max_trials to continue."
    elif status == "found":
        lead = "Found" if len(culprits) == 1 else f"Found {len(culprits)} culprits"
        message = f"{lead} (endpoint change {change}): " + "; ".join(sentences) + "."
        extra = _parts_sentence(parts, culprits)
        if extra:
            message += " " + extra
    else:
        current = strategy.current()
        phase = strategy.phase(current) if current is not None else "reproduce"
        status = _PHASE_STATUS[phase]
        guess = _best_guess(strategy, current)
        if phase == "verify" and current is not None:
            common["verifying"] = _verified_step(strategy, current)
        message = f"{status.capitalize()} after {ev.n_trials} trials (endpoint change so far " \
            f"{change})"
        if sentences:
            message += "; found so far: " + "; ".join(sentences)
        if guess is not None and phase != "measure":
            message += f"; most likely {'next ' if found else ''}first bad commit: point " \
                f"{guess.point} (P {probability_relation(guess.probability)})"
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
