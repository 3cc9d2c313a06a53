"""`experiment.params`: every experiment knob, typed and range-checked in one place.

The knobs used to travel as an open mapping that each reader converted where it used it
(`float(params.get("min_effect_pct"))`), so a typo was silently ignored and `min_effect_pct=abc`
was a traceback deep in a run. Here they are one frozen record, parsed once right after
composition (:func:`orchestrator.config.checks.check_values`): an unknown knob, a value of the
wrong type or out of range is one line and exit 2 before anything is written. Readers take the
record (:func:`of`), never the mapping.

One record for all commands, because the commands nest: `investigate` runs a compare, an
isolate and a bisect with the same configuration, and the demo adds a sweep, so every knob of
every experiment may appear in one run's configuration. A field that is `None` means "the
experiment's own default" (the compare's batch of 3 is not the bisect's batch).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchestrator.config.schema import Bounds, RunSettings
from orchestrator.errors import UserError, did_you_mean
from orchestrator.strategies.sweep import EVALUATORS as IMPORTANCE_EVALUATORS


def _knob(default: Any, doc: str, **bounds: float) -> Any:
    meta: dict[str, Any] = {"doc": doc}
    if bounds:
        meta["bounds"] = Bounds(**bounds)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class ExperimentParams:
    """Every `experiment.params.KNOB`, with what it changes (the `doc` of each field)."""

    # shared by bisect, compare, isolate, investigate
    min_effect_pct: float | None = _knob(
        None, "the smallest change worth chasing, % (bisect, compare, isolate)", gt=0, le=1000)
    untouched_weight: float = _knob(
        0.25, "prior weight of commits that touch none of `paths` (bisect)", gt=0, le=1)
    batch: int | None = _knob(None, "trials proposed per round (compare: 3)", ge=1, le=10_000)
    max_trials: int | None = _knob(None, "a compare's budget (default 9)", ge=1, le=1_000_000)
    final_trials: int | None = _knob(None, "investigate: restarts the final check may spend"
                                     " on the endpoints (unset: planned from the noise"
                                     " measured, at most 48; 0: none)", ge=0, le=10_000)
    bound_pct: float = _knob(10.0, "compare: 'reproduces' means within this %", gt=0, le=1000)
    reference: str | None = _knob(None, "compare: the reference run (same as reference=)")
    all_env: bool = _knob(False, "isolate: test shell/session variables too")
    within_lifetime: bool = _knob(True, "isolate: compare a power limit or clock lock within"
                                  " one server lifetime, in interleaved blocks (false: a"
                                  " restart per side)")
    # the sweep's (orchestrator/strategies/sweep/work.SweepSettings says what each does)
    restarts: int = _knob(1, "sweep: restarts per new configuration", ge=1, le=1000)
    startup: float = _knob(0.4, "sweep: share of the budget TPE samples at random", ge=0, le=1)
    intensify: float = _knob(0.2, "sweep: share re-measuring the leaders", ge=0, lt=1)
    leaders: int = _knob(3, "sweep: leaders sharing those restarts", ge=1, le=1000)
    prior_effect_sd: float = _knob(0.02, "sweep: prior sd of one setting's effect", gt=0, le=10)
    interaction_sd: float = _knob(0.01, "sweep: how far a configuration may stray from the"
                                  " additive model", gt=0, le=10)
    confirm_top: int = _knob(1, "sweep: configurations confirmed against the baseline", ge=1,
                             le=100)
    confirm_rounds: int = _knob(16, "sweep: interleaved confirmation rounds, at most", ge=2,
                                le=1000)
    confirm_min_rounds: int = _knob(3, "sweep: rounds before an early stop", ge=2, le=1000)
    prune: bool = _knob(True, "sweep: stop obviously bad configurations after one restart")
    prune_sigmas: float = _knob(2.0, "sweep: how many noise sds is 'obviously'", gt=0, le=100)
    prior_cv: float = _knob(0.03, "sweep: restart noise assumed until measured", gt=0, lt=1)
    importance: str = _knob("additive", "sweep: " + " | ".join(IMPORTANCE_EVALUATORS))

    def __post_init__(self) -> None:
        if self.confirm_min_rounds > self.confirm_rounds:
            raise UserError("experiment.params: need confirm_min_rounds <= confirm_rounds"
                            f" (got {self.confirm_min_rounds} > {self.confirm_rounds})")
        if self.importance not in IMPORTANCE_EVALUATORS:
            raise UserError(f"experiment.params.importance must be one of"
                            f" {', '.join(IMPORTANCE_EVALUATORS)} (got {self.importance!r})")

    @property
    def given(self) -> frozenset[str]:
        """The knobs set away from their defaults (for messages and the resolved config)."""
        return frozenset(f.name for f in dataclasses.fields(self)
                         if getattr(self, f.name) != f.default)


KNOBS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(ExperimentParams))
_HINTS = typing.get_type_hints(ExperimentParams)


def _convert(name: str, value: Any) -> Any:
    hint = _HINTS[name]
    optional = type(None) in typing.get_args(hint)
    base = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
    if value is None:
        if optional:
            return None
        raise UserError(f"experiment.params.{name} needs a value")
    where = f"experiment.params.{name}"
    if base is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise UserError(f"{where} must be true or false (got {value!r})")
    if base is int:
        if isinstance(value, bool) or not (isinstance(value, int) or (
                isinstance(value, float) and value.is_integer())):
            try:
                value = int(str(value))
            except ValueError:
                raise UserError(f"{where} must be a whole number (got {value!r})") from None
        return int(value)
    if base is float:
        try:
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not math.isfinite(number):
            raise UserError(f"{where} must be a finite number (got {value!r})")
        return number
    return str(value)


def parse(values: Mapping[str, Any] | None) -> ExperimentParams:
    """The typed record of a composed `experiment.params` mapping; UserError on bad input."""
    values = dict(values or {})
    unknown = sorted(set(values) - set(KNOBS))
    if unknown:
        raise UserError(f"unknown setting experiment.params.{unknown[0]}"
                        f"{did_you_mean(unknown[0], KNOBS)} (known: {', '.join(KNOBS)})")
    converted = {}
    for f in dataclasses.fields(ExperimentParams):
        if f.name not in values:
            continue
        value = _convert(f.name, values[f.name])
        bounds = f.metadata.get("bounds")
        problem = bounds.problem(value) if bounds is not None and value is not None else None
        if problem:
            raise UserError(f"experiment.params.{f.name} {problem} (got {values[f.name]!r})")
        converted[f.name] = value
    return ExperimentParams(**converted)


def of(cfg: RunSettings | DictConfig) -> ExperimentParams:
    """The run's knobs. The configuration was checked at composition, so this only converts;
    a stored config of an older run is checked the same way."""
    if isinstance(cfg, RunSettings):
        return parse(cfg.experiment.params)
    experiment = cfg.get("experiment")
    raw = experiment.get("params") if experiment is not None else None
    values = OmegaConf.to_container(raw, resolve=True) if isinstance(raw, DictConfig) else raw
    return parse(values)
