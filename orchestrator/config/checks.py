"""Values checked once, right after composition, against the bounds the schema declares.

Hydra/OmegaConf check a config's shape and types; this checks what the numbers and names mean:
every float finite, each `ranged` field inside its bounds, each `choice` field one of its
options, the shared `experiment.params` knobs numbers in range, and a `run_id` that names a
directory inside `runs_dir` (never `../x` or an absolute path). One bad value is one line and
exit 2, before any command has looked at the configuration or written anything.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchestrator.config import schema
from orchestrator.errors import UserError

# Commands whose `run_id` names an existing run, possibly by its directory path (`sleuth
# report runs/X`); every other command may create `runs_dir/<run_id>`.
RUN_PATH_COMMANDS = frozenset({"resume", "report"})


def check_values(cfg: DictConfig) -> None:
    """Raise a one-line UserError for the first value the schema does not allow."""
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    _check_dataclass(schema.Config, values, "")
    target = values.get("target") or {}
    target_schema = schema.TARGET_SCHEMAS.get(str(target.get("name", "")))
    if target_schema is not None:
        _check_dataclass(target_schema, target, "target.")
    params = (values.get("experiment") or {}).get("params") or {}
    for key, bounds in schema.PARAM_BOUNDS.items():
        if key in params:
            _check_number(f"experiment.params.{key}", params[key], bounds)
    check_run_id(values.get("run_id"), str(values.get("command", "")))


def check_run_id(run_id: Any, command: str) -> None:
    """A new run's id is one plain directory name under runs_dir."""
    if run_id is None or command in RUN_PATH_COMMANDS:
        return
    text = str(run_id)
    bad = (not text or text in (".", "..") or text.startswith(".") or "/" in text
           or "\\" in text or len(text) > 200 or not text.isprintable())
    if bad:
        raise UserError(f"run_id {text!r} must be a plain name (letters, digits, '-', '_'; no"
                        " '/', no leading '.'): runs live in runs_dir/<run_id>")


def _check_dataclass(cls: type, values: Mapping, prefix: str) -> None:
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name not in values:
            continue
        value = values[f.name]
        path = f"{prefix}{f.name}"
        nested = _dataclass_of(hints.get(f.name))
        if nested is not None and isinstance(value, Mapping):
            _check_dataclass(nested, value, f"{path}.")
            continue
        if "choices" in f.metadata:
            options = f.metadata["choices"]
            if value not in options and not (value is None and f.default is None):
                shown = ", ".join(str(o) for o in options if o is not None)
                raise UserError(f"{path} must be one of {shown} (got {value!r})")
            continue
        bounds = f.metadata.get("bounds")
        if bounds is not None:
            if value is not None:
                _check_number(path, value, bounds)
        elif isinstance(value, float) and not math.isfinite(value):
            raise UserError(f"{path} must be a finite number (got {value!r})")


def _check_number(path: str, value: Any, bounds: schema.Bounds) -> None:
    problem = bounds.problem(value)
    if problem:
        raise UserError(f"{path} {problem} (got {value!r})")


def _dataclass_of(hint: Any) -> type | None:
    """The dataclass a field holds (`BenchConf`, or `SpaceConf` in `SpaceConf | None`)."""
    if dataclasses.is_dataclass(hint):
        return hint  # type: ignore[return-value]
    for arg in typing.get_args(hint):
        if dataclasses.is_dataclass(arg):
            return arg  # type: ignore[return-value]
    return None
