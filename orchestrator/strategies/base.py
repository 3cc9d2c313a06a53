"""The contract between experiment strategies and the controller that runs their trials.

A strategy is pure: given the finished observations (and the points still in flight) it says
what to measure next and what it believes now. It starts no processes and touches no files, so
the controller can drive it from Ray, the tests can drive it in milliseconds, and the
localization benchmark can drive it against a virtual oracle, all through the same two calls.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

PHASES = ("reproduce", "search", "verify")
STATUSES = (
    "reproducing",
    "searching",
    "verifying",
    "found",
    "not_reproducible",
    "reversed",
    "budget_exhausted",
    "inconclusive",
)
# Statuses after which the strategy proposes nothing more.
TERMINAL_STATUSES = frozenset(
    {"found", "not_reproducible", "reversed", "budget_exhausted", "inconclusive"}
)


def probability_text(p: float) -> str:
    """Three decimals, but never a rounded-up certainty: 0.99996 reads >0.999, not 1.000.
    A posterior is never 1, and the messages a user acts on should not say so."""
    return ">0.999" if p > 0.999 else f"{p:.3f}"


def probability_relation(p: float, pad: str = " ") -> str:
    """``= 0.994`` or ``> 0.999``: what follows a "P" in a sentence."""
    text = probability_text(p)
    return text[0] + pad + text[1:] if text.startswith(">") else "=" + pad + text


def pct_text(value: float | None) -> str:
    """A change in percent as the verdicts' sentences write it (``+12.3%``)."""
    return "unmeasured" if value is None else f"{value:+.1f}%"


def interval_text(ci: tuple[float, float] | None) -> str:
    """``" [+1.0%, +20.0%]"`` after a change, or nothing when it has no interval."""
    return "" if ci is None else f" [{ci[0]:+.1f}%, {ci[1]:+.1f}%]"


@dataclass(frozen=True)
class Observation:
    """One finished trial at one point of the ordered candidate list.

    ``point`` 0 is the good endpoint and n-1 the bad one. ``value`` is the trial-level metric
    (mean of the repetitions inside one server restart); None means the candidate could not be
    tested (build or launch failure). ``suspect`` trials (throttled GPU, foreign process) may be
    ignored by the strategy but still count as trials spent. ``epoch`` numbers the system the
    trial ran on: it goes up when a node's system changes during the run (a power limit set
    from outside, a driver update), so a strategy can compare trials within one system.
    ``repetitions``/``spread`` say how precise the value is (see the fields).
    """

    point: int
    value: float | None
    suspect: bool = False
    trial_id: int | None = None
    epoch: int = 0
    # How many repetitions the value averages (0: not known) and their sample variance on the
    # log scale (None with fewer than two): trials of different repetition counts then weigh
    # by their precision, 1 / (sigma_restart^2 + sigma_repetition^2 / n).
    repetitions: int = 0
    spread: float | None = None
    # The server lifetime the value was measured in, when one lifetime measured several
    # points in interleaved blocks (orchestrator/runner/lifetime.py): such values share the
    # restart's level. None: the trial measured this point alone.
    lifetime: int | None = None


@dataclass(frozen=True)
class Proposal:
    """A point to measure next and why (``phase`` is one of :data:`PHASES`)."""

    point: int
    phase: str
    reason: str = ""


@dataclass(frozen=True)
class Culprit:
    """A commit found to cause (part of) the change.

    ``point`` is the first bad point; when untestable points hide the exact commit, ``range``
    ``(lo, hi)`` says the first bad commit is one of ``lo+1 .. hi`` and ``probability`` is the
    posterior mass of that whole range. ``effect_pct``/``effect_ci`` come from the head-to-head
    comparison with the parent (verify phase); ``explained`` is the culprit's share of the change
    between the endpoints of the range it was searched in. Iterating yields
    ``(point, probability)`` so ``for point, prob in verdict.culprits`` works.
    """

    point: int
    probability: float
    range: tuple[int, int] | None = None
    effect_pct: float | None = None
    effect_ci: tuple[float, float] | None = None
    explained: float | None = None
    # The points it was verified against (its git parents on a graph, the previous testable
    # point on a chain); empty for a best guess that was never verified.
    parents: tuple[int, ...] = ()
    explained_ci: tuple[float, float] | None = None
    # After a system change: the step re-measured on the system as it is now.
    latest_effect_pct: float | None = None
    latest_effect_ci: tuple[float, float] | None = None

    def __iter__(self) -> Iterator[float]:
        yield self.point
        yield self.probability


