"""Experiment strategies: pure objects that choose the next trials and state what they found.

The contract is `base.py` (:class:`Strategy`, :class:`Observation`, :class:`Proposal`,
:class:`Verdict`); each strategy has its own package: `bisect/` (commits), `isolate/`
(differences between two systems) and `sweep/` (settings, through its own loop: its package
docstring says why). A piece two strategies share would sit beside `base.py`; today none does
(the isolate searches its chains with the bisection itself).
"""

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

# The bisect's names are imported on first use: `strategies.base` is read by the renderers and
# the refusals that run before any trial, and the bisect pulls in SciPy (a refusal must not pay
# for it: tests/test_refusals.py counts the modules a refused command loads).
_LAZY = {"NOT_REPRODUCIBLE_MESSAGE", "BisectSettings", "BisectStrategy"}


def __getattr__(name: str):
    if name in _LAZY:
        from orchestrator.strategies import bisect

        return getattr(bisect, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
