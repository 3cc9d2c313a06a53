"""Compose a run's configuration with Hydra's compose API.

Why the compose API and not `@hydra.main`: sleuth's CLI owns its own commands, exit codes and
run directories. `@hydra.main` would change the working directory, own logging and invent an
output directory; compose gives us only the merged, type-checked config.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from pathlib import Path

from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from orchestrator.config import schema
from orchestrator.config.checks import check_values
from orchestrator.config.overrides import check_overrides
from orchestrator.config.settings import RunSettings, settings_of, writable
from orchestrator.errors import UserError, did_you_mean

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def register(cs: ConfigStore | None = None) -> None:
    """Put the schemas where the YAML defaults lists (`- base_<name>`) find them."""
    cs = cs or ConfigStore.instance()
    cs.store(name="base_config", node=writable(schema.RunSettings))
    cs.store(group="target", name="base_sim", node=writable(schema.SimTargetConf))
    cs.store(group="target", name="base_sglang", node=writable(schema.SglangTargetConf))
    cs.store(group="target", name="base_command", node=writable(schema.CommandTargetConf))
    cs.store(group="bench", name="base_bench", node=writable(schema.BenchConf))
    cs.store(group="cluster", name="base_cluster", node=writable(schema.ClusterConf))
    cs.store(group="experiment", name="base_experiment", node=writable(schema.ExperimentConf))
    cs.store(group="space", name="base_space", node=writable(schema.SpaceConf))


def _first_line(exc: BaseException) -> str:
    """One line for the user: Hydra's message plus the first line of its cause, if any."""

    def line(e: BaseException) -> str:
        text = str(e).strip() or type(e).__name__
        return text.splitlines()[0].strip()

    msg = line(exc)
    cause = exc.__cause__
    if cause is not None and line(cause) not in msg:
        msg = f"{msg.rstrip('.')}: {line(cause)}"
    return msg


_UNKNOWN_KEY = re.compile(r"Key '([^']+)' not in '(\w+)'")
_UNKNOWN_OPTION = re.compile(r"Could not find '(\w+)/([^']+)'")


def group_options(group: str, config_dir: str | Path | None = None) -> list[str]:
    """The options of a config group (`target`: sim, sglang, ...), the user's own included."""
    dirs = [CONF_DIR / group]
    if config_dir is not None:
        dirs.insert(0, Path(config_dir).expanduser() / group)
    return sorted({p.stem for d in dirs if d.is_dir() for p in d.glob("*.yaml")})


def _with_hint(message: str, config_dir: str | Path | None) -> str:
    """Hydra's one line with the key or option meant by a typo, and a group's options: Hydra
    names what it could not find, not what there is."""
    m = _UNKNOWN_KEY.search(message)
    if m:
        record = getattr(schema, m.group(2), None)
        if record is not None and dataclasses.is_dataclass(record):
            names = [f.name for f in dataclasses.fields(record)]
            return message + did_you_mean(m.group(1), names)
        return message
    m = _UNKNOWN_OPTION.search(message)
    if m:
        options = group_options(m.group(1), config_dir)
        return (f"unknown {m.group(1)} {m.group(2)!r}{did_you_mean(m.group(2), options)}"
                f" (known: {', '.join(options)})")
    return message


# Keys under these dict nodes are open-ended (any environment variable name, any strategy knob):
# the user writes `env.NCCL_PROTO=LL128`, and we turn it into Hydra's add-or-override form `++`.
_OPEN_DICT_KEY = re.compile(
    r"^(?:(?:(?:target|good|bad)\.)?(?:env|experiment\.params)\.[^=]+|(?:good|bad)\.\w+)="
)


# An environment value is a string as typed: Hydra would read `env.X=false` as a bool and
# `env.X=0.10` as a float, and the server would get "False" and "0.1".
_ENV_KEY = re.compile(r"^(?:(?:target|good|bad)\.)?env\.[^=]+=")


def _as_string(override: str) -> str:
    key, _, value = override.partition("=")
    if not value or value[0] in "'\"" or value.startswith("${"):
        return override
    # Hydra: inside quotes only the quote and backslashes right before a quote are escaped.
    body = re.sub(r"(\\*)'", lambda m: m.group(1) * 2 + "\\'", value)
    trailing = len(body) - len(body.rstrip("\\"))
    return key + "='" + body + "\\" * trailing + "'"


