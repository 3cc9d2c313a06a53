"""Who holds a node: its `node.lock` (an exclusive `flock` the node's actor holds for a run's
whole life) and `holder.json` (which run, which process, on which host, since when).

Kept apart from the actor (`node.py`) so a command can refuse a node another live run holds
before Ray, the trial runner or the HTTP client are imported (`commands/common.py`): reading a
holder needs only the standard library.
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from collections.abc import Mapping
from pathlib import Path

from orchestrator.util.process import start_time

NODE_LOCK = "node.lock"
HOLDER_FILE = "holder.json"


def held_message(name: str, holder: Mapping) -> str:
    since = holder.get("since")
    when = time.strftime(" since %H:%M:%S", time.localtime(since)) if since else ""
    return (f"node {name} is held by another sleuth run ({holder.get('run_id') or 'run ?'},"
            f" pid {holder.get('pid')} on {holder.get('host', '?')}{when})")


def holder_of(state_dir: Path) -> dict | None:
    """Who holds the node whose state is in `state_dir`, found without taking it and without
    writing anything: None when it is free, or held only by an orphan a new run takes over.

    Lets a command refuse a node another run holds before it starts Ray (the actor's own
    `_hold` stays the authority: a run that starts in between is still refused there)."""
    try:
        descriptor = os.open(state_dir / NODE_LOCK, os.O_RDONLY)
    except OSError:
        return None  # never held here, or not readable: the actor will judge
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        pass
    except OSError:
        return None  # a filesystem without flock: the actor falls back on the holder file
    else:
        return None  # free; closing the descriptor lets go of it again
    finally:
        os.close(descriptor)
    doc = _read_json(state_dir / HOLDER_FILE) or {"pid": None}
    return None if _orphaned(doc) else doc


def _read_json(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def _alive(process: Mapping) -> bool:
    """The process (pid, start time, host) still runs. One on another host is assumed to."""
    if process.get("host") != socket.gethostname():
        return True
    pid = process.get("pid")
    return bool(pid) and start_time(int(pid)) == process.get("start_time")


def _orphaned(holder: Mapping) -> bool:
    """A holding actor whose controller (on this host) is gone."""
    controller = holder.get("controller") or {}
    return bool(controller.get("pid")) and not _alive(controller) and _alive(holder)
