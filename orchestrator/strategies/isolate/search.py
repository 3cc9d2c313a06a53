"""Search transitions of the isolate strategy: reproduce, prefix chains, and the explain step.

These start and finish the searches; :mod:`.verify` decides what a search pointed at.

* **reproduce**: good against bad, interleaved, until a pooled-variance interval confirms the
  change, shows it reversed, or finds none; a confirmed change starts the first chain.
* **chains**: a prefix chain is one bisection (:class:`BisectStrategy`) over an order of
  differences; what it finds becomes a suspect (or, for a partner search, a pair). A chain that
  gives up still hands over its most probable step, since testing it both ways is cheap.
* **explain**: once nothing is searching or verifying, the named differences must account for
  the whole change both ways; a residual starts a new chain over the unnamed ones, in a new
  order when an earlier search came back empty.

Functions over the live strategy's state
(:class:`~orchestrator.strategies.isolate.state.IsolateState`); they change its plan (chains,
suspects, outcome) and return True when they did.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.stats.min_effect import MIN_EFFECT_FLOOR_PCT
from orchestrator.strategies.bisect import BisectSettings, BisectStrategy
from orchestrator.strategies.isolate.plan import NEEDS_PARTNER, Chain
from orchestrator.strategies.isolate.propose import attribution_wanted, final_wanted
from orchestrator.strategies.isolate.stats import PRESENT, Subset
from orchestrator.strategies.isolate.verify import (
    add_pair,
    add_suspect,
    partner_not_found,
    reverify,
)

if TYPE_CHECKING:
    from orchestrator.strategies.isolate.settings import IsolateSettings
    from orchestrator.strategies.isolate.state import IsolateState


def check_reproduced(strategy: IsolateState) -> bool:
    """Decide reproduction from good and bad's trials; True if it was decided."""
    cfg, ev = strategy.settings, strategy.evidence
    for end, name in ((strategy.good, "good"), (strategy.bad, "bad")):
        if strategy.untestable(end):
            strategy.outcome = "inconclusive"
            strategy.note = f"the {name} configuration could not be measured"
            return True
    counts = min(ev.count(strategy.good), ev.count(strategy.bad))
    if counts < cfg.reproduce_min_per_endpoint:
        return False
    total = strategy.total()
    assert total is not None
    lo, hi = total.interval(cfg.reproduce_confidence)
    small = strategy.min_effect is not None and hi < strategy.min_effect
    if lo > 0.0 and not small:
        strategy.reproduced = True
        start_chain(strategy, strategy.good, tuple(range(strategy.n_differences)), "search")
    elif hi < 0.0 and clearly_reversed(strategy, counts):
        strategy.outcome = "reversed"
    elif small or clearly_alike(strategy, counts) or counts >= cfg.reproduce_max_per_endpoint:
        strategy.outcome = "not_reproducible"
    else:
        return False
    return True


def end_interval(strategy: IsolateState, counts: int) -> tuple[float, float] | None:
    """The endpoints' interval a run may end on ("reversed", or "alike"), None before
    ``end_min_per_endpoint`` trials a side. Ending stops the run with a claim and the interval
    is looked at after every trial, so the ``k``-th look from there uses the level
    ``(1 - end_confidence) / (k (k + 1))``, whose sum over all looks is ``1 - end_confidence``
    (a union bound): two configurations that measure alike end "reversed", and two a change
    of the min effect apart end "alike", each with at most that probability however long the
    reproduction takes (:func:`orchestrator.strategies.bisect.reproduce.clearly_reversed`,
    the same rule)."""
    cfg = strategy.settings
    if counts < cfg.end_min_per_endpoint:
        return None
    k = counts - cfg.end_min_per_endpoint + 1
    total = strategy.total()
    assert total is not None
    return total.interval(1.0 - (1.0 - cfg.end_confidence) / (k * (k + 1)))


def clearly_reversed(strategy: IsolateState, counts: int) -> bool:
    """The bad configuration measures better than the good one, at the ending level."""
    interval = end_interval(strategy, counts)
    return interval is not None and interval[1] < 0.0


def clearly_alike(strategy: IsolateState, counts: int) -> bool:
    """No change of the run's min effect between the endpoints, at the ending level. Without
    it, two configurations that measure alike (an undecided compare sends such pairs) were
    measured to ``reproduce_max_per_endpoint`` a side: 55 trials on average in 2% noise. A
    stated min effect has its own rule (``small``)."""
    interval = end_interval(strategy, counts)
    if interval is None or strategy.min_effect is not None:
        return False
    floor = strategy.pct_to_log(MIN_EFFECT_FLOOR_PCT)
    return -floor < interval[0] and interval[1] < floor


