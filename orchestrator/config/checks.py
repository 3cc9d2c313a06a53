"""Values checked once, right after composition, against the bounds the schema declares.

Hydra/OmegaConf check a config's shape and types; this checks what the numbers and names mean:
every float finite, each `ranged` field inside its bounds, each `choice` field one of its
options, every `experiment.params` knob known, typed and in range (`params.py`), and a `run_id` that names a
directory inside `runs_dir` (never `../x` or an absolute path). One bad value is one line and
exit 2, before any command has looked at the configuration or written anything.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import math
import typing
from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

from orchestrator.config import params as experiment_params
from orchestrator.config import schema
from orchestrator.errors import UserError

# Commands whose `run_id` names an existing run, possibly by its directory path (`sleuth
# report runs/X`); every other command may create `runs_dir/<run_id>`.
RUN_PATH_COMMANDS = frozenset({"resume", "report"})


def check_values(cfg: DictConfig) -> None:
    """Raise a one-line UserError for the first value the schema does not allow."""
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    _check_dataclass(schema.RunSettings, values, "")
    target = values.get("target") or {}
    target_schema = schema.TARGET_SCHEMAS.get(str(target.get("name", "")))
    if target_schema is not None:
        _check_dataclass(target_schema, target, "target.")
    experiment_params.parse((values.get("experiment") or {}).get("params"))
    check_env_values(values)
    check_host(target)
    check_run_id(values.get("run_id"), str(values.get("command", "")))


def check_env_values(values: Mapping) -> None:
    """An environment value is one line of printable text.

    A newline (`env.NCCL_DEBUG='INFO\nX=1'`) or another control character would reach the
    server's environment as typed, but every place that shows or stores an environment (the
    fingerprint, the `env` dump of a server log, a shell a user pastes it into) reads it as a
    second variable or a broken line."""
    places = [("env", values.get("env")), ("target.env", (values.get("target") or {}).get("env"))]
    for side in ("good", "bad"):
        spec = values.get(side)
        if isinstance(spec, Mapping):
            places.append((f"{side}.env", spec.get("env")))
    for where, env in places:
        if not isinstance(env, Mapping):
            continue
        for name, value in env.items():
            if value is not None and not str(value).isprintable():
                raise UserError(f"{where}.{printable_name(name)}: the value holds a control"
                                f" character ({str(value)!r}); environment values are one line"
                                " of printable text")


def check_host(target: Mapping) -> None:
    """A server under test listens on loopback unless the user says otherwise explicitly."""
    host = str(target.get("host") or "127.0.0.1").strip("[]")
    if host == "localhost" or target.get("allow_remote") is True:
        return
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False  # a name other than localhost may resolve to any interface
    if not loopback:
        raise UserError(f"target.host={host} makes the server under test reachable from other"
                        " machines; keep the default 127.0.0.1 (the benchmark client runs on the"
                        " same node), or add target.allow_remote=true if that is meant")


def printable_name(name: Any) -> str:
    return repr(name) if not str(name).isprintable() else str(name)


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
