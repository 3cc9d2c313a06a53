"""Main effects of each setting: a Bayesian additive model of log(metric) over every restart.

Why a model at all: restart noise (~2%) is as large as the differences between good
configurations, so one configuration's one or two restarts cannot rank it. But every restart of
every configuration that shares a level (say NCCL_PROTO=LL) says something about that level.
The model pools them: log(value) = mean + one effect per (parameter, level), each effect with a
normal prior N(0, prior_sd^2) and restart noise sd (pooled from repeated configurations). That
is ridge regression with penalty sd^2 / prior_sd^2; its posterior gives

  - per-setting effects against the baseline's level with 95% intervals ("NCCL_PROTO=LL: +2.1%
    [+0.9, +3.3]"), and the probability that the setting helps;
  - predictions for every configuration, measured or not: the sweep re-measures the predicted
    best (`search.py`), and ranks measured configurations by their prediction plus their own
    shrunk deviation from it (a configuration may interact in ways the additive model misses).

Levels never measured keep the prior (no effect). A conditional parameter that is inactive has
the level `(inactive)`. Multiplicative effects and noise are why the log scale is right: NCCL,
clock and graph settings scale phase times.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

from orchestrator.strategies.sweep.space import Assignment, SearchSpace

INACTIVE = "(inactive)"
PRIOR_SD = 0.02  # a single setting rarely moves speed by more than a few percent


@dataclass(frozen=True)
class LevelEffect:
    param: str
    level: Any
    pct: float  # vs the baseline's level (posterior mean)
    ci: tuple[float, float]  # posterior interval
    p_better: float  # probability the level beats the reference in the sweep's direction
    n: int  # restarts measured at this level


def _key(value: Any) -> str:
    return repr(value)


class AdditiveModel:
    def __init__(self, space: SearchSpace, observations: Sequence[tuple[Assignment, float]],
                 reference: Mapping[str, Any], *, sd: float, maximize: bool,
                 prior_sd: float = PRIOR_SD, confidence: float = 0.95):
        """`observations`: (assignment, value) per restart; `sd`: restart noise (log scale)."""
        self.space = space
        self.maximize = maximize
        self.confidence = confidence
        obs = [(a, v) for a, v in observations if v is not None and v > 0 and math.isfinite(v)]
        self.n = len(obs)
        self.reference = {p.name: self._level(p.name, reference) for p in space.params}
        levels: dict[tuple[str, str], tuple[str, Any]] = {}
        for p in space.params:
            for lv in [*p.values, *([INACTIVE] if p.when else [])]:
                levels[(p.name, _key(lv))] = (p.name, lv)
        for a, _ in obs:  # range parameters: every measured value is a level
            for p in space.params:
                lv = self._level(p.name, a)
                levels.setdefault((p.name, _key(lv)), (p.name, lv))
        self.columns = list(levels.values())
        self._index = {k: i for i, k in enumerate(levels)}
        self.counts: dict[tuple[str, str], int] = {}
        for a, _ in obs:
            for p in space.params:
                k = (p.name, _key(self._level(p.name, a)))
                self.counts[k] = self.counts.get(k, 0) + 1
        x = np.array([self.row(a) for a, _ in obs], dtype=float).reshape(self.n, len(self.columns))
        y = np.array([math.log(v) for _, v in obs], dtype=float)
        self.mean = float(y.mean()) if self.n else 0.0
        penalty = (sd / prior_sd) ** 2
        precision = x.T @ x + penalty * np.eye(len(self.columns))
        self._cov = np.linalg.inv(precision) * sd * sd  # posterior covariance of the effects
        self.beta = self._cov @ x.T @ (y - self.mean) / (sd * sd)

    def _level(self, name: str, assignment: Mapping[str, Any]) -> Any:
        norm = self.space.normalize(assignment)
        return norm[name] if name in norm else INACTIVE

    def row(self, assignment: Mapping[str, Any]) -> list[float]:
        out = [0.0] * len(self.columns)
        norm = self.space.normalize(assignment)
        for p in self.space.params:
            i = self._index.get((p.name, _key(norm[p.name] if p.name in norm else INACTIVE)))
            if i is not None:
                out[i] = 1.0
        return out

    def predict(self, assignment: Mapping[str, Any]) -> float:
        """Posterior mean of log(metric) for a configuration."""
        return self.mean + float(np.array(self.row(assignment)) @ self.beta)

    def rows(self, assignments: Sequence[Assignment]) -> np.ndarray:
        return np.array([self.row(a) for a in assignments], dtype=float).reshape(
            len(assignments), len(self.columns))

    def best(self, assignments: Sequence[Assignment], rows: np.ndarray | None = None,
             ) -> Assignment | None:
        """The configuration with the best predicted metric (`rows`: their `rows()`, cached)."""
        if not assignments:
            return None
        x = self.rows(assignments) if rows is None else rows
        pred = x @ self.beta
        return assignments[int(np.argmax(pred) if self.maximize else np.argmin(pred))]

    def level_effect(self, name: str, level: Any) -> LevelEffect:
        """Posterior effect of `name=level` against the baseline's level of `name`."""
        n = self.counts.get((name, _key(level)), 0)
        c = np.zeros(len(self.columns))
        i = self._index.get((name, _key(level)))
        ref = self._index.get((name, _key(self.reference[name])))
        if i is None or i == ref:
            return LevelEffect(name, level, 0.0, (0.0, 0.0), 0.5, n)
        c[i] = 1.0
        if ref is not None:
            c[ref] = -1.0
        est = float(c @ self.beta)
        se = math.sqrt(max(float(c @ self._cov @ c), 1e-18))
        z = float(scipy_stats.norm.ppf(0.5 + self.confidence / 2.0))
        good = est if self.maximize else -est
        return LevelEffect(name, level, 100.0 * math.expm1(est),
                           (100.0 * math.expm1(est - z * se), 100.0 * math.expm1(est + z * se)),
                           float(scipy_stats.norm.cdf(good / se)), n)

    def shares(self) -> dict[str, float]:
        """First-order variance shares: the variance of each parameter's posterior level effects
        over its measured levels (weighted alike, as fANOVA weights the space), normalised."""
        raw = {}
        for p in self.space.params:
            effects = [float(self.beta[i]) for i, (name, lv) in enumerate(self.columns)
                       if name == p.name and self.counts.get((name, _key(lv)), 0) > 0]
            raw[p.name] = float(np.var(effects)) if len(effects) > 1 else 0.0
        total = sum(raw.values())
        if total <= 0:
            return {}
        return dict(sorted(((k, v / total) for k, v in raw.items()), key=lambda kv: -kv[1]))
