"""From a composed config to the sweep's pieces, checked before anything is written.

Knobs of the experiment live in `experiment.params` (typed and range-checked with every other
experiment's in `orchestrator/config/params.py`):
  restarts        restarts per new configuration (default 1; see `search.py`)
  startup         share of the search budget TPE samples at random first (default 0.4)
  intensify       share of the search budget re-measuring the leaders (default 0.2)
  leaders         how many leaders share those restarts (default 3)
  prior_effect_sd prior sd of one setting's effect in the additive model (default 0.02)
  interaction_sd  how far a configuration may stray from the additive model (default 0.01)
  confirm_top     configurations re-measured against the baseline (default 1)
  confirm_rounds  interleaved rounds of the confirmation, at most (default 16)
  confirm_min_rounds  rounds before it may stop early on a clear answer (default 3)
  prune           stop obviously bad configurations after one restart (default true)
  prune_sigmas    how many noise standard deviations is "obviously" (default 2)
  prior_cv        restart noise assumed until the run measured its own (default 0.03)
  importance      additive | fanova | mdi | ped_anova (default additive; see importance.py)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from orchestrator.config import params as experiment_params
from orchestrator.config.schema import RunSettings
from orchestrator.config.settings import as_dict
from orchestrator.errors import UserError
from orchestrator.metrics import check_metric
from orchestrator.stats.min_effect import MIN_EFFECT_FLOOR_PCT
from orchestrator.strategies.sweep.search import SweepSettings
from orchestrator.strategies.sweep.space import SearchSpace, check_server_params
from orchestrator.strategies.sweep.study import SAMPLERS


def maximize(metric: str, direction: str) -> bool:
    """`direction=auto` follows the metric table: throughput up, latency down."""
    info = check_metric(metric)
    if direction == "auto":
        return info.higher_is_better
    if direction in ("maximize", "increase"):
        return True
    if direction in ("minimize", "decrease"):
        return False
    raise UserError(f"direction must be auto, maximize or minimize (got {direction!r})")


def settings(cfg: RunSettings) -> SweepSettings:
    """The sweep's settings from the run's typed knobs (`orchestrator/config/params.py`
    checked each one's type and range at composition); what is left here is what depends on
    the rest of the configuration."""
    p = experiment_params.of(cfg)
    s = SweepSettings(
        budget=cfg.trials, maximize=maximize(cfg.metric, cfg.direction),
        restarts=p.restarts, startup=p.startup, intensify=p.intensify, leaders=p.leaders,
        prior_effect_sd=p.prior_effect_sd, interaction_sd=p.interaction_sd,
        confirm_top=p.confirm_top, confirm_rounds=p.confirm_rounds,
        confirm_min_rounds=p.confirm_min_rounds, prune=p.prune, prune_sigmas=p.prune_sigmas,
        prior_cv=p.prior_cv, sampler=cfg.sampler, seed=cfg.seed,
        min_effect_pct=(p.min_effect_pct if p.min_effect_pct is not None
                        else MIN_EFFECT_FLOOR_PCT))
    if s.sampler not in SAMPLERS:
        raise UserError(f"sampler must be one of {', '.join(SAMPLERS)} (got {s.sampler!r})")
    minimum = 2 * s.restarts + 4
    if s.budget < minimum:
        raise UserError(f"trials={s.budget} is too small: the baseline and a few configurations "
                        f"need at least {minimum} restarts")
    return s


def space(cfg: RunSettings, target_conf: Mapping[str, Any]) -> SearchSpace:
    conf = as_dict(cfg.space) if cfg.space is not None else None
    result = SearchSpace.from_conf(conf)
    check_server_params(result, target_conf)
    return result
