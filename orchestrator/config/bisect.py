"""Strategies as a run's configuration sets them up: one place from the composed config to the
strategy object, shared by the command that runs it and the report that replays it.

Kept below the commands (the report's posterior replay needs the bisect exactly as the command
built it, and a report importing a command would close an import circle through the command's
own use of the report).
"""

from __future__ import annotations

from orchestrator.config.params import ExperimentParams
from orchestrator.config.requests import BisectRequest
from orchestrator.metrics import regression_direction
from orchestrator.strategies.bisect import BisectStrategy
from orchestrator.workspace import CommitInfo
from orchestrator.workspace.commits import parent_points


def bisect_strategy(req: BisectRequest, params: ExperimentParams, n: int,
                    weights: list[float] | None,
                    commits: list[CommitInfo] | None = None, replay: bool = False,
                    reference_value: float | None = None,
                    noise_prior: tuple[float, float] | None = None) -> BisectStrategy:
    """The strategy as the run uses it: `req` says what is bisected (metric, direction,
    confidence, budget, graph), `params` the run's typed knobs. ``commits``: the plan's commits (their parents make
    the graph when ``first_parent`` is off); ``replay``: rebuilding a finished run's
    posterior history (the report), where no budget applies; ``reference_value``: the
    metric in a reference run, which sets the change being chased; ``noise_prior``: a
    trial's noise as the node's earlier runs measured it, ``(sigma, df)`` on the log scale."""
    parents = assumed_good = None
    if commits is not None and not req.first_parent:
        parents, assumed_good = parent_points(commits)
    return BisectStrategy(
        n,
        direction=regression_direction(req.metric, req.direction),
        confidence=req.confidence,
        max_trials=10**9 if replay else req.max_trials,
        prior_weights=weights,
        min_effect_pct=params.min_effect_pct,
        parents=parents,
        assumed_good=assumed_good or (),
        reference_value=reference_value,
        noise_prior=noise_prior,
    )
