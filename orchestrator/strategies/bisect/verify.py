"""Verify phase of the bisect strategy: the culprit against its parent(s), head to head.

Once one commit (or a block of commits hidden by untestable ones) holds ``verify_handoff`` of a
stage's posterior, the culprit and its parents are measured interleaved until each side has
``verify_min_per_side`` kept trials (``verify_fresh_per_side`` of them from the head-to-head
itself, interleaved in time) and the posterior holds ``confidence``, and then still holds it
after ``verify_hold_per_side`` further fresh trials a side (the first pass over the confidence
rests on a noise estimate from the same few restarts, and is luck too often to be the promise
the stated probability makes), unless it holds the confidence with sigma at its upper bound
(:func:`stress_mass`: large steps need no hold). The parents are the
real git parents on a graph (both of a merge), the previous testable commit on a chain.

Interleaving makes the head-to-head robust to drift by design (a load step hits both sides),
and so the answer is required to rest on it where the noise is not clean: when the level fit
sees drift, or the node's system changed during the run, the step's interval must exclude zero
in the stage's direction, and after a system change both sides need trials on the system as it
is now (:func:`check_reverified` re-measures a culprit found before the change).

Functions over the live strategy's state
(:class:`~orchestrator.strategies.bisect.state.BisectState`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import numpy as np
from scipy.stats import chi2

from orchestrator.strategies.base import Culprit
from orchestrator.strategies.bisect.plan import Stage

if TYPE_CHECKING:
    from orchestrator.strategies.bisect.state import BisectState


def best_block(strategy: BisectState, stage: Stage) -> tuple[list[int], float]:
    """The likeliest culprit of a stage with the hypotheses it cannot be told apart from
    (untestable commits between them), in order, and their posterior mass."""
    post = strategy.stage_posterior(stage)
    untestable = strategy.evidence.untestable_mask()
    hyps = post.hyps
    if strategy.history.linear:
        # Hypotheses h and h + 1 share a block when point h is untestable.
        joined = np.zeros(hyps.size, dtype=bool)
        joined[1:] = (hyps[1:] == hyps[:-1] + 1) & untestable[hyps[:-1]]
        block = np.cumsum(~joined) - 1
        masses = np.bincount(block, weights=post.mass)
        best = int(np.argmax(masses))
        return hyps[block == best].tolist(), float(masses[best])
    best, mass = post.best()
    return [best], mass


def verify_target(strategy: BisectState, stage: Stage) -> tuple[int, tuple[int, ...], float]:
    """``(culprit, parents, mass)`` for the head-to-head."""
    members, mass = best_block(strategy, stage)
    untestable = strategy.evidence.untestable_mask()
    culprit = members[-1]
    if strategy.history.linear:
        parents = strategy.history.testable_parents(members[0], untestable)
    else:
        parents = tuple(p for p in strategy.history.parents[culprit] if not untestable[p])
        parents = parents or (0,)
    return culprit, parents, mass


def _needs_step(strategy: BisectState) -> bool:
    """Is the noise unclean enough that the head-to-head must show the step by itself?"""
    ev = strategy.evidence
    return ev.drift_weight() > strategy.settings.drift_requires_step or len(ev.epochs_seen) > 1


def step_effect(strategy: BisectState, culprit: int, parent: int, confidence: float):
    return strategy.evidence.compare(parent, culprit, confidence)


def check_verified(strategy: BisectState, stage: Stage) -> bool:
    """Accept the stage's culprit once the posterior holds ``confidence``, the head-to-head
    trials suffice, and both still hold after ``verify_hold_per_side`` more fresh trials a
    side (a fall below starts the count again). True if accepted."""
    if not _ready(strategy, stage):
        stage.held_since = None
        return False
    ev, cfg = strategy.evidence, strategy.settings
    culprit, parents, mass = verify_target(strategy, stage)
    if cfg.verify_hold_per_side > 0:
        if cfg.verify_stress_alpha > 0 and _worth_naming(strategy, culprit, parents[0]) and \
                stress_mass(strategy, stage) >= cfg.confidence:
            return _accept(strategy, stage)
        if stage.held_since is None:
            stage.held_since = ev.n_trials
            return False
        if min(len(ev.values_since(p, stage.held_since)) for p in (culprit, *parents)) < \
                cfg.verify_hold_per_side:
            return False
    return _accept(strategy, stage)


def _worth_naming(strategy: BisectState, culprit: int, parent: int) -> bool:
    """Is the head-to-head's step at least the negligible change? Where the restarts barely
    scatter (a deterministic node, a change of repetition count shifting every later trial by
    a hair) sigma's upper bound is a hair too, and a +0.0% step would pass the stress test:
    such a step waits for the hold's fresh restarts, which measure both sides alike."""
    step = step_effect(strategy, culprit, parent, strategy.settings.verify_confidence)
    return step is not None and abs(step.diff) >= strategy.negligible


def stress_sigma(strategy: BisectState, stage: Stage) -> float | None:
    """The noise as large as the evidence allows: the upper ``1 - verify_stress_alpha`` bound
    of sigma from the posterior's residuals under its likeliest hypothesis (the noise prior
    included, if any), or None while they rest on too few degrees of freedom."""
    post = strategy.stage_posterior(stage)
    if post.resid_df < 2 or not math.isfinite(post.resid_var) or post.resid_var <= 0:
        return None
    df = post.resid_df
    return math.sqrt(df * post.resid_var / float(chi2.ppf(strategy.settings.verify_stress_alpha,
                                                          df)))


