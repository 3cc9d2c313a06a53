"""The bisect posterior's replay, kept beside the run once computed.

Replaying a bisect's posterior (`series.posterior_history`) passes every stored observation
through the strategy in turn, and each step costs more the more evidence there is: on a
500-trial run it was most of `sleuth report`'s time (about 30 of 46 s on a loaded 2-core
machine). The replay is a pure function of the stored observations, the run's configuration
and its plan, so it is computed once (when the bisect writes its report) and kept in the run
directory, keyed by a hash of exactly those inputs: a run that gained trials (resumed), or a
changed configuration, misses the key and is replayed again. A run directory that cannot be
written (read-only, `out=DIR`) simply replays every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

FILENAME = "posterior-history.json"
# Bumped whenever the strategy or the replay changes what it computes from the same inputs.
VERSION = 1


def key(config_yaml: str, candidate_keys: Sequence[str], observations: Sequence[Any]) -> str:
    """A hash of everything the replay reads."""
    digest = hashlib.sha256()
    for part in (str(VERSION), config_yaml, repr(list(candidate_keys)),
                 repr(list(observations))):
        digest.update(part.encode())
        digest.update(b"\0")
    return digest.hexdigest()


def load(run_dir: Path, wanted: str) -> dict | None:
    """The stored history for `wanted` as saved (`series` rebuilds it), or None: absent,
    another key, unreadable."""
    try:
        doc = json.loads((Path(run_dir) / FILENAME).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("key") != wanted:
        return None
    history = doc.get("history")
    return history if isinstance(history, dict) else None


def save(run_dir: Path, wanted: str, history) -> None:
    """Keep `history` for the next report; silently not, where the directory is not ours."""
    path = Path(run_dir) / FILENAME
    tmp = path.with_name(f".{FILENAME}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps({"key": wanted, "history": dataclasses.asdict(history)}))
        tmp.replace(path)
    except (OSError, TypeError, ValueError):  # not writable, or a value JSON cannot hold
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
