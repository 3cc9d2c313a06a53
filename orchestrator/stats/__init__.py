"""Statistics over trial-level values: effect sizes with intervals."""

from __future__ import annotations

from orchestrator.stats.effect import (
    Effect,
    LogDifference,
    TrialSummary,
    effect,
    log_difference,
    log_effect,
    summarize_repetitions,
)

__all__ = [
    "Effect",
    "LogDifference",
    "TrialSummary",
    "effect",
    "log_difference",
    "log_effect",
    "summarize_repetitions",
]
