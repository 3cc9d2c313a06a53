"""What the isolate's phases read and change of the live strategy: an interface, not the class.

The phases (propose, search, verify, report) are functions over the strategy's state, kept in
their own modules so each stays short. They take an :class:`IsolateState` (this Protocol),
which :class:`~orchestrator.strategies.isolate.IsolateStrategy` satisfies; so the strategy
imports its phases and no phase imports the strategy, and the package has no import circle.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from orchestrator.strategies.base import Observation
from orchestrator.strategies.isolate.plan import Chain, Pair, Suspect
from orchestrator.strategies.isolate.settings import IsolateSettings, Weights
from orchestrator.strategies.isolate.stats import Contrast, EffectPrior, Subset, SubsetEvidence


class IsolateState(Protocol):
    """The isolate strategy's state as its phase modules see it."""

    n_differences: int
    direction: str
    confidence: float
    max_trials: int | None
    labels: tuple[str, ...]
    min_effect: float | None
    settings: IsolateSettings
    good: Subset
    bad: Subset
    evidence: SubsetEvidence
    consumed: list[Observation]
    outcome: str | None
    note: str
    reproduced: bool
    chains: list[Chain]
    suspects: list[Suspect]
    pairs: list[Pair]
    chain_keys: set[tuple[Subset, tuple[int, ...]]]

    def subset(self, point: int) -> Subset: ...

    def describe_subset(self, subset: Subset) -> str: ...

    def terminal_status(self) -> str | None: ...

    def log_to_pct(self, signed_log: float) -> float: ...

    def total(self) -> Contrast | None: ...

    def tolerance(self) -> float: ...

    def prior(self) -> EffectPrior: ...

    def untestable(self, subset: Subset) -> bool: ...

    def named(self) -> Subset: ...

    def add_weights(self, members: Subset) -> Weights: ...

    def remove_weights(self, members: Subset) -> Weights: ...

    def interaction_weights(self, pair: Pair) -> Weights: ...

    def explain_checks(self, named: Subset) -> list[tuple[Weights, Subset, Subset]]: ...

    def claims_for_single(self, members: Subset) -> list[Weights]: ...

    def claims(self) -> list[tuple[str, Weights]]: ...

    def claim_probability(self, claim: str, weights: Weights) -> float: ...

    def claim_probabilities(self) -> list[float]: ...

    def decision(self, weights: Weights, tested: Subset, cap: int, level: float | None = None
                 ) -> str | None: ...

    def quiescent(self) -> bool: ...

    def start_chain(self, base: Subset, order: tuple[int, ...], origin: str,
                    owner: int | None = None) -> bool: ...

    def search_orders(self, differences: Sequence[int]) -> list[tuple[int, ...]]: ...
