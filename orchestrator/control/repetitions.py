"""The drive loop's side of choosing repetitions: read the store, ask the pure planner.

The store has, per trial, every repetition's reading and wall time and the step times
(:mod:`orchestrator.run.cost`); from those this estimates the two noise levels of the metric on
this run's nodes (:func:`orchestrator.stats.variance.variance_components`, restarts of one
candidate compared only with each other) and what a restart and a repetition cost, and asks
:func:`orchestrator.stats.repetition_plan.plan_repetitions` for the next trials' count.
Restarts the strategy flagged as outliers are left out (one 3x restart would make restarts
look like the dominant noise).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from orchestrator.config.schema import BenchConf
from orchestrator.run.cost import cost_model, describe_cost, gpu_minutes, simulated
from orchestrator.run.noise_prior import NoisePrior, logs_by_candidate
from orchestrator.stats.repetition_plan import CostModel, RepetitionPlan, plan_repetitions
from orchestrator.stats.variance import NoiseStats, VarianceComponents, variance_components
from orchestrator.store import TrialRow


@dataclass(frozen=True)
class RepetitionSettings:
    """``bench.repetitions`` to start with; ``adaptive`` lets the run change it within
    ``lo..hi`` (``bench.min_repetitions``/``bench.max_repetitions``)."""

    start: int = 3
    adaptive: bool = True
    lo: int = 1
    hi: int = 32
    prior: bool = True  # start from the node's earlier runs where runs_dir has them

    @classmethod
    def from_conf(cls, bench: BenchConf) -> RepetitionSettings:
        lo = bench.min_repetitions
        return cls(bench.repetitions, bench.adaptive_repetitions, lo,
                   max(bench.max_repetitions, lo), bench.noise_prior)

    def describe(self) -> str:
        if not self.adaptive:
            return f"repetitions: {self.start} per restart (fixed: bench.adaptive_repetitions=false)"
        return (f"repetitions: {self.start} per restart to start, then chosen per restart in "
                f"{self.lo}..{self.hi} by information per GPU-minute (restarts vs repetitions "
                "noise, measured cost)")


def change_size(verdict) -> float | None:
    """The reproduced change between the endpoints (absolute log ratio), once the search
    runs; None before (the repetitions then follow the noise alone)."""
    pct = getattr(verdict, "total_effect_pct", None)
    if verdict.status not in ("searching", "verifying") or pct is None or pct <= -100:
        return None
    return abs(math.log1p(pct / 100.0)) or None


def components_of(rows: Iterable[TrialRow], metric: str, skip: Iterable[int] = (),
                  prior: NoiseStats | None = None) -> VarianceComponents | None:
    """The metric's two noise levels from the measured, unflagged trials (log scale), pooled
    with ``prior`` (the node's earlier runs) when given."""
    return variance_components(logs_by_candidate(rows, metric, skip), prior=prior)


class RepetitionDesign:
    """The repetitions of the next trial, and the record of each change (for the report)."""

    def __init__(self, settings: RepetitionSettings, target: Mapping, metric: str,
                 on_change: Callable[[str], None] | None = None,
                 prior: NoisePrior | None = None) -> None:
        self.settings = settings
        self.prior = prior
        self.target = target
        self.metric = metric
        self.on_change = on_change
        self.current = settings.start
        self.plan: RepetitionPlan | None = None
        self.changes: list[str] = []
        self.cost: CostModel | None = None
        self.components: VarianceComponents | None = None
        self.spent = 0.0  # GPU-minutes of the stored trials at the last update (measured)

    def update(self, rows: Sequence[TrialRow], outliers: Iterable[int] = (),
               effect: float | None = None) -> int:
        """Re-estimate from the stored trials; returns the count for the next trial.
        ``effect``: the reproduced change's size (signed log), when known."""
        prior = self.prior
        self.tally(rows)
        self.cost = cost_model(rows, self.target, prior.costs if prior is not None else ())
        self.components = components_of(rows, self.metric, outliers,
                                        prior.stats if prior is not None else None)
        if not self.settings.adaptive:
            return self.current
        plan = plan_repetitions(self.components, self.cost, self.current, self.settings.lo,
                                self.settings.hi, effect=effect)
        self.plan = plan
        if plan.changed:
            self.current = plan.repetitions
            text = f"after {len(rows)} trials: {plan.reason}"
            self.changes.append(text)
            if self.on_change is not None:
                self.on_change(text)
        return self.current

    def summary(self, rows: Sequence[TrialRow]) -> dict:
        """What the report states: the counts used, why, and the cost in GPU-minutes."""
        comp = self.components
        cost = self.cost
        doc: dict = {
            "adaptive": self.settings.adaptive,
            "start": self.settings.start,
            "final": self.current,
            "changes": list(self.changes),
            "reason": self.plan.reason if self.plan is not None else "",
            "gpu_minutes": round(gpu_minutes(rows, self.target), 3),
            "restarts": sum(1 for r in rows if r.result is not None),
            "prior_runs": list(self.prior.runs) if self.prior is not None else [],
        }
        if cost is not None:
            doc["cost"] = {"restart_s": round(cost.restart_s, 3),
                           "repetition_s": round(cost.repetition_s, 3), "gpus": cost.gpus}
        if comp is not None:
            doc["noise"] = {
                "repetition_sd_pct": round(100 * comp.repetition.sd, 4),
                "repetition_sd_ci_pct": [round(100 * math.sqrt(comp.repetition.lo), 4),
                                         round(100 * math.sqrt(comp.repetition.hi), 4)],
                "restart_sd_pct": (round(100 * comp.restart.sd, 4)
                                   if math.isfinite(comp.restart.var) else None),
                "restart_sd_ci_pct": [round(100 * math.sqrt(comp.restart.lo), 4),
                                      (round(100 * math.sqrt(comp.restart.hi), 4)
                                       if math.isfinite(comp.restart.hi) else None)],
                "confidence": comp.confidence,
            }
        return doc

    def tally(self, rows: Sequence[TrialRow]) -> None:
        """The GPU time of the stored trials, after each result: the progress line then says
        what the run's closing `cost:` line will (it reads the same rows)."""
        self.spent = gpu_minutes(rows, self.target)

    def describe(self, minutes: float) -> str:
        """GPU-minutes as every line of this run says them (modeled on the simulator)."""
        return describe_cost(minutes, modeled=simulated(self.target))

    def spent_line(self) -> str:
        """What the progress shows: the stored trials' measured GPU time, the figure the run's
        closing ``cost:`` line and the report total, not a model's estimate of it."""
        return f"{self.describe(self.spent)} spent, {self.current} repetitions per restart"

    def line(self, rows: Sequence[TrialRow]) -> str:
        """One line: ``12 restarts, 31.4 GPU-min; 3 -> 8 repetitions per restart: ...``."""
        doc = self.summary(rows)
        text = f"{doc['restarts']} restarts, {self.describe(doc['gpu_minutes'])}"
        if self.changes:
            text += f"; {self.changes[-1].split(': ', 1)[1]}"
        return text