def start_chain(
    strategy: IsolateState,
    base: Subset,
    order: tuple[int, ...],
    origin: str,
    owner: int | None = None,
) -> bool:
    """Start a prefix chain unless it is empty or was searched before."""
    key = (base, order)
    if not order or key in strategy.chain_keys:
        return False
    strategy.chain_keys.add(key)
    # One step per chain (no later stages): further causes are found by the explain
    # checks' residual chains, and every step is verified both ways anyway. For the same
    # reason a chain names its step without the bisect's hold of extra fresh restarts: the
    # chain only routes (at `search_confidence`); the suspect's own verification, added to
    # good and removed from bad, and the final check at `confidence` decide the answer.
    bisect = BisectStrategy(
        len(order) + 1,
        direction=strategy.direction,
        confidence=strategy.settings.search_confidence,
        min_effect_pct=strategy.log_to_pct(strategy.tolerance()),
        settings=BisectSettings(max_culprits=1, verify_hold_per_side=0),
    )
    chain = Chain(base, order, origin, bisect, owner=owner)
    for observation in strategy.consumed:
        chain.feed(strategy.subset(observation.point), observation)
    chain.initial = len(chain.observations)
    strategy.chains.append(chain)
    return True


def search_orders(settings: IsolateSettings, differences: Sequence[int]) -> list[tuple[int, ...]]:
    """Orders in which a residual or partner search may walk its differences: ascending, then
    (if a search found nothing real) descending, then from the middle outwards. A new order
    puts the steps at new prefixes, so a second search is new evidence, not a replay."""
    ascending = tuple(sorted(differences))
    middle = len(ascending) // 2
    outwards = [ascending[middle]] if ascending else []
    for offset in range(1, len(ascending)):
        for index in (middle - offset, middle + offset):
            if 0 <= index < len(ascending):
                outwards.append(ascending[index])
    orders = [ascending, ascending[::-1], tuple(outwards)]
    return list(dict.fromkeys(orders[: settings.chain_attempts]))


def harvest(strategy: IsolateState, chain: Chain) -> bool:
    """Turn a chain's found step into a suspect (or a pair); close the chain when done."""
    verdict = chain.current()
    changed = False
    for culprit in verdict.culprits if verdict.status != "budget_exhausted" else ():
        members = chain.culprit_members(culprit.point, culprit.range)
        if members in chain.harvested:
            continue
        chain.harvested.add(members)
        changed = True
        _hand_over(strategy, chain, members)
    cfg = strategy.settings
    limit = cfg.chain_trials_base + cfg.chain_trials_per_bit * math.ceil(
        math.log2(len(chain.order) + 1)
    )
    if verdict.done or len(chain.observations) - chain.initial >= limit:
        chain.finished = True
        chain.note = verdict.status if verdict.done else "gave up: no clear step"
        if not verdict.done and not chain.harvested:
            _harvest_guess(strategy, chain, verdict.posterior)
        owner = strategy.suspects[chain.owner] if chain.owner is not None else None
        if owner is not None and not chain.harvested and owner.state == NEEDS_PARTNER:
            if verdict.status == "not_reproducible":
                # Its context adds nothing on top of it: it hurts alone after all.
                reverify(strategy, owner, "its context adds nothing")
            else:
                partner_not_found(strategy, owner)
        changed = True
    return changed


def _hand_over(strategy: IsolateState, chain: Chain, members: Subset) -> None:
    """A partner chain's step completes its owner's pair; any other chain's is a suspect."""
    if chain.origin == "partner" and chain.owner is not None:
        add_pair(strategy, strategy.suspects[chain.owner], frozenset(members))
    else:
        add_suspect(strategy, frozenset(members), chain.context_before(members), chain.origin)


def _harvest_guess(strategy: IsolateState, chain: Chain, posterior: Sequence[float]) -> None:
    """A chain that gave up (several steps blur a one-step model) still hands over its most
    probable step: testing it both ways is cheap and decides."""
    if len(posterior) < 2:
        return
    point = max(range(1, len(posterior)), key=posterior.__getitem__)
    members = chain.culprit_members(point, None)
    chain.harvested.add(members)
    _hand_over(strategy, chain, members)


def explain(strategy: IsolateState) -> bool:
    """All work done: does the named set explain the change? Start a chain if not."""
    named = strategy.named()
    remaining = tuple(sorted(strategy.bad - named))
    cap = strategy.settings.final_max_per_subset
    checks = strategy.explain_checks(named)
    if not checks and named != strategy.bad:
        strategy.outcome = "inconclusive"
        strategy.note = "neither explain check could be measured"
        return True
    unexplained = False
    for weights, tested, base in checks:
        decision = strategy.decision(weights, tested, cap, strategy.settings.residual_confidence)
        if decision is None:
            return False
        if decision == PRESENT:
            if any(start_chain(strategy, base, order, "residual")
                   for order in search_orders(strategy.settings, remaining)):
                return True
            if strategy.evidence.count(tested) < cap:
                return False  # searched already and nothing found: more trials decide
            unexplained = True  # capped: the answer's probability says how much it matters
    if not named:
        strategy.outcome = "inconclusive" if unexplained else "not_reproducible"
        strategy.note = "a change remains that no single difference or pair explains" \
            if unexplained else ""
        return True
    if math.prod(strategy.claim_probabilities()) >= strategy.confidence:
        if attribution_wanted(strategy):
            return False  # measure what restoring each cause wins back first
        strategy.outcome = "found"
        return True
    if not final_wanted(strategy, Counter()):
        strategy.outcome = "inconclusive"
        strategy.note = (
            "a change remains that no single difference or pair explains" if unexplained
            else "the answer's probability stays below the requested confidence"
        )
        return True
    return False
