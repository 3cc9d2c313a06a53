"""Experiment strategies: pure objects that choose the next trials and state what they found."""

from __future__ import annotations

from orchestrator.strategies.base import (
    PHASES,
    STATUSES,
    TERMINAL_STATUSES,
    Culprit,
    Observation,
    Proposal,
    Strategy,
    Verdict,
)
from orchestrator.strategies.bisect import BisectSettings, BisectStrategy
from orchestrator.strategies.bisect_verdict import NOT_REPRODUCIBLE_MESSAGE

__all__ = [
    "NOT_REPRODUCIBLE_MESSAGE",
    "PHASES",
    "STATUSES",
    "TERMINAL_STATUSES",
    "BisectSettings",
    "BisectStrategy",
    "Culprit",
    "Observation",
    "Proposal",
    "Strategy",
    "Verdict",
]
