"""Statistics over trial-level values: effect sizes with intervals."""

from __future__ import annotations

from orchestrator.stats.effect import (
    Effect,
    LogDifference,
    effect,
    log_difference,
    log_effect,
)

__all__ = [
    "Effect",
    "LogDifference",
    "effect",
    "log_difference",
    "log_effect",
]
