"""Which parameters matter: Optuna's importance API over every measured configuration.

The study the sampler saw is not the right input: pruned configurations carry no final value
there, yet they are the strongest evidence that a parameter matters (a P2P level that turns P2P
off is pruned after one restart). So importance runs on a separate in-memory study with one
trial per measured configuration (its mean over search restarts, the restarts in a user
attribute), pruned ones included. A conditional parameter gets an extra level `(inactive)`, so
it is scored like the others instead of dropping out of the search space Optuna evaluates.

Evaluators (`experiment.params.importance`):
  additive   (default) an `optuna.importance.BaseImportanceEvaluator` over the sweep's additive
             model (`effects.py`): the share of variance of each parameter's level effects, the
             first-order part of a functional ANOVA, fitted to every restart;
  fanova     Optuna's default, a random-forest functional ANOVA; needs scikit-learn, which
             sleuth does not depend on;
  mdi        mean decrease in impurity of a random forest; needs scikit-learn too;
  ped_anova  PED-ANOVA (pure Optuna): how differently the top quarter of configurations uses
             each parameter than all of them.
Why additive by default: it needs no extra dependency and ranked the planted parameter first
most often in `python -m experiments.bench_sweep` (numbers in docs/benchmarks.md). PED-ANOVA
measures something else (what the best few share), which under restart noise is mostly noise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.importance import BaseImportanceEvaluator
from optuna.trial import TrialState

from orchestrator.strategies.sweep import EVALUATORS
from orchestrator.strategies.sweep.effects import INACTIVE, AdditiveModel
from orchestrator.strategies.sweep.space import Assignment, SearchSpace
from orchestrator.strategies.sweep.study import quiet_optuna

PED_ANOVA_TARGET_QUANTILE = 0.25  # Optuna's 10% would be two or three configurations here
MIN_CONFIGURATIONS = 4


@dataclass(frozen=True)
class Importances:
    evaluator: str
    values: dict[str, float]  # parameter -> importance, largest first, sums to ~1
    note: str = ""

    @property
    def ranked(self) -> list[str]:
        return list(self.values)


class AdditiveImportanceEvaluator(BaseImportanceEvaluator):
    """Variance shares of the additive model's level effects, through Optuna's importance API.

    Each trial's `restarts` user attribute (its per-restart values) is what the model is fitted
    to; a trial without it counts its value once. `sd` is the restart noise on the log scale.
    """

    def __init__(self, space: SearchSpace, reference: Assignment, *, sd: float,
                 prior_sd: float):
        self.space = space
        self.reference = dict(reference)
        self.sd = sd
        self.prior_sd = prior_sd

    def evaluate(self, study: optuna.Study, params: list[str] | None = None, *,
                 target: Any = None) -> dict[str, float]:
        observations = []
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            assignment = {k: v for k, v in t.params.items() if v != INACTIVE}
            values = t.user_attrs.get("restarts") or [t.value]
            observations += [(assignment, float(v)) for v in values]
        maximize = study.direction == optuna.study.StudyDirection.MAXIMIZE
        model = AdditiveModel(self.space, observations, self.reference, sd=self.sd,
                              maximize=maximize, prior_sd=self.prior_sd)
        shares = model.shares()
        names = params or self.space.names
        return {n: shares.get(n, 0.0) for n in names}


def _evaluator(name: str, space: SearchSpace, reference: Assignment, sd: float,
               prior_sd: float, seed: int) -> BaseImportanceEvaluator:
    if name == "additive":
        return AdditiveImportanceEvaluator(space, reference, sd=sd, prior_sd=prior_sd)
    if name == "fanova":
        return optuna.importance.FanovaImportanceEvaluator(seed=seed)
    if name == "mdi":
        return optuna.importance.MeanDecreaseImpurityImportanceEvaluator(seed=seed)
    if name == "ped_anova":
        return optuna.importance.PedAnovaImportanceEvaluator(
            target_quantile=PED_ANOVA_TARGET_QUANTILE)
    raise ValueError(f"importance evaluator must be one of {', '.join(EVALUATORS)}")


def _flat(space: SearchSpace, assignment: Assignment) -> tuple[dict[str, Any], dict]:
    """Params and distributions of one configuration, inactive categoricals as a level."""
    params, dists = {}, {}
    for p in space.params:
        if p.name in assignment:
            params[p.name] = assignment[p.name]
        elif p.when and p.categorical:
            params[p.name] = INACTIVE
        else:
            continue
        if p.when and p.categorical:
            dists[p.name] = optuna.distributions.CategoricalDistribution([*p.values, INACTIVE])
        else:
            dists[p.name] = p.distribution()
    return params, dists


def param_importances(space: SearchSpace, measured: Sequence[tuple[Assignment, Sequence[float]]],
                      *, maximize: bool, reference: Assignment, sd: float,
                      evaluator: str = "additive", prior_sd: float = 0.02,
                      seed: int = 0) -> Importances:
    """Importance of each parameter over the measured configurations (their restart values)."""
    quiet_optuna()
    measured = [(a, list(v)) for a, v in measured if v]
    if len(measured) < MIN_CONFIGURATIONS:
        return Importances(evaluator, {}, f"needs at least {MIN_CONFIGURATIONS} configurations")
    ev = _evaluator(evaluator, space, reference, sd, prior_sd, seed)
    study = optuna.create_study(direction="maximize" if maximize else "minimize")
    for assignment, values in measured:
        params, dists = _flat(space, assignment)
        study.add_trial(optuna.trial.create_trial(
            params=params, distributions=dists, value=sum(values) / len(values),
            user_attrs={"restarts": values}))
    try:
        values = optuna.importance.get_param_importances(study, evaluator=ev, normalize=True)
    except (ImportError, ValueError, RuntimeError) as exc:
        hint = " (pip install scikit-learn)" if isinstance(exc, ImportError) else ""
        return Importances(evaluator, {}, f"{type(exc).__name__}: {exc}{hint}")
    ordered = dict(sorted(((k, float(v)) for k, v in values.items()), key=lambda kv: -kv[1]))
    return Importances(evaluator, ordered)


def of_search(search, evaluator: str = "additive") -> Importances:
    """Importances over every configuration a `SweepSearch` measured (search restarts)."""
    measured = [(c.assignment, c.search) for c in search.configs.values() if c.search]
    return param_importances(search.space, measured, maximize=search.settings.maximize,
                             reference=search.baseline.assignment, sd=search.restart_sd(),
                             evaluator=evaluator, prior_sd=search.settings.prior_effect_sd,
                             seed=search.settings.seed)