def stress_mass(strategy: BisectState, stage: Stage) -> float:
    """The likeliest culprit's posterior mass with the noise fixed at :func:`stress_sigma`.

    The posterior's first pass over the confidence can rest on a noise estimate that the
    reproduce check's early stop selected low; read again with sigma at its upper bound, a
    culprit that still holds the confidence is named at once, without the hold's fresh
    restarts (the seed's +53% in 10% noise); one that does not (a lucky head-to-head, a step
    of one or two noise widths) waits for them as before."""
    sigma = stress_sigma(strategy, stage)
    if sigma is None:
        return 0.0
    members, _ = best_block(strategy, stage)
    post = strategy.stage_posterior(stage, sigma=sigma)
    return float(post.mass[np.isin(post.hyps, members)].sum())


def _ready(strategy: BisectState, stage: Stage) -> bool:
    """Would the culprit be named now: posterior, trial counts, and (where the noise is not
    clean) the step's own interval?"""
    ev, cfg = strategy.evidence, strategy.settings
    culprit, parents, mass = verify_target(strategy, stage)
    if mass < cfg.confidence:
        return False
    sides = (culprit, *parents)
    if min(ev.count(p) for p in sides) < cfg.verify_min_per_side:
        return False
    since = stage.verify_since if stage.verify_pair == (culprit, *parents) else ev.n_trials
    if min(len(ev.values_since(p, since)) for p in sides) < cfg.verify_fresh_per_side:
        return False
    latest = ev.latest_epoch
    if len(ev.epochs_seen) > 1 and min(ev.epoch_count(p, latest) for p in sides) < \
            cfg.verify_min_per_side:
        return False
    step = step_effect(strategy, culprit, parents[0], cfg.verify_confidence)
    if step is None:
        return False
    sign = stage.sign if stage.index > 0 else 1.0
    shown = step.lo > 0.0 if sign > 0 else step.hi < 0.0  # the step's interval clears zero
    return not (_needs_step(strategy) and not shown)


def _accept(strategy: BisectState, stage: Stage) -> bool:
    """Record the stage's culprit with its step and share."""
    ev, cfg = strategy.evidence, strategy.settings
    culprit, parents, mass = verify_target(strategy, stage)
    step = step_effect(strategy, culprit, parents[0], cfg.verify_confidence)
    members, _ = best_block(strategy, stage)
    total = ev.compare(0, strategy.n - 1, cfg.verify_confidence)
    explained = explained_ci = None
    if total is not None and total.diff > 0 and math.isfinite(total.lo) and total.lo > 0:
        explained = step.diff / total.diff
        explained_ci = (step.lo / total.hi, step.hi / total.lo)
    now = latest_step(strategy, culprit, parents[0]) if len(ev.epochs_seen) > 1 else None
    stage.outcome = "found"
    stage.culprit = Culprit(
        point=culprit,
        probability=mass,
        range=(members[0] - 1, culprit) if strategy.history.linear and len(members) > 1 else None,
        effect_pct=ev.to_pct(step.diff),
        effect_ci=ev.ci_pct(step.lo, step.hi),
        explained=explained,
        parents=parents,
        explained_ci=explained_ci,
        latest_effect_pct=now[0] if now else None,
        latest_effect_ci=now[1] if now else None,
    )
    return True


def latest_step(strategy: BisectState, culprit: int, parent: int
                ) -> tuple[float, tuple[float, float]]:
    """The step measured on the system as it is now (the latest epoch's trials only)."""
    ev, cfg = strategy.evidence, strategy.settings
    latest = ev.latest_epoch
    now = ev.epoch_difference(parent, culprit, latest, cfg.verify_confidence)
    return ev.to_pct(now.diff), ev.ci_pct(now.lo, now.hi)


def current_culprit(strategy: BisectState, stage: Stage) -> Culprit:
    """The stage's culprit with its step and share re-read from all the trials so far (trials
    keep arriving after a culprit is accepted: the next stage's, those in flight), so that the
    steps and the remainders of one verdict come from one fit and add up."""
    culprit = stage.culprit
    assert culprit is not None
    ev, cfg = strategy.evidence, strategy.settings
    step = step_effect(strategy, culprit.point, culprit.parents[0], cfg.verify_confidence)
    if step is None:
        return culprit
    total = ev.compare(0, strategy.n - 1, cfg.verify_confidence)
    explained = explained_ci = None
    if total is not None and total.diff > 0 and math.isfinite(total.lo) and total.lo > 0:
        explained = step.diff / total.diff
        explained_ci = (step.lo / total.hi, step.hi / total.lo)
    return dataclasses.replace(culprit, effect_pct=ev.to_pct(step.diff),
                               effect_ci=ev.ci_pct(step.lo, step.hi), explained=explained,
                               explained_ci=explained_ci)


def check_reverified(strategy: BisectState, stage: Stage) -> bool:
    """A culprit found before a system change, measured again on the system as it is now:
    once both sides have ``verify_min_per_side`` trials in the latest epoch, the step there is
    recorded beside the pooled one. True when done."""
    ev, cfg = strategy.evidence, strategy.settings
    culprit = stage.culprit
    assert culprit is not None
    latest = ev.latest_epoch
    sides = (culprit.point, *culprit.parents)
    if min(ev.epoch_count(p, latest) for p in sides) < cfg.verify_min_per_side:
        return False
    parent = culprit.parents[0]
    now_pct, now_ci = latest_step(strategy, culprit.point, parent)
    pooled = step_effect(strategy, culprit.point, parent, cfg.verify_confidence)
    changes = {"latest_effect_pct": now_pct, "latest_effect_ci": now_ci}
    if pooled is not None:
        changes |= {"effect_pct": ev.to_pct(pooled.diff),
                    "effect_ci": ev.ci_pct(pooled.lo, pooled.hi)}
    stage.culprit = dataclasses.replace(culprit, **changes)
    return True
