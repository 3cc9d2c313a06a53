"""What the bisect's phases read and change of the live strategy: an interface, not the class.

The phases (reproduce, search, verify, audit, remainders, later stages, forecast, verdict) are
functions over the strategy's state, kept in their own modules so each stays short. They take
a :class:`BisectState` (this Protocol), which :class:`~orchestrator.strategies.bisect.
BisectStrategy` satisfies; so the strategy imports its phases and no phase imports the
strategy, and the package has no import circle.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from orchestrator.strategies.bisect.evidence import Evidence
from orchestrator.strategies.bisect.history import History
from orchestrator.strategies.bisect.model import StagePosterior
from orchestrator.strategies.bisect.plan import Remainder, Reproduction, Stage
from orchestrator.strategies.bisect.posterior import RangePrior
from orchestrator.strategies.bisect.settings import BisectSettings


class BisectState(Protocol):
    """The bisect strategy's state as its phase modules see it."""

    n: int
    direction: str
    settings: BisectSettings
    history: History
    evidence: Evidence
    log_prior: np.ndarray
    range_log_prior: RangePrior
    _chain_cache: dict[tuple[int, bool], tuple]
    budget: int
    noise_prior: tuple[float, float] | None
    negligible: float
    sign: float
    min_effect: float | None
    min_effect_pct: float | None
    reference_value: float | None
    reproduction: Reproduction | None
    reproduced_order: int
    first_forecast: int | None
    outcome: str | None
    chase_ruled_out: bool
    note: str
    retracted: str | None
    stopped_early: str | None
    stages: list[Stage]
    far_forecasts: list[bool]
    far_checked_at: int

    def effective_min_effect(self) -> float | None: ...

    def found(self) -> list[Stage]: ...

    def current(self) -> Stage | None: ...

    def _terminal_status(self) -> str | None: ...

    def stage_posterior(self, stage: Stage, sigma: float | None = None) -> StagePosterior: ...

    def _step_scale(self) -> float: ...

    def remainders(self) -> list[Remainder]: ...

    def expected_remaining(self) -> int | None: ...

    def withdraw(self, why: str) -> None: ...

    def phase(self, stage: Stage) -> str: ...
