"""Who writes a run: the `flock` on `.writer.lock` in its directory (`RunStore.claim` takes it).

Kept apart from the store so that a refusal to reopen a run that another process is writing
can be made from the raw command line, before Hydra, Ray or SciPy are imported
(`config/early.py`): it needs only `fcntl` and the directory.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

# Held by the one process that writes a run (`RunStore.claim`).
WRITER_LOCK = ".writer.lock"


def holder_text(raw: bytes) -> str:
    """"sleuth COMMAND (pid N)" from the lock file's "N COMMAND" line."""
    holder = raw.decode("utf-8", "replace").split()
    return f"sleuth {holder[1]} (pid {holder[0]})" if len(holder) >= 2 else "another sleuth process"


def writer_of(run_dir: Path) -> str | None:
    """Who writes the run now: "sleuth COMMAND (pid N)", "" when nobody does (its writer is
    gone, however it went), None when that cannot be told (a run from before the writer lock, a
    directory whose lock file cannot be read). Never takes the lock."""
    try:
        descriptor = os.open(run_dir / WRITER_LOCK, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return holder_text(os.pread(descriptor, 200, 0))
        except OSError:
            return None
        return ""
    finally:
        os.close(descriptor)  # a shared lock taken here goes with it


def being_written(run_dir: Path, who: str) -> str:
    """The one line that refuses to reopen a run `who` is writing."""
    return (f"run {run_dir.name} is being written by {who}: wait for it to end, or stop it and"
            " then resume the run")
