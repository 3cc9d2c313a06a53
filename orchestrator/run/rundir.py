"""Run directories: `runs/<run-id>/` with `config.yaml`, `trials.db` and per-trial folders.

A run directory is created only after every input has been validated, and it is created
atomically enough that a bad input never leaves a half-made one behind: the directory, the
resolved config and the store appear together, or the directory is removed again.

Some inputs can only be judged on the nodes: a server flag the installed SGLang rejects, a
clock beyond what the GPUs support, a cluster address nobody answers at, nodes held by another
run. Those are found while the controller starts, after the directory exists; `running` then
removes the directory again as long as no trial was begun, so such a refusal also leaves
nothing behind, and the directory is announced only once the first trial is about to run.
"""

from __future__ import annotations

import errno
import secrets
import shutil
import sqlite3
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.config.settings import load_saved, to_yaml
from orchestrator.errors import DiskFull, NodesLost, RunInterrupted, SleuthError, UserError
from orchestrator.store import RunStore
from orchestrator.system.redact import redact_config


def new_run_id(command: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{secrets.token_hex(2)}"


def create_run(config: Mapping[str, Any]) -> tuple[Path, RunStore]:
    """Create `runs/<run-id>/` with config.yaml and trials.db. `config`: the whole
    configuration as the run stores it, pinned (`run_id` chosen, `runs_dir` absolute: the
    command's `pin_run`); a plain mapping, since all this module does with it is write it
    down."""
    root, run_id = Path(str(config["runs_dir"])), str(config["run_id"])
    run_dir = root / run_id
    if run_dir.exists():
        raise UserError(f"run directory {run_dir} already exists")
    made_root = not root.exists()
    try:
        root.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir()
    except OSError as exc:
        raise UserError(f"cannot create run directory under {root}: {exc.strerror}") from exc
    try:
        # Written down redacted (orchestrator.system.redact); the run itself uses its settings
        # as given.
        text = to_yaml(redact_config(dict(config)))
        (run_dir / "config.yaml").write_text(text)
        store = RunStore.create(run_dir / "trials.db", run_id=run_id,
                                command=str(config["command"]),
                                config_yaml=text)
        store.claim()
    except BaseException as exc:
        shutil.rmtree(run_dir, ignore_errors=True)
        if no_space(exc):
            raise DiskFull(f"no space left on device under {root}: free some space") from exc
        raise
    store.fresh = True
    store.made_root = made_root
    return run_dir, store


def no_space(exc: BaseException) -> bool:
    """An error that means the disk (or the user's quota) is full."""
    if isinstance(exc, DiskFull):
        return True
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    return isinstance(exc, sqlite3.OperationalError) and "disk is full" in str(exc)


@dataclass
class RunState:
    """What a command reports at the end of its run (`failed` unless it says otherwise)."""

    status: str = "failed"


@contextmanager
def running(store: RunStore, run_dir: Path, out) -> Iterator[RunState]:
    """A command's run: announces its directory, and whatever happens records the final status
    (interrupted on Ctrl-C or a full disk), closes the store and prints the directory again.

    A run this process just created that is refused before its first trial (bad input only
    the nodes can judge, Ctrl-C while Ray starts) is removed again: nothing written."""
    announced = False
    simulated = _simulated(store)
    header = f"run directory: {run_dir}" + (" · simulated node" if simulated else "")
    if simulated:  # before anything else the run prints
        out.print(SIMULATED_NOTE)

    def announce() -> None:
        nonlocal announced
        if not announced:
            announced = True
            out.print(header)

    fresh = store.fresh and not store.trials()
    if fresh:
        store.on_first_trial = announce
    else:
        announce()
    state = RunState()
    try:
        yield state
    except (SleuthError, KeyboardInterrupt) as exc:
        # Refused before anything ran: gone again. Not so a run whose nodes were lost while
        # they started (a fault, not bad input): it is kept, interrupted, to resume.
        if fresh and store.on_first_trial is not None and not isinstance(exc, NodesLost):
            store.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            if store.made_root:
                try:
                    run_dir.parent.rmdir()  # runs_dir itself, when this run made it
                except OSError:
                    pass  # not empty: another run (or the caches) lives there
            state.status = ""
            raise
        if isinstance(exc, KeyboardInterrupt):
            state.status = "interrupted"
            out.print(resume_hint(store.command, run_dir))
            raise
        if isinstance(exc, RunInterrupted) or no_space(exc):
            state.status = "interrupted"
            raise type(exc)(_interrupted_message(exc, run_dir, store.command)) from exc
        raise
    except (OSError, sqlite3.OperationalError) as exc:
        if no_space(exc):
            state.status = "interrupted"
            raise DiskFull(_interrupted_message(exc, run_dir, store.command)) from exc
        raise
    finally:
        if state.status:
            try:
                store.set_status(state.status)
            except DiskFull:
                pass  # even the reserve is gone; resume treats the run as interrupted anyway
            store.close()
            again = announced
            announce()
            if again:
                out.print(f"run directory: {run_dir}")


SIMULATED_NOTE = "simulated node (target=sim): modeled times, no GPU was measured"
RESUMABLE = ("bisect", "isolate", "sweep", "investigate")


def _simulated(store: RunStore) -> bool:
    from orchestrator.targets.registry import is_simulated

    try:
        return is_simulated(load_saved(store.config_yaml()).target)
    except Exception:  # noqa: BLE001 - a header is no reason to fail a run
        return False


def run_argument(run_dir: Path) -> str:
    """How to name a run on the command line: its id, and its runs_dir unless it is ./runs."""
    if run_dir.parent == Path("runs").resolve():
        return run_dir.name
    return f"{run_dir.name} runs_dir={run_dir.parent}"


def resume_hint(command: str, run_dir: Path) -> str:
    """The line a stopped run ends with: how to continue it, or that it cannot be."""
    if command in RESUMABLE:
        return (f"interrupted: every finished trial is kept; continue with: sleuth resume"
                f" {run_argument(run_dir)}")
    return (f"interrupted: the finished trials are kept in {run_dir}; a {command} run is not"
            " resumable, run it again")


def _interrupted_message(exc: BaseException, run_dir: Path, command: str = "") -> str:
    what = str(exc) if isinstance(exc, SleuthError) else f"no space left on device ({exc})"
    hint = "free some space" if no_space(exc) else "when the nodes are back"
    if command and command not in RESUMABLE:
        return (f"{what}; run {run_dir.name} is interrupted with every finished trial kept: a"
                f" {command} run is not resumable, {hint} and run it again")
    return (f"{what}; run {run_dir.name} is interrupted with every finished trial kept:"
            f" {hint}, sleuth resume {run_argument(run_dir)}")
