"""Run directories: `runs/<run-id>/` with `config.yaml`, `trials.db` and per-trial folders.

A run directory is created only after every input has been validated, and it is created
atomically enough that a bad input never leaves a half-made one behind: the directory, the
resolved config and the store appear together, or the directory is removed again.
"""

from __future__ import annotations

import secrets
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator.errors import UserError
from orchestrator.redact import redact_config
from orchestrator.store import RunStore


def runs_root(cfg: DictConfig) -> Path:
    """`runs_dir` as an absolute path (relative to where sleuth was invoked)."""
    return Path(cfg.runs_dir).expanduser().resolve()


def new_run_id(command: str) -> str:
    return f"{time.strftime('%Y%m%d-%H%M%S')}-{command}-{secrets.token_hex(2)}"


def create_run(cfg: DictConfig) -> tuple[Path, RunStore]:
    """Create `runs/<run-id>/` with config.yaml and trials.db; pins run_id and runs_dir in cfg."""
    root = runs_root(cfg)
    run_id = cfg.run_id or new_run_id(cfg.command)
    run_dir = root / run_id
    if run_dir.exists():
        raise UserError(f"run directory {run_dir} already exists")
    cfg.run_id = run_id
    cfg.runs_dir = str(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir()
    except OSError as exc:
        raise UserError(f"cannot create run directory under {root}: {exc.strerror}") from exc
    try:
        # Written down redacted (orchestrator.redact); the run itself uses `cfg` as given.
        text = OmegaConf.to_yaml(redact_config(OmegaConf.to_container(cfg, resolve=True)))
        (run_dir / "config.yaml").write_text(text)
        store = RunStore.create(run_dir / "trials.db", run_id=run_id, command=cfg.command,
                                config_yaml=text)
    except BaseException:
        shutil.rmtree(run_dir, ignore_errors=True)
        raise
    return run_dir, store


def find_run(cfg: DictConfig, ref: str) -> Path:
    """A run given as a directory path or as a run id under runs_dir."""
    path = Path(ref).expanduser()
    if not path.is_dir():
        path = runs_root(cfg) / ref
    if not (path / "trials.db").is_file():
        raise UserError(f"no run {ref!r}: expected a run directory with trials.db")
    return path.resolve()


@dataclass
class RunState:
    """What a command reports at the end of its run (`failed` unless it says otherwise)."""

    status: str = "failed"


@contextmanager
def running(store: RunStore, run_dir: Path, out) -> Iterator[RunState]:
    """A command's run: prints its directory, and whatever happens records the final status
    (interrupted on Ctrl-C), closes the store and prints the directory again."""
    out.print(f"run directory: {run_dir}")
    state = RunState()
    try:
        yield state
    except KeyboardInterrupt:
        state.status = "interrupted"
        raise
    finally:
        store.set_status(state.status)
        store.close()
        out.print(f"run directory: {run_dir}")