@dataclass(frozen=True)
class Unexplained:
    """A part of the change no named commit accounts for, with its size.

    ``kind`` "remainder": the change from point ``lo`` to point ``hi`` (anchors: an endpoint, a
    culprit or a culprit's parent) less the named steps between them; ``flagged`` when its
    interval excludes zero. ``kind`` "spread": a change the search could not pin on one commit;
    most of the posterior lies on commits ``lo + 1 .. hi`` (``candidates`` lists the likeliest).
    ``kind`` "total": the endpoints' change less every named step, reported (always flagged)
    when its interval excludes zero while no remainder's does.
    """

    lo: int
    hi: int
    effect_pct: float
    effect_ci: tuple[float, float]
    flagged: bool
    kind: str = "remainder"
    candidates: tuple[int, ...] = ()


@dataclass(frozen=True)
class Outlier:
    """A measured trial left out of the likelihood: an ``outlier`` (its replicates disagree)
    or ``pending`` (one reading far outside every level, not yet replicated)."""

    trial_id: int | None
    point: int
    status: str
    ratio: float  # its reading over its commit's level (raw metric)


@dataclass(frozen=True)
class Verdict:
    """What the strategy believes after the observations it was given.

    ``posterior`` has one entry per point: the probability that the point is the first bad one
    within the range being searched (all zeros before the search starts). ``total_effect_pct``
    and ``total_effect_ci`` compare the endpoints. ``message`` is a plain sentence for humans.
    """

    done: bool
    status: str
    culprits: list[Culprit] = field(default_factory=list)
    range: tuple[int, int] | None = None
    posterior: list[float] = field(default_factory=list)
    message: str = ""
    n_trials: int = 0
    confidence: float = 0.0
    total_effect_pct: float | None = None
    total_effect_ci: tuple[float, float] | None = None
    expected_remaining: int | None = None  # a forecast of the trials still needed, for an ETA
    unexplained: list[Unexplained] = field(default_factory=list)
    outliers: list[Outlier] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # retractions, system changes, early stops
    budget: int | None = None  # the trials the run allows itself
    # The restart noise the run has measured (percent of a restart's value; None before it
    # is), and while a culprit is verified, the step its head-to-head reads: `{"point",
    # "pct", "ci"}` (what the progress says beside the endpoints' change).
    noise_pct: float | None = None
    verifying: dict | None = None
    # The endpoints' change from the strategy's level fit (drift blocks, system epochs,
    # outliers left out): `(log(bad / good), standard error, degrees of freedom)`.
    total_log: tuple[float, float, float] | None = None

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"unknown verdict status {self.status!r}")

    @property
    def top(self) -> Culprit | None:
        """The most probable culprit, if any."""
        if not self.culprits:
            return None
        return max(self.culprits, key=lambda culprit: culprit.probability)


class Strategy(ABC):
    """Chooses the next points to measure and says when it is done."""

    @staticmethod
    def check_arguments(direction: str, confidence: float, max_trials: int | None) -> None:
        """What every search is asked the same way: the bad direction, a confidence strictly
        between a coin flip and certainty, and a budget that allows reproducing (>= 4)."""
        if direction not in ("increase", "decrease"):
            raise ValueError(f"direction must be 'increase' or 'decrease', got {direction!r}")
        if not 0.5 < confidence < 1.0:
            raise ValueError(f"confidence must be in (0.5, 1), got {confidence}")
        if max_trials is not None and max_trials < 4:
            raise ValueError("max_trials must allow at least reproducing (>= 4)")

    @abstractmethod
    def propose(
        self, observations: Sequence[Observation], pending: Sequence[int], k: int
    ) -> list[Proposal]:
        """Up to k points to measure next, given finished observations and points in flight."""

    @abstractmethod
    def verdict(self, observations: Sequence[Observation]) -> Verdict:
        """Current state: done?, culprit(s) with probability, etc. Cheap; called after each trial."""