# Values that are git revisions or paths, taken as typed: Hydra's grammar has no place for
# `HEAD~3`, `v1.2^`, `main@{1}` or `~/src/sglang`, and would read a short SHA of digits as an
# int (losing its leading zeros). Shell quoting never reaches sleuth, so they are quoted here.
_VERBATIM_KEY = re.compile(
    r"^(?:(?:good|bad)\.)?commit=|^(?:good|bad|repo|runs_dir|reference|run_id|out|then|now"
    r"|from_log)="
)


# `live=PID|URL` names the running server (`live.server`; `live.restart=true` sits beside it in
# the same group); a URL and a log pattern (a regular expression: brackets, parentheses) are
# strings as typed.
_LIVE_KEY = re.compile(r"^(\+{0,2})live=(.*)$", re.S)
_ALWAYS_STRING = re.compile(r"^(?:live\.server|log\.pattern)=")


def _live_override(override: str) -> str:
    m = _LIVE_KEY.match(override)
    if m:
        override = f"{m.group(1)}live.server={m.group(2)}"
    if _ALWAYS_STRING.match(override.lstrip("+")):
        return _as_string(override)
    return override


def _verbatim(override: str) -> str:
    if not _VERBATIM_KEY.match(override):
        return override
    value = override.partition("=")[2]
    if not value or value[0] in "[{" or value in ("null", "None"):
        return override
    return _as_string(override)


def _open_dict_overrides(overrides: list[str]) -> list[str]:
    return ["++" + (_as_string(o) if _ENV_KEY.match(o) else o) if _OPEN_DICT_KEY.match(o) else o
            for o in map(_package_override, map(_pins_override, overrides))]


# `bisect package=NAME` names the package whose releases are searched; `package.pre=true`
# sits beside it in the same group.
_PACKAGE_KEY = re.compile(r"^(\+{0,2})package=(.*)$", re.S)


# A bisect's endpoints are refs or versions, strings as typed: Hydra would read `good=1.10` as
# the float 1.1 (another version) and `good=0123456` as a number without its leading zero.
_ENDPOINT = re.compile(r"^(?:good|bad)=(?!null$)[A-Za-z0-9._+!-]+$")


def _package_override(override: str) -> str:
    m = _PACKAGE_KEY.match(override)
    if m:
        return f"{m.group(1)}package.name={m.group(2)}"
    return _as_string(override) if _ENDPOINT.match(override) else override


# Package pins (`packages=[flashinfer-python==0.2.3]`, `good.packages=[...]`): Hydra cannot
# read `==` inside an unquoted list, so each pin is quoted; `packages=` itself names the pins of
# the `packages` settings group (`packages.find_links=DIR` sits beside them).
_PINS_KEY = re.compile(r"^(\+{0,2})((?:good|bad)\.packages|packages(?:\.pins)?)=(.*)$", re.S)


def _pins_override(override: str) -> str:
    m = _PINS_KEY.match(override)
    if not m:
        return override
    prefix, key, value = m.groups()
    value = value.strip()
    items = value[1:-1] if value.startswith("[") and value.endswith("]") else value
    quoted = []
    for item in (i.strip() for i in items.split(",")):
        if item:
            quoted.append(item if item[0] in "'\"" else "'" + item.replace("'", "\\'") + "'")
    key = "packages.pins" if key == "packages" else key
    return f"{prefix}{key}=[{','.join(quoted)}]"


