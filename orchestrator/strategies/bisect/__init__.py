"""The noise-aware Bayesian bisection over a commit history (a chain or the full graph).

Public face: :class:`BisectStrategy` (the :class:`~orchestrator.strategies.base.Strategy`),
:class:`BisectSettings` (its tuning) and :data:`NOT_REPRODUCIBLE_MESSAGE`. `strategy.py` drives
the phases; each phase (`reproduce`, `audit`, `search`, `verify`, `remainders`, `later`,
`verdict`) is a module of functions over the Protocol in `state.py`, so no phase imports the
strategy. The statistics only the bisection uses live here too: `evidence.py` (every trial on
the signed log scale), `levels.py`, `outliers.py`, `model.py`, `posterior.py`, `placement.py`
and `forecast.py` (the ETA).
"""

from __future__ import annotations

from orchestrator.strategies.bisect.settings import BisectSettings
from orchestrator.strategies.bisect.strategy import BisectStrategy
from orchestrator.strategies.bisect.verdict import NOT_REPRODUCIBLE_MESSAGE

__all__ = ["NOT_REPRODUCIBLE_MESSAGE", "BisectSettings", "BisectStrategy"]
