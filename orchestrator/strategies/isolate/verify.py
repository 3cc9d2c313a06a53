"""Verification transitions of the isolate strategy: suspects tested both ways, pairs.

A suspect (what a chain pointed at) is measured added alone to good and removed alone from bad,
interleaved. It becomes:

* a **single** cause when adding it alone hurts;
* a member of a **pair** that only hurts together when removing it restores much of the change
  but adding it alone does much less: its partner is among the differences that were present
  where it was seen to hurt (its context), and a partner chain looks for it there;
* **dismissed** when neither direction shows an effect worth naming.

All these decisions are made at ``route_confidence``: a wrong turn costs trials, not
correctness, because the answer's claims are tested together at ``confidence`` before it is
given. Wrong turns are undone on fresh trials: a named cause whose claim the later evidence
refutes, a suspect whose partner search shows its context adds nothing, and a dismissed
difference that a new search points at again all go back to verification. A cause is claimed
with the spike-and-slab posterior; the comparisons that only pick the next test ("much smaller
than", "below the tolerance") use flat-prior t posteriors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.strategies.isolate.plan import (
    CONFIRMED,
    DISMISSED,
    NEEDS_PARTNER,
    SINGLE,
    VERIFYING,
    Pair,
    Suspect,
)
from orchestrator.strategies.isolate.stats import ABSENT, PRESENT, Subset, posterior_present

if TYPE_CHECKING:
    from orchestrator.strategies.isolate.settings import Weights
    from orchestrator.strategies.isolate.state import IsolateState


def add_suspect(
    strategy: IsolateState, members: Subset, context: tuple[int, ...], origin: str
) -> None:
    """Queue differences for verification, unless they are already known or named. One that
    was dismissed and is pointed at again by a new search is verified again, on fresh trials."""
    if members <= strategy.named():
        return
    context = tuple(c for c in context if c not in members)
    for suspect in strategy.suspects:
        if suspect.members == members:
            if suspect.state == DISMISSED:
                suspect.context = context
                reverify(strategy, suspect, "found again by another search")
            return
    strategy.suspects.append(Suspect(members, context, origin))


def reverify(strategy: IsolateState, suspect: Suspect, why: str) -> None:
    """Send a suspect back to verification; its next decision waits for fresh trials, or the
    same data would only repeat the same turn."""
    sides = (suspect.members, strategy.bad - suspect.members)
    suspect.fresh_from = max(strategy.evidence.count(s) for s in sides)
    suspect.state, suspect.note = VERIFYING, f"{why}: verified again"


def add_pair(strategy: IsolateState, owner: Suspect, found: Subset) -> None:
    """A partner chain found ``found``: pair it with its owner. Even a difference already named
    as a cause on its own may be the partner; the interaction contrast decides."""
    if any(p.members == owner.members | found for p in strategy.pairs):
        return
    strategy.pairs.append(Pair(owner.members, found))


def seek_partner(strategy: IsolateState, suspect: Suspect) -> None:
    """Start (or restart) the partner search of a suspect that hurts only in a context.

    Differences of the context already shown not to be its partner go into the chain's base, so
    the chain's step is the partner's, not theirs; so do other known causes, unless nothing would
    be left to search (a difference named as a cause may still be the partner)."""
    suspect.state = NEEDS_PARTNER
    known = set(suspect.not_partners)
    for other in strategy.suspects:
        if other is not suspect and other.state in (VERIFYING, SINGLE):
            known |= other.members
    base = suspect.members | frozenset(c for c in suspect.context if c in known)
    if base >= suspect.members | frozenset(suspect.context):
        base = suspect.members | frozenset(c for c in suspect.context if c in suspect.not_partners)
    rest = [c for c in suspect.context if c not in base]
    index = strategy.suspects.index(suspect)
    if not any(strategy.start_chain(base, order, "partner", owner=index)
               for order in strategy.search_orders(rest)):
        suspect.state = DISMISSED
        suspect.note = "hurts only in a context, but there is no partner left to search"


def partner_not_found(strategy: IsolateState, owner: Suspect) -> None:
    """A partner chain ended empty: search in another order, or give up on its owner."""
    owner_index = strategy.suspects.index(owner)
    still_looking = any(c.owner == owner_index and not c.finished for c in strategy.chains)
    if owner.state == NEEDS_PARTNER and not still_looking:
        seek_partner(strategy, owner)
        if owner.state == DISMISSED:
            owner.note = "hurts only in a context, but no single partner was found"


def _ready(strategy: IsolateState, *tested: Subset, offset: int = 0) -> bool:
    need = offset + strategy.settings.verify_min_per_side
    return all(strategy.evidence.count(s) >= need for s in tested)


def _capped(strategy: IsolateState, *tested: Subset, offset: int = 0) -> bool:
    cap = offset + strategy.settings.verify_max_per_side
    return any(strategy.evidence.count(s) >= cap for s in tested)


def _route_present(strategy: IsolateState, weights: Weights) -> bool:
    contrast = strategy.evidence.contrast(weights)
    return contrast is not None and \
        contrast.prob_above(0.0) >= strategy.settings.route_confidence


def _route_below(strategy: IsolateState, weights: Weights, threshold: float) -> bool:
    contrast = strategy.evidence.contrast(weights)
    return contrast is not None and \
        contrast.prob_below(threshold) >= strategy.settings.route_confidence


def _much_smaller(strategy: IsolateState, small: Weights, large: Weights) -> bool:
    """Is ``small`` below half of ``large`` (and below at least the tolerance)?"""
    big = strategy.evidence.contrast(large)
    if big is None:
        return False
    return _route_below(strategy, small, max(strategy.tolerance(), big.estimate / 2.0))


def _claim(strategy: IsolateState, weights: Weights) -> float:
    """Spike-and-slab probability that the effect is real (0 when unmeasured)."""
    contrast = strategy.evidence.contrast(weights)
    return 0.0 if contrast is None else posterior_present(contrast, strategy.prior())


def _claim_present(strategy: IsolateState, weights: Weights) -> bool:
    return _claim(strategy, weights) >= strategy.settings.route_confidence


def _claim_refuted(strategy: IsolateState, weights: Weights) -> bool:
    return _claim(strategy, weights) <= 1.0 - strategy.settings.route_confidence


def verify_suspect(strategy: IsolateState, suspect: Suspect) -> bool:
    """Advance one suspect (or demote a named cause the evidence turned against); True when
    its state changed."""
    members = suspect.members
    if suspect.state == SINGLE:
        claims = strategy.claims_for_single(members)
        if any(_claim_refuted(strategy, w) for w in claims):
            reverify(strategy, suspect, "its effect did not hold up")
            return True
        capped = all(strategy.evidence.count(s) >= strategy.settings.final_max_per_subset
                     for w in claims for s in w if s not in (strategy.good, strategy.bad))
        if capped and any(_claim(strategy, w) < 0.5 for w in claims):
            suspect.state = DISMISSED
            suspect.note = "its effect was not shown within the trial cap"
            return True
        return False
    add, remove = strategy.add_weights(members), strategy.remove_weights(members)
    without = strategy.bad - members
    tol = strategy.tolerance()
    if strategy.untestable(members):
        decision = strategy.decision(remove, without, strategy.settings.verify_max_per_side)
        if decision is None:
            return False
        if decision not in (PRESENT, ABSENT):
            suspect.state, suspect.note = DISMISSED, "could be tested neither way"
            return True
        suspect.state = SINGLE if decision == PRESENT else DISMISSED
        suspect.note = "could not be applied alone; judged by removing it from bad"
        return True
    removable = not strategy.untestable(without)
    offset = suspect.fresh_from
    if not _ready(strategy, members, offset=offset) or (
        removable and not _ready(strategy, without, offset=offset)
    ):
        return False
    if _claim_present(strategy, add):
        suspect.state = SINGLE
        if removable and _route_below(strategy, remove, tol):
            suspect.note = "removing it alone from bad does not restore: another difference " \
                "has the same effect"
        return True
    if removable and _route_present(strategy, remove) and _much_smaller(strategy, add, remove):
        seek_partner(strategy, suspect)
        return True
    if _route_below(strategy, add, tol) and (not removable or _route_below(strategy, remove, tol)):
        suspect.state, suspect.note = DISMISSED, "harmless in both directions"
        return True
    if _capped(strategy, members, without, offset=offset):
        _force_suspect(strategy, suspect)
        return True
    return False


def _force_suspect(strategy: IsolateState, suspect: Suspect) -> None:
    """At the cap, the estimates route the suspect (its claims keep their probability)."""
    half = strategy.tolerance() / 2.0
    add_c = strategy.evidence.contrast(strategy.add_weights(suspect.members))
    remove_c = strategy.evidence.contrast(strategy.remove_weights(suspect.members))
    if add_c is not None and add_c.estimate >= half:
        suspect.state = SINGLE
    elif remove_c is not None and remove_c.estimate >= half:
        seek_partner(strategy, suspect)
    else:
        suspect.state, suspect.note = DISMISSED, "no effect shown within the trial cap"


def _owner(strategy: IsolateState, pair: Pair) -> Suspect | None:
    for suspect in strategy.suspects:
        if suspect.members == pair.first and suspect.state == NEEDS_PARTNER:
            return suspect
    return None


def verify_pair(strategy: IsolateState, pair: Pair) -> bool:
    """Advance one pair (or demote a confirmed one the evidence turned against); True when its
    state changed."""
    joint, interaction = strategy.add_weights(pair.members), strategy.interaction_weights(pair)
    if pair.state == CONFIRMED:
        if _claim_refuted(strategy, joint) or _claim_refuted(strategy, interaction):
            pair.state, pair.note = VERIFYING, "re-verified: the interaction did not hold up"
            return True
        return False
    owner = _owner(strategy, pair)
    if strategy.untestable(pair.members) or strategy.untestable(pair.second):
        pair.state, pair.note = DISMISSED, "the pair could not be applied to good"
        if owner is not None:
            owner.state, owner.note = DISMISSED, "its pair could not be applied to good"
        return True
    if not _ready(strategy, pair.first, pair.second, pair.members):
        return False
    if _claim_present(strategy, joint) and _claim_present(strategy, interaction):
        pair.state = CONFIRMED
    elif _route_below(strategy, joint, strategy.tolerance()):
        pair.state, pair.note = DISMISSED, "applying both to good does not reproduce"
        if owner is not None:
            owner.state, owner.note = DISMISSED, "hurts only in a context larger than one partner"
    elif _route_present(strategy, joint) and _much_smaller(strategy, interaction, joint):
        pair.state, pair.note = DISMISSED, "the partner hurts on its own"
        add_suspect(strategy, pair.second, (), "partner")
        if owner is not None:
            owner.not_partners |= pair.second
            seek_partner(strategy, owner)
    elif _capped(strategy, pair.members, pair.second):
        joint_c = strategy.evidence.contrast(joint)
        inter_c = strategy.evidence.contrast(interaction)
        half = strategy.tolerance() / 2.0
        if joint_c is not None and inter_c is not None and min(
            joint_c.estimate, inter_c.estimate
        ) >= half:
            pair.state = CONFIRMED
        else:
            pair.state, pair.note = DISMISSED, "no interaction shown within the trial cap"
            if owner is not None:
                owner.state, owner.note = DISMISSED, "no partner confirmed within the trial cap"
    else:
        return False
    return True