def _check_syntax(overrides: list[str]) -> None:
    """Name the override Hydra cannot parse (its own message does not say which one)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for o in overrides:
        try:
            parser.parse_override(o)
        except Exception as exc:
            why = str(exc).strip().splitlines()
            detail = next((ln for ln in why if not ln.startswith(("Error parsing", "See "))), "")
            raise UserError(
                f"cannot parse {o!r}{f' ({detail})' if detail else ''}: write key=value, and quote"
                " values holding '=', spaces or brackets for sleuth inside the shell's quotes,"
                " e.g. \"key='a=b'\""
            ) from exc


# Per-command defaults, applied before the user's overrides (which win). The demo runs on three
# simulated nodes and ends with a short grid sweep of the two NCCL knobs that matter most: all 12
# configurations, four restarts each. Three sim nodes on a 2-core machine time each other's
# trials, so a restart scatters by about 3%, while the space's best is only 4% better than the
# baseline and the LL variants are 2-3% off it: with two restarts each, 2 of 3 demos confirmed
# an LL variant, or none.
#
# `investigate recover=true` ends with the same grid, two restarts a configuration: short,
# and on a real node's lower noise usually enough to bring back a lost setting.
COMMAND_DEFAULTS: dict[str, list[str]] = {
    "demo": ["target=sim", "nodes=3", "space=nccl_quick", "trials=48", "sampler=grid",
             "experiment.params.restarts=4"],
    "investigate": ["space=nccl_quick", "trials=24", "sampler=grid"],
}

# `target=command` reports its own metrics; without `metric=` its bench's bare number
# (`value`) is the metric, not SGLang's verify_ms.
TARGET_METRICS = {"command": "value"}


def compose_config(
    command: str,
    overrides: list[str],
    *,
    config_dir: str | Path | None = None,
) -> DictConfig:
    """Return the composed config for `command` with the user's `key=value` overrides.

    `config_dir` is a user's own directory of config groups (e.g. `target/mynode.yaml`), searched
    before the built-in ones. Any composition error (unknown key, wrong type, unknown group
    option, malformed override) becomes a `UserError` with one line.
    """
    if not CONF_DIR.is_dir():
        raise UserError(f"sleuth's config directory is missing: {CONF_DIR}")
    register()
    check_overrides(overrides)
    overrides = [_verbatim(_live_override(_pins_override(o))) for o in overrides]
    _check_syntax(overrides)
    extra: list[str] = []
    if config_dir is not None:
        user_dir = Path(config_dir).expanduser().resolve()
        if not user_dir.is_dir():
            raise UserError(f"--config-dir {config_dir}: not a directory")
        extra.append(f"hydra.searchpath=[file://{user_dir}]")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base=None):
            cfg = compose(
                config_name="config",
                overrides=[*extra,
                           *_open_dict_overrides([*COMMAND_DEFAULTS.get(command, []), *overrides]),
                           f"command={command}"],
            )
    except Exception as exc:  # Hydra/OmegaConf raise many types; all mean "bad input" here.
        raise UserError(f"bad configuration: {_with_hint(_first_line(exc), config_dir)}") from exc
    finally:
        GlobalHydra.instance().clear()
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except Exception as exc:
        raise UserError(f"bad configuration: {_first_line(exc)}") from exc
    if not any(o.lstrip("+~").split("=", 1)[0] == "metric" for o in overrides):
        default_metric = TARGET_METRICS.get(str(cfg.target.get("name")))
        if default_metric:
            cfg.metric = default_metric
    check_values(cfg)  # numbers and names, once, for every command
    return cfg


def compose_settings(command: str, overrides: list[str], *,
                     config_dir: str | Path | None = None) -> RunSettings:
    """The typed settings of `compose_config`'s configuration (what every command runs with)."""
    return settings_of(compose_config(command, overrides, config_dir=config_dir))


@functools.lru_cache(maxsize=8)
def defaults(command: str, target: str | None) -> RunSettings:
    """What `command` composes to with no command line but the target group `target`: a
    setting that differs from it was chosen by the user (a word, or a group of their own
    `--config-dir`). The one place that asks; a next step carries those settings
    (`commands/next_step`) and a reference's settings replace only the others
    (`commands/compare_reference`). Composed once per process, not once per question."""
    return compose_settings(command, [f"target={target}"] if target else [])


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def shown_yaml(cfg: DictConfig) -> str:
    """The resolved configuration as `--cfg` prints it: redacted as the run directory stores
    it (an interpolation such as `${oc.env:HF_TOKEN}` resolves to the token itself)."""
    from orchestrator.system.redact import redact_config

    tree = OmegaConf.to_container(cfg, resolve=True)
    return OmegaConf.to_yaml(OmegaConf.create(redact_config(tree)))
