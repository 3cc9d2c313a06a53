"""Validation shared by commands: everything is checked before a run directory exists; and the
reopening every resumable command shares (`reopen_run`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from orchestrator.commands import parts
from orchestrator.config.settings import RunSettings, evolve, load_saved
from orchestrator.control import packages
from orchestrator.errors import UserError
from orchestrator.gpu.base import ClockPolicy
from orchestrator.metrics import regression_direction
from orchestrator.records import Candidate
from orchestrator.run import blocks
from orchestrator.store import RunStore
from orchestrator.system.envcheck import check_env
from orchestrator.system.redact import is_secret_name, secret_in_value, secret_source
from orchestrator.targets.registry import check_name
from orchestrator.ui import render
from orchestrator.workspace import Workspace

if TYPE_CHECKING:
    pass

_T = TypeVar("_T")

_ENV_NAME_OK = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def workspace(cfg: RunSettings) -> Workspace:
    """The repository's workspace (`repo` made absolute by `absolute_paths`; resolved here
    too, for settings that did not pass through it)."""
    if not cfg.repo:
        raise UserError("no repository given: add repo=PATH (a git repository)")
    repo = Path(str(cfg.repo)).expanduser().resolve()
    return Workspace(repo, cfg.runs_root / ".cache" / "worktrees")


def require_bench(cfg: RunSettings) -> None:
    """`target=command` measures nothing without its benchmark command."""
    if cfg.target.name == "command" and not str(cfg.target.bench).strip():
        raise UserError("target=command needs its benchmark command: add 'target.bench=CMD'"
                        " (run in each worktree; its last stdout line is a JSON object of"
                        " metrics or a number)")


def check_common(cfg: RunSettings) -> RunSettings:
    """Checks every command shares: target known, env names valid, runs_dir writable. Returns
    the settings with their paths made absolute (`absolute_paths`), which the run stores.

    Numbers (budgets, timeouts, sizes) are range-checked once when the configuration is
    composed (`orchestrator/config/checks.py`), not here."""
    check_name(cfg.target.name)
    if not cfg.reference:  # a reference run brings its own bench (`adopt_reference_config`)
        require_bench(cfg)
    cfg = absolute_paths(cfg)
    for env in (cfg.env, cfg.target.env):
        for key in env:
            if not key or key[0].isdigit() or not set(key) <= _ENV_NAME_OK:
                raise UserError(f"invalid environment variable name {key!r}")
            source = secret_source(str(env[key]))
            if source is not None:  # `env.X=${oc.env:HF_TOKEN}`: the token under another name
                raise UserError(f"{key} holds the value of {source}, a secret: export {key} in"
                                " the node's environment instead of passing it in the"
                                " configuration (sleuth stores configs)")
            if is_secret_name(key) or secret_in_value(str(env[key])):
                # Config is stored in the run directory; secrets must come from the node's
                # environment, which servers inherit and sleuth never writes down.
                raise UserError(f"{key} looks like a secret: export it in the environment instead"
                                " of passing it in the configuration (sleuth stores configs)")
        check_env(env)
    ClockPolicy.parse(cfg.clock)
    links = packages.find_links_checked(cfg.packages)  # absolute: nodes find it from anywhere
    if links:
        cfg = evolve(cfg, {"packages.find_links": links})
    if cfg.package.name and cfg.command != "bisect":
        raise UserError(f"package={cfg.package.name} searches releases: it is for sleuth bisect"
                        " (package=NAME good=V1 bad=V2); pin a version with"
                        " packages=[NAME==VERSION]")
    if cfg.was is not None and cfg.command not in ("bisect", "investigate"):
        raise UserError(f"was={cfg.was:g} states the level a regression is measured from: it is"
                        " for sleuth bisect and investigate")
    if cfg.was is not None and cfg.reference:
        raise UserError(f"was={cfg.was:g} and reference={cfg.reference} both state the good"
                        " level: give one (the reference run's own measurement is the better)")
    if cfg.command == "sweep":  # a sweep optimises: maximize | minimize (or auto)
        from orchestrator.config.sweep import maximize

        maximize(cfg.metric, cfg.direction)
    else:  # the others explain a regression: increase | decrease (or auto)
        regression_direction(cfg.metric, cfg.direction)
    check_target_available(cfg)
    check_nodes_free(cfg)
    root = cfg.runs_root
    probe = root if root.exists() else next((p for p in root.parents if p.exists()), root)
    if not os.access(probe, os.W_OK):
        raise UserError(f"runs_dir {root} is not writable")
    return cfg


def candidate(cfg: RunSettings, ws: Workspace) -> Candidate:
    """The candidate described by commit / patches / env / clock / packages, with refs resolved
    to SHAs; a pin pip cannot install is refused here, before anything is written."""
    sha = ws.resolve(str(cfg.commit))
    patches = []
    for p in cfg.patches:
        path = Path(str(p)).expanduser().resolve()
        if not path.is_file():
            raise UserError(f"patch file not found: {p}")
        patches.append(str(path))
    pins = packages.fixed_pins(cfg.packages)
    cand = Candidate.make(sha, patches, {str(k): str(v) for k, v in cfg.env.items()}, cfg.clock,
                          packages=pins)
    ws.check_patches(sha, patches)  # proves they apply, before anything is written
    packages.require(parts.package_plan(cfg), pins)
    return cand


def absolute_paths(cfg: RunSettings) -> RunSettings:
    """The settings with `repo` absolute, and the files the target names (`target.gpu_state`,
    a `target.python` given as a path), which are read where the server starts, in a
    worktree: a relative path is made absolute against the directory sleuth was started in,
    as the user meant it (and as the run's stored configuration then records it)."""
    changes: dict[str, str] = {}
    if cfg.repo:
        changes["repo"] = str(Path(str(cfg.repo)).expanduser().resolve())
    for key in ("gpu_state", "python"):
        value = str(getattr(cfg.target, key, "") or "")
        if not value or (key == "python" and "/" not in value):
            continue  # unset, or a command name looked up on PATH
        path = Path(value).expanduser()
        if not path.is_absolute():
            changes[f"target.{key}"] = str(path.resolve())
    return evolve(cfg, changes) if changes else cfg


def check_nodes_free(cfg: RunSettings) -> None:
    """Refuse, before Ray starts, a run whose every local node another live run holds (one
    free node is enough: the held ones are skipped with a line once the run starts). On a Ray
    cluster the nodes' own locks decide, once the actors start."""
    if cfg.cluster.kind != "local":
        return
    from orchestrator.runner.holder import held_message, holder_of

    root = cfg.runs_root / ".nodes"
    held = []
    for i in range(cfg.nodes):
        holder = holder_of(root / f"local-{i}")
        if holder is None:
            return
        held.append(held_message(f"local-{i}", holder))
    instead = (f", or give this run nodes of its own with another runs_dir=DIR (each runs_dir"
               f" has its own simulated nodes; this one is {cfg.runs_root})"
               if _simulated(cfg) else
               " (a node's server and clocks belong to the run holding it)")
    raise UserError(f"{held[0]}: wait for that run to finish{instead}")


def _simulated(cfg: RunSettings) -> bool:
    target = cfg.target
    return target.name == "sim" or getattr(target, "engine", None) == "sim"


def check_target_available(cfg: RunSettings) -> None:
    """The default target is a real SGLang server; on a machine without SGLang a run would
    start, fail every launch and end "untestable". Say so before anything is written, and name
    the two targets that need no SGLang. On a Ray cluster the nodes judge for themselves
    (their preflight runs `launch_server --help`), since the controller host need not have it."""
    target = cfg.target
    if target.name != "sglang" or getattr(target, "engine", None) == "sim":
        return
    if cfg.cluster.kind != "local":
        return
    python = str(getattr(target, "python", "") or "")
    if python:
        import subprocess

        try:
            found = subprocess.run([python, "-c", "import importlib.util as u, sys;"
                                    " sys.exit(u.find_spec('sglang') is None)"],
                                   capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            found = False
    else:
        import importlib.util

        found = importlib.util.find_spec("sglang") is not None
    if not found:
        where = f"target.python={python}" if python else "this Python"
        raise UserError(f"SGLang is not installed for {where}, and the default target is a real"
                        " SGLang server: add target=sim to run on the simulated node, or"
                        " target=command 'target.bench=CMD' to time any benchmark command")


def resume_notice(run_dir: Path, store) -> str:
    """What a resumed run starts from: trials that finished (reused as evidence) and trials
    that were interrupted (never evidence; what is still needed runs again)."""
    rows = store.trials()
    interrupted = sum(1 for r in rows if r.outcome is not None and r.outcome.value == "interrupted")
    finished = sum(1 for r in rows if r.finished) - interrupted
    return (f"resuming {run_dir.name}: {finished} finished trial{'s' if finished != 1 else ''}"
            f" reused, {interrupted} interrupted (not evidence; what is still needed runs again)")


def article(word: str) -> str:
    return ("an " if word[:1] in "aeiou" else "a ") + word


def reopen_run(run_dir: Path, command: str,
               prepare: Callable[[RunSettings], tuple[RunSettings, _T]]
               ) -> tuple[RunStore, RunSettings, _T]:
    """An interrupted `command` run, ready to continue: its store, its saved configuration
    (merged onto today's schema, `settings.load_saved`) and what `prepare(cfg)` rebuilt from
    it (the plan, the search space). `prepare` returns the settings the run continues with
    (the saved ones, or a new record: a budget replaced, a reference's settings adopted) and
    what it rebuilt. A run of another command, or one `prepare` refuses, closes the store
    again and raises; otherwise the trials left running are marked interrupted, the notice
    says what is reused, and the run is `running` again. One place, so the four resumable
    commands cannot drift apart."""
    store = RunStore.open(run_dir / "trials.db")
    try:
        if store.command != command:
            raise UserError(f"{run_dir.name} is {article(store.command or 'unknown')} run,"
                            f" not {article(command)}")
        store.claim()  # before anything is written: a live run is refused, not joined
        cfg, prepared = prepare(load_saved(store.config_yaml()))
    except BaseException:
        store.close()
        raise
    store.interrupt_unfinished()
    blocks.recover(store)
    render.console().print(resume_notice(run_dir, store))
    store.set_status("running")
    return store, cfg, prepared
