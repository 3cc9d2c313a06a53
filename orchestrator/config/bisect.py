"""Strategies as a run's configuration sets them up: one place from the composed config to the
strategy object, shared by the command that runs it and the report that replays it.

Kept below the commands (the report's posterior replay needs the bisect exactly as the command
built it, and a report importing a command would close an import circle through the command's
own use of the report).
"""

from __future__ import annotations

from orchestrator.config import params as experiment_params
from orchestrator.config.schema import RunSettings
from orchestrator.metrics import regression_direction
from orchestrator.strategies.bisect import BisectStrategy
from orchestrator.workspace import CommitInfo
from orchestrator.workspace.commits import parent_points


def bisect_strategy(cfg: RunSettings, n: int, weights: list[float] | None,
                    commits: list[CommitInfo] | None = None, replay: bool = False,
                    reference_value: float | None = None,
                    noise_prior: tuple[float, float] | None = None) -> BisectStrategy:
    """The strategy as the run uses it. ``commits``: the plan's commits (their parents make
    the graph when ``first_parent`` is off); ``replay``: rebuilding a finished run's
    posterior history (the report), where no budget applies; ``reference_value``: the
    metric in a reference run, which sets the change being chased; ``noise_prior``: a
    trial's noise as the node's earlier runs measured it, ``(sigma, df)`` on the log scale."""
    params = experiment_params.of(cfg)
    parents = assumed_good = None
    if commits is not None and not cfg.first_parent:
        parents, assumed_good = parent_points(commits)
    return BisectStrategy(
        n,
        direction=regression_direction(cfg.metric, cfg.direction),
        confidence=cfg.confidence,
        max_trials=10**9 if replay else cfg.max_trials,
        prior_weights=weights,
        min_effect_pct=params.min_effect_pct,
        parents=parents,
        assumed_good=assumed_good or (),
        reference_value=reference_value,
        noise_prior=noise_prior,
    )
