"""Plain records of a sweep: its settings, the restarts it runs and what each configuration got.

Kept apart from the experiment (`search.py`) and the confirmation (`confirm.py`) so both, the
command and the report share them without importing each other.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field

from orchestrator.records import Candidate
from orchestrator.strategies.sweep.space import Assignment


@dataclass(frozen=True)
class SweepSettings:
    budget: int  # restarts of the search, baseline included (`trials=`)
    maximize: bool
    restarts: int = 1
    startup: float = 0.4  # share of the budget TPE samples at random before modelling
    intensify: float = 0.2  # share of the search budget that re-measures the leaders
    leaders: int = 3
    prior_effect_sd: float = 0.02  # prior sd of one setting's effect (additive model)
    interaction_sd: float = 0.01  # how far a configuration may stray from the additive model
    confirm_top: int = 1
    confirm_rounds: int = 16  # at most; it stops earlier once the answer is clear
    confirm_min_rounds: int = 3
    interim_confidence: float = 0.998  # stopping early needs this (Haybittle-Peto-like)
    prune: bool = True
    prune_sigmas: float = 2.0
    prior_cv: float = 0.03
    confidence: float = 0.95
    sampler: str = "tpe"
    seed: int = 0
    max_free_asks: int = 200  # proposals of known configurations in a row before "converged"
    # A best setting whose confirmation interval reaches no further than this on the good
    # side has answered the sweep's question: no setting it measured beats the baseline by
    # more (`experiment.params.min_effect_pct`, else the answer's 4% floor).
    min_effect_pct: float = 4.0

    @property
    def confirm_reserve(self) -> int:
        return self.confirm_rounds * (self.confirm_top + 1)

    @property
    def search_budget(self) -> int:
        return self.budget

    @property
    def intensify_budget(self) -> int:
        return int(round(self.budget * self.intensify))

    @property
    def total(self) -> int:
        return self.budget + self.confirm_reserve


PHASE_PREFIX = "sweep/"  # trials of a sweep are told apart from a bisect's in the same store


def phase(kind: str, index: int | None = None) -> str:
    """`sweep/baseline`, `sweep/search/<Optuna trial number>`, `sweep/confirm/<round>`."""
    return PHASE_PREFIX + kind + ("" if index is None else f"/{index}")


def parse_phase(text: str) -> tuple[str, int | None] | None:
    """(kind, index) of a sweep phase; None for a trial of another experiment."""
    if not text.startswith(PHASE_PREFIX):
        return None
    kind, _, index = text[len(PHASE_PREFIX):].partition("/")
    if kind not in ("baseline", "search", "confirm") or (kind != "baseline") != index.isdigit():
        return None
    return kind, int(index) if index else None


@dataclass(frozen=True)
class Work:
    """One restart to run: which candidate, and the phase it belongs to (stored with the trial)."""

    candidate: Candidate
    phase: str  # see `phase()`

    @property
    def kind(self) -> str:
        parsed = parse_phase(self.phase)
        return parsed[0] if parsed else ""


@dataclass
class ConfigStats:
    """Everything measured for one configuration (one candidate): the experiment's running
    tally, so not frozen; records that leave the experiment are `SweepResult` and findings."""

    assignment: Assignment
    candidate: Candidate
    label: str
    search: list[float] = field(default_factory=list)
    confirm: list[float] = field(default_factory=list)
    restarts: int = 0
    failed: bool = False
    pruned: bool = False

    @property
    def key(self) -> str:
        return self.candidate.key

    def mean(self, values: Sequence[float] | None = None) -> float | None:
        vals = self.search if values is None else values
        return statistics.fmean(vals) if vals else None
