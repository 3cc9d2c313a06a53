"""Refusals made on the raw command line, before Hydra composes anything.

Why a step before composition: importing Hydra and composing the configuration is most of a
refusal's CPU time (about half a second of a core; several seconds on a loaded host), and Ray
and SciPy come later still. A typo in a metric or a target, or an attempt to resume a run that
another process is writing, can be judged from the words the user typed: this step does that
with the standard library and the metric table, and raises the same one-line `UserError` the
later checks would. What it cannot judge alone (a user's own config group, a key nested in the
schema, a repository) is left to composition and the command's checks, which stay in force.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.errors import UserError, did_you_mean
from orchestrator.store.locate import DEFAULT_RUNS_DIR, is_run, locate_run
from orchestrator.store.writer import being_written, writer_of

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"
DEFAULT_TARGET = "sglang"  # conf/config.yaml's defaults list
# Commands that reopen the run `run_id=` names when it exists, and continue writing it.
REOPENING = ("bisect", "isolate", "sweep", "investigate", "resume")


def _value(override: str) -> str:
    """An override's value as the user meant it (the CLI quotes a positional run for Hydra)."""
    value = override.split("=", 1)[1].strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
        value = value[1:-1].replace("\\'", "'").replace("\\\\", "\\")
    return value


def given(overrides: list[str]) -> dict[str, str]:
    """The command line's plain `key=value` settings (the last word of each key wins here; a
    repeated key is refused by `overrides.check_repeats` before this runs)."""
    return {o.split("=", 1)[0].strip(): _value(o) for o in overrides
            if "=" in o and not o.startswith(("+", "~"))}


def target_group(name: str, config_dir: str | None) -> Path | None:
    """The YAML file of target group `name`: the user's config directory first, as Hydra
    searches it; None if neither has it."""
    for base in ([Path(config_dir).expanduser()] if config_dir else []) + [CONF_DIR]:
        path = base / "target" / f"{name}.yaml"
        if path.is_file():
            return path
    return None


def _reports_own_metrics(group: Path) -> bool:
    """Whether a built-in target group is the `command` target (its bench's own JSON keys)."""
    return "base_command" in group.read_text()


def check(command: str, overrides: list[str], config_dir: str | None = None) -> None:
    """Raise the one-line UserError a later check would, for what the raw words decide."""
    values = given(overrides)
    target = values.get("target", DEFAULT_TARGET)
    group = target_group(target, config_dir)
    if group is None:
        options = sorted({p.stem for base in ([Path(config_dir).expanduser()] if config_dir
                                              else []) + [CONF_DIR]
                          for p in (base / "target").glob("*.yaml")})
        raise UserError(f"unknown target {target!r}{did_you_mean(target, options)} (known:"
                        f" {', '.join(options)})")
    if "metric" in values and group.parent.parent == CONF_DIR:
        from orchestrator.metrics import check_metric

        check_metric(values["metric"], custom=_reports_own_metrics(group))
    _check_reopened_run(command, values)


def _check_reopened_run(command: str, values: dict[str, str]) -> None:
    """A run being reopened (`sleuth resume RUN`, `sleuth bisect run_id=RUN`) that another
    sleuth process still writes is refused here, as `RunStore.claim` would refuse it later."""
    run = values.get("run_id")
    if command not in REOPENING or not run:
        return
    runs_dir = values.get("runs_dir", DEFAULT_RUNS_DIR)
    if command == "resume":
        try:
            run_dir = locate_run(run, runs_dir)
        except UserError:
            return  # the command says so, after its own checks of the request
    else:
        run_dir = Path(runs_dir).expanduser() / run
        if not is_run(run_dir):
            return  # a new run of that id
    who = writer_of(run_dir)
    if who:
        raise UserError(being_written(run_dir, who))
    if command == "resume":
        kind = _command_of(run_dir)
        if kind is not None and kind not in REOPENING:
            raise UserError(not_resumable(run_dir, kind))


def not_resumable(run_dir: Path, kind: str) -> str:
    article = "an" if kind[:1] in "aeiou" else "a"
    return f"{run_dir.name} is {article} {kind or 'unknown'} run: it cannot be resumed"


def _command_of(run_dir: Path) -> str | None:
    """The command that made the run, read without the store's module (None: cannot tell)."""
    import sqlite3

    # `immutable`: read without the WAL's shared-memory file (nothing may be written beside a
    # refused run); no process writes it (its writer lock was just found free), and a row
    # still in the WAL only reads as "cannot tell", which leaves the refusal to the command.
    try:
        conn = sqlite3.connect(f"file:{run_dir / 'trials.db'}?mode=ro&immutable=1", uri=True)
        try:
            row = conn.execute("SELECT command FROM runs").fetchone()
        finally:
            conn.close()
    except sqlite3.Error:
        return None
    return str(row[0] or "") if row else None
