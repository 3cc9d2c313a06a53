"""The work items of the isolate strategy: prefix chains, suspects under test, and pairs.

A **prefix chain** orders some differences ``d1, d2, ..., dm`` on top of a base subset ``B`` and
looks at the configurations ``B``, ``B+d1``, ``B+d1+d2``, ..., ``B+d1..dm``. Along it the metric
is a step function whose steps sit at the differences that hurt *in the context of the ones
before them*, so finding them is a bisection over an ordered list: the existing
:class:`~orchestrator.strategies.bisect.BisectStrategy` (reproduce, Bayesian change-point
search with expected-information batches, head-to-head verification, several steps) does it
unchanged, on chain-local points. A pair that only hurts together shows as one step at whichever
member comes second, with the first member in its context; the context is kept so the partner can
be searched for.

These are mutable bookkeeping objects, not records; the strategy advances them one observation at
a time, so every decision depends only on the observation sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.strategies.base import Observation, Verdict
from orchestrator.strategies.bisect import BisectStrategy
from orchestrator.strategies.isolate.stats import Subset

# Suspect states.
VERIFYING = "verifying"
SINGLE = "single"  # hurts when added to the good configuration on its own
NEEDS_PARTNER = "needs_partner"  # hurts only in a context: its partner is being searched
DISMISSED = "dismissed"
# Pair states.
CONFIRMED = "confirmed"


@dataclass
class Chain:
    """A prefix chain searched by its own bisection (see module docstring)."""

    base: Subset
    order: tuple[int, ...]
    origin: str  # "search" | "residual" | "partner"
    bisect: BisectStrategy
    owner: int | None = None  # the suspect whose partner a "partner" chain looks for
    observations: list[Observation] = field(default_factory=list)
    verdict: Verdict | None = None
    harvested: set[tuple[int, ...]] = field(default_factory=set)
    finished: bool = False
    note: str = ""
    initial: int = 0  # observations it inherited when it started

    def __post_init__(self) -> None:
        self._index = {self.subset(k): k for k in range(len(self.order) + 1)}

    @property
    def start(self) -> Subset:
        return self.base

    @property
    def end(self) -> Subset:
        return self.base | frozenset(self.order)

    def subset(self, local: int) -> Subset:
        return self.base | frozenset(self.order[:local])

    def local(self, subset: Subset) -> int | None:
        return self._index.get(subset)

    def feed(self, subset: Subset, observation: Observation) -> bool:
        """Pass an observation on, in chain-local points; False if the subset is not on it."""
        local = self.local(subset)
        if local is None:
            return False
        self.observations.append(
            Observation(local, observation.value, observation.suspect, observation.trial_id)
        )
        self.verdict = None
        return True

    def current(self) -> Verdict:
        if self.verdict is None:
            self.verdict = self.bisect.verdict(self.observations)
        return self.verdict

    def culprit_members(self, point: int, lo_hi: tuple[int, int] | None) -> tuple[int, ...]:
        """The differences a chain culprit stands for: one, or a run hidden by untestables."""
        if lo_hi is None:
            return (self.order[point - 1],)
        lo, hi = lo_hi
        return tuple(self.order[lo:hi])

    def context_before(self, members: Sequence[int]) -> tuple[int, ...]:
        """Differences present (in chain order, base first) where ``members`` were seen to hurt."""
        first = min(self.order.index(m) for m in members)
        return tuple(sorted(self.base)) + self.order[:first]


@dataclass
class Suspect:
    """Differences a chain pointed at, tested in both directions against both ends.

    ``add``: the members applied to the good configuration vs good. ``remove``: bad vs bad
    without the members. A single cause shows in both; a member of a pair that only hurts
    together shows only when removed (its partner is in bad, not in good).
    """

    members: Subset
    context: tuple[int, ...]
    origin: str
    state: str = VERIFYING
    note: str = ""
    not_partners: Subset = frozenset()  # paired and shown to hurt on their own
    fresh_from: int = 0  # trials per side already seen when it was sent back to verification


@dataclass
class Pair:
    """Differences suspected to hurt only together: ``first`` (a suspect) needs ``second`` (found
    by its partner chain). Each side is one difference, or a run hidden by untestable subsets."""

    first: Subset
    second: Subset
    state: str = VERIFYING
    note: str = ""

    @property
    def members(self) -> Subset:
        return self.first | self.second
