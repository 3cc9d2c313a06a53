"""The typed settings tree: built once at the edge, read everywhere below it.

Hydra composes and checks the configuration (`compose.py`, `checks.py`); this module turns the
result into the frozen classes of `schema.py` (a `RunSettings` at the top, the target's own
class under `target`), so that no layer below `config/` and `cli.py` reads an OmegaConf node,
repeats a default, or re-casts a value. A change is a new record (`evolve`), never an
assignment into the tree: the settings a controller was built with are the settings it keeps.

A run's configuration is stored with it (`config.yaml`, and the store's copy). `load_saved`
merges such a text onto the schema: a setting added after the run was written takes its
default and a setting since removed is dropped, so an old run still resumes.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from omegaconf import DictConfig, OmegaConf

from orchestrator.config import params as experiment_params
from orchestrator.config.schema import TARGET_SCHEMAS, BenchConf, RunSettings, TargetConf
from orchestrator.errors import UserError

T = TypeVar("T")

__all__ = ["BenchConf", "RunSettings", "TargetConf", "as_dict", "bench_record", "build",
           "evolve", "load_saved", "params", "saved_values", "settings_of", "target_record",
           "to_yaml"]


def settings_of(cfg: DictConfig) -> RunSettings:
    """The typed tree of a composed (and checked) configuration."""
    values = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(values, dict)
    return build(values)


def load_saved(text: str | None) -> RunSettings:
    """A stored run's configuration merged onto today's schema (see the module docstring):
    what the schema no longer knows is dropped, what it added takes its default, and each
    value is checked and converted to its field's type as at composition."""
    values = _known(RunSettings, saved_values(text))
    layers: list[Any] = [OmegaConf.structured(writable(RunSettings))]
    target = values.get("target")
    if isinstance(target, Mapping):
        cls = TARGET_SCHEMAS.get(str(target.get("name", "")))
        if cls is None:
            raise UserError(f"unknown target {target.get('name')!r} in the run's configuration")
        values["target"] = _known(cls, target)
        layers.append({"target": OmegaConf.structured(writable(cls))})
    try:
        merged = OmegaConf.merge(*layers, values)
        plain = OmegaConf.to_container(merged, resolve=True)
    except Exception as exc:  # OmegaConf raises many types; all mean "not this schema"
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"the run's stored configuration does not fit the schema: {first}") \
            from exc
    assert isinstance(plain, dict)
    return build(plain)


