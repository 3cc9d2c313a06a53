"""Noisy delta debugging: which of the differences between a good and a bad configuration
cause the change, alone or in pairs.

Public face: :class:`IsolateStrategy` (the :class:`~orchestrator.strategies.base.Strategy`; its
points are subsets of the differences), :class:`IsolateSettings` and the verdict it states,
:class:`IsolateVerdict` with its :class:`IsolateCulprit` s. `strategy.py` drives the steps;
`search.py`, `verify.py` and `propose.py` are functions over the Protocol in `state.py`;
`stats.py` holds the contrasts and their spike-and-slab posterior. A chain of subsets is
searched by the bisection (:mod:`orchestrator.strategies.bisect`), the one dependency between
the two strategies.
"""

from __future__ import annotations

from orchestrator.strategies.isolate.report import IsolateCulprit, IsolateVerdict
from orchestrator.strategies.isolate.settings import IsolateSettings
from orchestrator.strategies.isolate.strategy import IsolateStrategy

__all__ = ["IsolateCulprit", "IsolateSettings", "IsolateStrategy", "IsolateVerdict"]
