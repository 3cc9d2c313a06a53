"""What the isolate strategy wants measured next, most useful first.

Every piece of open work (reproduction, suspects, pairs, chains, explain checks, the weakest
claim of the answer) offers the subsets that would tell it most; the strategy fills a batch with
distinct subsets in that order and never proposes one already in flight: a second copy of a
subset adds one replicate to one comparison, while another open task's subset usually moves a
decision further. Within a comparison, the side whose next trial shrinks the comparison's
variance most goes first (see :meth:`SubsetEvidence.most_informative`), which interleaves the
two sides and leaves a well-measured good configuration alone.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from orchestrator.strategies.isolate.plan import CONFIRMED, SINGLE, VERIFYING, Chain
from orchestrator.strategies.isolate.stats import PRESENT, Subset

if TYPE_CHECKING:
    from orchestrator.strategies.isolate.settings import Weights
    from orchestrator.strategies.isolate.state import IsolateState

Wanted = Iterator[tuple[Subset, str, str]]


def informative(
    strategy: IsolateState, contrasts: Sequence[Weights], planned: Counter, cap: int
) -> list[Subset]:
    """Subsets of ``contrasts`` by information, dropping those at ``cap`` (endpoints excepted)."""
    endpoints = (strategy.good, strategy.bad)
    return [
        s for s in strategy.evidence.most_informative(contrasts, planned)
        if (s in endpoints or strategy.evidence.count(s) < cap) and not strategy.untestable(s)
    ]


def wanted(strategy: IsolateState, planned: Counter, k: int) -> Wanted:
    """Subsets worth a trial now, most useful first (duplicates are filtered by the caller)."""
    describe = strategy.describe_subset
    if not strategy.reproduced:
        comparison = [{strategy.bad: 1.0, strategy.good: -1.0}]
        for subset in informative(strategy, comparison, planned, 10**9):
            yield subset, "reproduce", f"reproduce: {describe(subset)}"
        if strategy.settings.speculate:
            yield from _speculative(strategy)
        return
    cap = strategy.settings.verify_max_per_side
    for suspect in strategy.suspects:
        if suspect.state == VERIFYING:
            ways = [strategy.add_weights(suspect.members), strategy.remove_weights(suspect.members)]
            for subset in informative(strategy, ways, planned, cap + suspect.fresh_from):
                yield subset, "verify", f"test {describe(suspect.members)} both ways: " \
                    f"{describe(subset)}"
    for pair in strategy.pairs:
        if pair.state == VERIFYING:
            tests = [strategy.interaction_weights(pair), strategy.add_weights(pair.members)]
            for subset in informative(strategy, tests, planned, cap):
                yield subset, "verify", f"interaction of {describe(pair.members)}: " \
                    f"{describe(subset)}"
    for chain in strategy.chains:
        if not chain.finished:
            yield from _chain_wanted(chain, planned, k)
    if strategy.quiescent():
        yield from _explain_wanted(strategy, planned)


def _speculative(strategy: IsolateState) -> Wanted:
    """Evenly spaced prefixes of the first chain (1/2, 1/4, 3/4, ...) for otherwise idle nodes
    during reproduction: the search will want points like these next."""
    n = strategy.n_differences
    seen: set[int] = set()
    for depth in range(1, n.bit_length() + 1):
        for step in range(1, 2**depth, 2):
            length = round(n * step / 2**depth)
            if 0 < length < n and length not in seen:
                seen.add(length)
                subset = frozenset(range(length))
                if strategy.evidence.count(subset) == 0:
                    yield subset, "search", f"speculative prefix of {length} differences"


def _chain_wanted(chain: Chain, planned: Counter, k: int) -> Wanted:
    local_pending = [
        local
        for subset, count in planned.items()
        if count and (local := chain.local(subset)) is not None
        for _ in range(count)
    ]
    for proposal in chain.bisect.propose(chain.observations, local_pending, max(k, 2)):
        yield chain.subset(proposal.point), "search", \
            f"{chain.origin} chain, {proposal.phase}: {proposal.reason}"


def _explain_wanted(strategy: IsolateState, planned: Counter) -> Wanted:
    named = strategy.named()
    cap = strategy.settings.final_max_per_subset
    open_checks = []
    for weights, tested, _ in strategy.explain_checks(named):
        decision = strategy.decision(weights, tested, cap, strategy.settings.residual_confidence)
        if decision is None or decision == PRESENT:  # present here: searched, found nothing
            open_checks.append(weights)
    for subset in informative(strategy, open_checks, planned, cap):
        yield subset, "verify", f"does {strategy.describe_subset(named)} explain it?"
    if not open_checks and math.prod(strategy.claim_probabilities()) >= strategy.confidence:
        for subset in attribution_wanted(strategy):
            yield subset, "verify", "what restoring each cause wins back"
    for subset in final_wanted(strategy, planned):
        yield subset, "verify", "strengthen the weakest claim of the answer"


def final_wanted(strategy: IsolateState, planned: Counter) -> list[Subset]:
    """Subsets of the weakest claim of the answer that can still take trials."""
    claims = strategy.claims()
    probabilities = strategy.claim_probabilities()
    cap = strategy.settings.final_max_per_subset
    for index in sorted(range(len(claims)), key=lambda i: probabilities[i]):
        subsets = informative(strategy, [claims[index][1]], planned, cap)
        subsets = [s for s in subsets if strategy.evidence.count(s) < cap]
        if subsets:
            return subsets
    return []


def attribution_wanted(strategy: IsolateState) -> list[Subset]:
    """The configurations of the answer's attribution (``orchestrator/answer/attribution.py``)
    still short of ``attribution_min_per_subset`` trials, fewest first: good and bad, each
    named cause added alone to good and removed alone from bad, and all of them added and
    removed. None past ``attribution_max_causes`` causes (the attribution is not made)."""
    settings = strategy.settings
    causes = [s.members for s in strategy.suspects if s.state == SINGLE]
    causes += [p.members for p in strategy.pairs if p.state == CONFIRMED]
    if not causes or len(causes) > settings.attribution_max_causes:
        return []
    named = frozenset().union(*causes)
    pairs = [(members, strategy.good) for members in [*causes, named]]
    pairs += [(strategy.bad, strategy.bad - members) for members in [*causes, named]]
    # And what the answer says is left: bad without the named causes against good. With the
    # named causes all live, every pair above is paired within lifetimes, while this one
    # compares different launches: its sides need restarts of their own
    # (`rest_min_per_side`).
    rest = (strategy.bad - named, strategy.good)
    # A pair measured within one lifetime (both sides differ only in live differences) is a
    # paired comparison whose noise rests on the repetitions of every lifetime, not on the
    # few restarts behind each side: its sides need only `attribution_min_live` lifetimes.
    live = getattr(strategy.evidence, "live", frozenset())
    need: dict[Subset, int] = {}
    for a, b in [*pairs, rest]:
        paired = bool(live) and a - live == b - live
        n = settings.attribution_min_live if paired else settings.attribution_min_per_subset
        if (a, b) == rest and not paired:
            n = max(n, settings.rest_min_per_side)
        for s in (a, b):
            need[s] = max(need.get(s, 0), n)
    short = [s for s, n in need.items() if strategy.evidence.count(s) < n
             and not strategy.untestable(s)]
    return sorted(short, key=lambda s: (strategy.evidence.count(s), sorted(s)))