def _known(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """`values` without the keys `cls` (and the records nested in it) does not declare."""
    hints = typing.get_type_hints(cls)
    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            continue
        out[f.name] = _known_value(hints[f.name], values[f.name])
    return out


def _known_value(hint: Any, value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    if dataclasses.is_dataclass(hint):
        return _known(hint, value)  # type: ignore[arg-type]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return _known_value(inner[0], value) if len(inner) == 1 else value
    if origin is dict:
        return {k: _known_value(args[1], v) for k, v in value.items()}
    return value


def saved_values(text: str | None) -> dict[str, Any]:
    """A stored configuration as written, plain containers, nothing filled in: for comparing
    two runs' sections as they were recorded (`orchestrator/run/noise_prior.py`)."""
    values = OmegaConf.to_container(OmegaConf.create(text or "{}"), resolve=True)
    if not isinstance(values, dict):
        raise UserError("the run's stored configuration is not a mapping")
    return values


def build(values: Mapping[str, Any]) -> RunSettings:
    """`RunSettings` from a plain mapping: missing keys take the schema's defaults, keys the
    schema does not know are dropped (a saved run's; a composed config has none)."""
    return _record(RunSettings, values)


def target_record(conf: TargetConf | Mapping[str, Any]) -> TargetConf:
    """A target's settings as its record; a plain mapping (a sim oracle's, a test's) is built
    into its target's class with the schema's defaults for what it leaves out."""
    return conf if isinstance(conf, TargetConf) else _target(conf)


def bench_record(bench: BenchConf | Mapping[str, Any]) -> BenchConf:
    """The benchmark settings as their record (see `target_record`)."""
    return bench if isinstance(bench, BenchConf) else _record(BenchConf, bench)


def params(settings: RunSettings) -> experiment_params.ExperimentParams:
    """The run's `experiment.params`, typed (`orchestrator/config/params.py`)."""
    return experiment_params.parse(settings.experiment.params)


def as_dict(record: Any) -> Any:
    """Plain containers of a settings record (for YAML, JSON and mappings handed to tools)."""
    if dataclasses.is_dataclass(record) and not isinstance(record, type):
        return {f.name: as_dict(getattr(record, f.name)) for f in dataclasses.fields(record)}
    if isinstance(record, Mapping):
        return {k: as_dict(v) for k, v in record.items()}
    if isinstance(record, list | tuple):
        return [as_dict(v) for v in record]
    return record


def to_yaml(settings: RunSettings | Mapping[str, Any]) -> str:
    """The YAML a run stores (the same text the composed config gave before it was typed)."""
    values = settings if isinstance(settings, Mapping) else as_dict(settings)
    return OmegaConf.to_yaml(OmegaConf.create(values))


def evolve(record: T, changes: Mapping[str, Any] | None = None, **more: Any) -> T:
    """A copy of `record` with some values replaced; a key may be dotted (`trial.retries`),
    and a mapping given for a record field is built into that field's class."""
    out: Any = record
    for key, value in {**(changes or {}), **more}.items():
        out = _replace(out, key.split("."), value)
    return out


def _replace(record: Any, path: list[str], value: Any) -> Any:
    name, rest = path[0], path[1:]
    if not dataclasses.is_dataclass(record):
        if isinstance(record, Mapping):  # an open mapping (env, experiment.params)
            inner = _replace(record.get(name), rest, value) if rest else value
            return {**record, name: inner}
        raise KeyError(f"cannot set {'.'.join(path)} inside {type(record).__name__}")
    hints = typing.get_type_hints(type(record))
    if name not in hints:
        raise KeyError(f"{type(record).__name__} has no setting {name!r}")
    if rest:
        return dataclasses.replace(record, **{name: _replace(getattr(record, name), rest, value)})
    if name == "target" and isinstance(value, Mapping):
        value = _target(value)
    else:
        value = _value(hints[name], value)
    return dataclasses.replace(record, **{name: value})


def _record(cls: type[T], values: Mapping[str, Any]) -> T:
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name not in values:
            continue
        value = values[f.name]
        if cls is RunSettings and f.name == "target":
            kwargs[f.name] = _target(value) if isinstance(value, Mapping) else value
        else:
            kwargs[f.name] = _value(hints[f.name], value)
    return cls(**kwargs)


def _target(values: Mapping[str, Any]) -> TargetConf:
    name = str(values.get("name", ""))
    cls = TARGET_SCHEMAS.get(name)
    if cls is None:
        raise UserError(f"unknown target {name!r} (known: {', '.join(TARGET_SCHEMAS)})")
    return _record(cls, values)


@functools.cache
def writable(cls: type) -> type:
    """A mutable twin of a frozen schema class, for Hydra to compose over.

    The schema's classes are frozen because they are the typed settings every layer reads
    (`orchestrator/config/settings.py`); OmegaConf marks a frozen class's nodes read-only,
    which would refuse every override. The twin has the same fields, defaults and metadata;
    its nested schema classes are twins too."""
    hints = typing.get_type_hints(cls)
    fields = []
    for f in dataclasses.fields(cls):
        kept: dict[str, Any] = {"metadata": f.metadata}
        if f.default is not dataclasses.MISSING:
            kept["default"] = f.default
        if f.default_factory is not dataclasses.MISSING:
            factory = f.default_factory
            kept["default_factory"] = (writable(factory) if dataclasses.is_dataclass(factory)
                                       else factory)
        fields.append((f.name, _twin_hint(hints[f.name]), dataclasses.field(**kept)))
    twin = dataclasses.make_dataclass(cls.__name__, fields)
    twin.__module__ = cls.__module__
    twin.__doc__ = cls.__doc__
    return twin


def _twin_hint(hint: Any) -> Any:
    if dataclasses.is_dataclass(hint):
        return writable(hint)  # type: ignore[arg-type]
    args = typing.get_args(hint)
    if not args or not any(dataclasses.is_dataclass(a) for a in args):
        return hint
    twins = tuple(_twin_hint(a) for a in args)
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        return typing.Union[twins]  # noqa: UP007 - built from a tuple
    return origin[twins]


def _value(hint: Any, value: Any) -> Any:
    """`value` as the field's type holds it: schema records built, containers copied."""
    if value is None:
        return None
    if dataclasses.is_dataclass(hint):
        return value if isinstance(value, hint) else _record(hint, value)  # type: ignore[arg-type]
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (types.UnionType, typing.Union):
        inner = [a for a in args if a is not type(None)]
        return _value(inner[0], value) if len(inner) == 1 else value
    if origin is dict and isinstance(value, Mapping):
        return {k: _value(args[1], v) for k, v in value.items()}
    if origin is list and isinstance(value, list | tuple):
        return [_value(args[0], v) for v in value]
    return value
