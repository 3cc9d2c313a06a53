"""From a composed config to the sweep's pieces, checked before anything is written.

Knobs of the experiment live in `experiment.params` (open-ended, like bisect's):
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

from omegaconf import DictConfig, OmegaConf

from orchestrator.errors import UserError
from orchestrator.metrics import check_metric
from orchestrator.sweep.importance import EVALUATORS
from orchestrator.sweep.search import SweepSettings
from orchestrator.sweep.space import SearchSpace, check_server_params
from orchestrator.sweep.study import SAMPLERS

_KNOBS = ("restarts", "startup", "intensify", "leaders", "prior_effect_sd", "interaction_sd",
          "confirm_top", "confirm_rounds", "confirm_min_rounds", "prune", "prune_sigmas",
          "prior_cv")
_DEFAULTS = SweepSettings(budget=0, maximize=True)
PARAM_DEFAULTS: dict[str, Any] = {
    **{k: getattr(_DEFAULTS, k) for k in _KNOBS}, "importance": "additive"}


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


def params(cfg: DictConfig) -> dict[str, Any]:
    """The sweep's knobs. A misspelt one is bad input for `sleuth sweep`; another command
    running a sweep inside (the demo) may carry its own knobs in the same mapping."""
    given = OmegaConf.to_container(cfg.experiment.params, resolve=True) or {}
    unknown = sorted(set(given) - set(PARAM_DEFAULTS))
    if unknown and cfg.get("command") == "sweep":
        raise UserError(f"unknown sweep setting(s) experiment.params.{unknown[0]} "
                        f"(known: {', '.join(PARAM_DEFAULTS)})")
    return {**PARAM_DEFAULTS, **{k: v for k, v in given.items() if k in PARAM_DEFAULTS}}


def _bool(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def settings(cfg: DictConfig) -> SweepSettings:
    p = params(cfg)
    try:
        s = SweepSettings(
            budget=int(cfg.trials), maximize=maximize(str(cfg.metric), str(cfg.direction)),
            restarts=int(p["restarts"]), startup=float(p["startup"]),
            intensify=float(p["intensify"]),
            leaders=int(p["leaders"]), prior_effect_sd=float(p["prior_effect_sd"]),
            interaction_sd=float(p["interaction_sd"]), confirm_top=int(p["confirm_top"]),
            confirm_rounds=int(p["confirm_rounds"]),
            confirm_min_rounds=int(p["confirm_min_rounds"]), prune=_bool(p["prune"]),
            prune_sigmas=float(p["prune_sigmas"]), prior_cv=float(p["prior_cv"]),
            sampler=str(cfg.sampler), seed=int(cfg.seed))
    except (TypeError, ValueError) as exc:
        raise UserError(f"bad sweep setting: {exc}") from exc
    if s.sampler not in SAMPLERS:
        raise UserError(f"sampler must be one of {', '.join(SAMPLERS)} (got {s.sampler!r})")
    if s.restarts < 1 or s.leaders < 1 or s.confirm_top < 1:
        raise UserError("restarts, leaders and confirm_top must be at least 1")
    if not 2 <= s.confirm_min_rounds <= s.confirm_rounds:
        raise UserError("confirmation rounds: need 2 <= confirm_min_rounds <= confirm_rounds")
    if not 0 <= s.intensify < 1 or not 0 <= s.startup <= 1:
        raise UserError("intensify must be in [0, 1) and startup in [0, 1]")
    if min(s.prior_effect_sd, s.interaction_sd) <= 0:
        raise UserError("prior_effect_sd and interaction_sd must be positive")
    if s.prune_sigmas <= 0 or not 0 < s.prior_cv < 1:
        raise UserError("prune_sigmas must be positive and prior_cv between 0 and 1")
    minimum = 2 * s.restarts + 4
    if s.budget < minimum:
        raise UserError(f"trials={s.budget} is too small: the baseline and a few configurations "
                        f"need at least {minimum} restarts")
    if str(p["importance"]) not in EVALUATORS:
        raise UserError(f"importance must be one of {', '.join(EVALUATORS)}")
    return s


def space(cfg: DictConfig, target_conf: Mapping[str, Any]) -> SearchSpace:
    conf = OmegaConf.to_container(cfg.space, resolve=True) if cfg.get("space") else None
    result = SearchSpace.from_conf(conf)
    check_server_params(result, target_conf)
    return result
