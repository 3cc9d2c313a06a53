"""Search spaces: which settings a sweep may change, their levels, and how a point becomes a trial.

A space comes from a config group (`conf/space/<name>.yaml`, schema `SpaceConf`). Each parameter
sets one candidate factor: an environment variable (`env`), a server setting applied over the
target config (`server`), or the clock policy (`clock`). A null level means "leave it as the
baseline has it" (unset variable, the target's own flag, the node's clock policy), so the
baseline configuration is a point of the space and is measured like any other.

Conditional parameters (`when`) exist only while earlier parameters take given values; an
inactive parameter is absent from the assignment, so two assignments that differ only in an
inactive parameter are the same configuration (the same `Candidate`, sharing its trials).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import optuna

from orchestrator.errors import UserError
from orchestrator.gpu.base import ClockPolicy
from orchestrator.records import Candidate

KINDS = ("env", "server", "clock")
_ENV_NAME_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")
_MAX_ENUMERATED = 2_000_000  # configurations counted one by one before falling back to a bound

Assignment = dict[str, Any]


@dataclass(frozen=True)
class Param:
    """One dimension: categorical `values`, or a `low`..`high` range (optionally stepped)."""

    name: str
    kind: str
    values: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    integer: bool = False
    baseline: Any = None
    when: tuple[tuple[str, tuple[Any, ...]], ...] = ()

    @property
    def categorical(self) -> bool:
        return bool(self.values)

    def distribution(self) -> optuna.distributions.BaseDistribution:
        if self.categorical:
            return optuna.distributions.CategoricalDistribution(list(self.values))
        if self.integer:
            return optuna.distributions.IntDistribution(
                int(self.low), int(self.high), log=self.log, step=int(self.step or 1))
        return optuna.distributions.FloatDistribution(
            float(self.low), float(self.high), log=self.log, step=self.step)

    def levels(self) -> list[Any] | None:
        """Every level, or None for a continuous range (no grid)."""
        if self.categorical:
            return list(self.values)
        if self.integer:
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            return None
        n = int(math.floor((self.high - self.low) / self.step + 1e-9)) + 1
        return [round(self.low + i * self.step, 12) for i in range(n)]

    def contains(self, value: Any) -> bool:
        if self.categorical:
            return value in self.values
        if value is None or isinstance(value, bool) or not isinstance(value, int | float):
            return False
        return self.low <= value <= self.high

    def suggest(self, trial: optuna.Trial) -> Any:
        if self.categorical:
            return trial.suggest_categorical(self.name, list(self.values))
        if self.integer:
            return trial.suggest_int(self.name, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high),
                                   step=self.step, log=self.log)


def _param(name: str, conf: Mapping[str, Any], earlier: dict[str, Param]) -> Param:
    kind = str(conf.get("kind", "env"))
    if kind not in KINDS:
        raise UserError(f"space parameter {name}: kind must be one of {', '.join(KINDS)}")
    values = tuple(conf.get("values") or ())
    low, high, step = conf.get("low"), conf.get("high"), conf.get("step")
    integer, log = bool(conf.get("integer", False)), bool(conf.get("log", False))
    if values and (low is not None or high is not None):
        raise UserError(f"space parameter {name}: give either values or low/high, not both")
    if not values:
        if low is None or high is None or not float(low) < float(high):
            raise UserError(f"space parameter {name}: needs values, or low < high")
        if log and (float(low) <= 0 or step is not None):
            raise UserError(f"space parameter {name}: a log range needs low > 0 and no step")
        if step is not None and float(step) <= 0:
            raise UserError(f"space parameter {name}: step must be positive")
        if integer and any(v is not None and float(v) != int(v) for v in (low, high, step)):
            raise UserError(f"space parameter {name}: an integer range needs integer bounds")
    if len(set(map(repr, values))) != len(values):
        raise UserError(f"space parameter {name}: repeated value in {list(values)}")
    if kind == "env" and (not name or name[0].isdigit() or not set(name) <= _ENV_NAME_OK):
        raise UserError(f"space parameter {name!r}: not a valid environment variable name")
    if kind == "clock":
        if any(v is not None and not isinstance(v, str) for v in values):
            raise UserError(f"space parameter {name}: clock levels are policy names")
        for v in values:
            ClockPolicy.parse(v or "default")  # UserError naming the accepted forms
    when = []
    for other, allowed in (conf.get("when") or {}).items():
        if other not in earlier:
            raise UserError(f"space parameter {name}: 'when' names {other!r}, which must be "
                            "a parameter declared before it")
        allowed = tuple(allowed if isinstance(allowed, list | tuple) else [allowed])
        bad = [v for v in allowed if not earlier[other].contains(v)]
        if not allowed or bad:
            raise UserError(f"space parameter {name}: 'when' {other} in {list(allowed)}: "
                            f"{bad or 'empty'} not a level of {other}")
        when.append((str(other), allowed))
    p = Param(name, kind, values,
              None if low is None else float(low), None if high is None else float(high),
              None if step is None else float(step), log, integer, conf.get("baseline"),
              tuple(when))
    if p.baseline is not None and not p.contains(p.baseline):
        raise UserError(f"space parameter {name}: baseline {p.baseline!r} is not one of its levels")
    return p


@dataclass(frozen=True)
class SearchSpace:
    name: str
    params: tuple[Param, ...]

    @classmethod
    def from_conf(cls, conf: Mapping[str, Any] | None) -> SearchSpace:
        """Build and check a space from its config mapping. Raises UserError on bad input."""
        if not conf:
            raise UserError("sweep needs a search space: add space=NAME (e.g. space=nccl_pcie)")
        params: dict[str, Param] = {}
        for name, pconf in (conf.get("params") or {}).items():
            params[str(name)] = _param(str(name), pconf or {}, params)
        if not params:
            raise UserError(f"space {conf.get('name')!r} has no parameters")
        clocks = [p.name for p in params.values() if p.kind == "clock"]
        if len(clocks) > 1:
            raise UserError(f"space has more than one clock parameter: {clocks}")
        return cls(str(conf.get("name") or "space"), tuple(params.values()))

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)

    @staticmethod
    def active(param: Param, assignment: Mapping[str, Any]) -> bool:
        return all(other in assignment and assignment[other] in allowed
                   for other, allowed in param.when)

    def suggest(self, trial: optuna.Trial) -> Assignment:
        """Ask the trial for every active parameter, in declaration order."""
        out: Assignment = {}
        for p in self.params:
            if self.active(p, out):
                out[p.name] = p.suggest(trial)
        return out

    def normalize(self, assignment: Mapping[str, Any]) -> Assignment:
        """Keep only the active parameters (in order): the configuration's identity."""
        out: Assignment = {}
        for p in self.params:
            if p.name in assignment and self.active(p, out):
                out[p.name] = assignment[p.name]
        return out

    def baseline(self, target_conf: Mapping[str, Any]) -> Assignment:
        """The baseline's level of every active parameter; None where it is not a level.

        An unset `baseline` means what runs today: an unset variable, the target config's own
        value of a server setting (when it is one of the levels), the default clock policy."""
        out: Assignment = {}
        for p in self.params:
            if not self.active(p, out):
                continue
            value = p.baseline
            if value is None and p.kind == "server" and p.contains(target_conf.get(p.name)):
                value = target_conf.get(p.name)
            if value is None and p.kind == "clock" and p.contains("default"):
                value = "default"
            out[p.name] = value
        return out

    def representable(self, assignment: Mapping[str, Any]) -> bool:
        """Whether the assignment is a point Optuna can hold (every active level in range)."""
        norm = self.normalize(assignment)
        return all(self.param(n).contains(v) for n, v in norm.items()) and all(
            p.name in norm for p in self.params if self.active(p, norm))

    def distributions(self, assignment: Mapping[str, Any]) -> dict:
        return {n: self.param(n).distribution() for n in self.normalize(assignment)}

    def grid(self) -> dict[str, list[Any]] | None:
        """Optuna GridSampler's search space (every parameter), or None with a continuous one."""
        grid = {p.name: p.levels() for p in self.params}
        return None if any(v is None for v in grid.values()) else grid

    def configurations(self) -> Iterator[Assignment]:
        """Every distinct configuration (inactive parameters collapse), in grid order."""
        if self.grid() is None:
            raise ValueError("a continuous range has no finite set of configurations")

        def walk(i: int, partial: Assignment) -> Iterator[Assignment]:
            if i == len(self.params):
                yield dict(partial)
                return
            p = self.params[i]
            if not self.active(p, partial):
                yield from walk(i + 1, partial)
                return
            for level in p.levels() or ():
                partial[p.name] = level
                yield from walk(i + 1, partial)
                del partial[p.name]

        return walk(0, {})

    def size(self) -> int | None:
        """Distinct configurations; None when a range is continuous (infinitely many)."""
        grid = self.grid()
        if grid is None:
            return None
        bound = math.prod(len(v) for v in grid.values())
        if bound > _MAX_ENUMERATED:
            return bound
        return sum(1 for _ in itertools.islice(self.configurations(), _MAX_ENUMERATED))

    def candidate(self, base: Candidate, assignment: Mapping[str, Any],
                  target_conf: Mapping[str, Any]) -> Candidate:
        """The trial candidate of a configuration: the base candidate with the levels applied.

        A null level leaves the base's setting; a server level equal to the target config's own
        value is dropped, so the baseline's candidate is exactly the base candidate."""
        env, clock, server = base.env_dict, base.clock, base.server_dict
        for name, value in self.normalize(assignment).items():
            if value is None:
                continue
            kind = self.param(name).kind
            if kind == "env":
                env[name] = _env_text(value)
            elif kind == "clock":
                clock = str(value)
            elif target_conf.get(name) == value:
                server.pop(name, None)
            else:
                server[name] = value
        return Candidate.make(base.commit, base.patches, env, clock, server, base.packages)

    def label(self, assignment: Mapping[str, Any], baseline: Mapping[str, Any] | None = None) -> str:
        """`NCCL_PROTO=LL NCCL_ALGO=Tree`: the levels (that differ from the baseline)."""
        parts = [f"{n}={_show(v)}" for n, v in self.normalize(assignment).items()
                 if baseline is None or baseline.get(n) != v]
        return " ".join(parts) if parts else "baseline"


def _env_text(value: Any) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _show(value: Any) -> str:
    return "unset" if value is None else _env_text(value)


def check_server_params(space: SearchSpace, target_conf: Mapping[str, Any]) -> None:
    """A server parameter must name a setting of the target config (a typo would be ignored)."""
    for p in space.params:
        if p.kind == "server" and p.name not in target_conf:
            known = ", ".join(k for k in target_conf if k not in ("name", "env", "launcher"))
            raise UserError(f"space parameter {p.name}: not a setting of target "
                            f"{target_conf.get('name')!r} (known: {known})")
