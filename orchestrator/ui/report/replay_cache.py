"""The bisect posterior as the run went, kept beside the run.

Replaying a bisect's posterior (`series.posterior_history`) passes every stored observation
through the strategy in turn, and each step costs more the more evidence there is: the whole
replay grows with the square of the trials (profiled on a 500-trial run: 18 CPU-seconds, most
of it the endpoints' level fits, `levels.fit_levels`, that every step redoes over all the
evidence so far), which made the end of a long run minutes long on a loaded machine.

So the live run keeps its own history instead (:class:`Recorder`): after each verdict the
experiment loop computes anyway, one line in `posterior-steps.jsonl` (the trials it took in,
its posterior, its culprits). The end of the run and `sleuth report` read it back, in time
linear in the trials; a replay is left for runs that have no complete record (one started
before the record existed, a store copied without it).

Either way the history is then kept as `posterior-history.json`, keyed by a hash of the stored
observations, the run's configuration and its plan: a run that gained trials (resumed), or a
changed configuration, misses the key and is rebuilt. A run directory that cannot be written
(read-only, `out=DIR`) simply rebuilds every time.
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
STEPS = "posterior-steps.jsonl"
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


class Recorder:
    """The live run's posterior history: one line per verdict it acted on that took in new
    trials, appended as it goes (`posterior-steps.jsonl`). The first verdict of a run that
    starts with stored trials (an investigation's compare restarts, a resumed run) takes them
    all in at once, as the run did; a resumed run appends to the file its first session
    wrote."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / STEPS
        self._covered: set[int] = {int(t) for line in _lines(self.path)
                                   for t in line.get("trials") or ()}
        self._ok = True

    def record(self, verdict: Any, observations: Sequence[Any]) -> None:
        """One verdict over `observations`: a line when it took in trials not yet recorded."""
        new = [t for t in _ids(observations) if t not in self._covered]
        if not new:
            return
        top = verdict.top
        posterior = [float(p) for p in verdict.posterior]
        if top is not None:
            best, prob = top.point, float(top.probability)
        elif posterior and max(posterior) > 0:
            best = max(range(len(posterior)), key=posterior.__getitem__)
            prob = posterior[best]
        else:
            best, prob = None, 0.0
        self._append({"trials": new, "status": verdict.status, "posterior": posterior,
                      "best_point": best, "best_probability": prob,
                      "culprits": [c.point for c in verdict.culprits]})
        self._covered.update(new)

    def _append(self, doc: dict) -> None:
        if not self._ok:
            return
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(doc) + "\n")
        except OSError:  # never a reason for the run to fail: the report replays then
            self._ok = False


def _ids(observations: Sequence[Any]) -> list[int]:
    return [int(o.trial_id) for o in observations if getattr(o, "trial_id", None) is not None]


def _lines(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            doc = json.loads(raw)
        except ValueError:
            continue  # a line cut short by a kill
        if isinstance(doc, dict):
            out.append(doc)
    return out


def recorded(run_dir: Path, wanted: Sequence[int]) -> list[dict] | None:
    """The live run's steps when they are the whole history of the trials `wanted` (each
    taken in by one step, none other: a run stopped between storing a trial and its verdict
    is not); else None."""
    steps = [line for line in _lines(Path(run_dir) / STEPS)
             if line.get("trials") and "posterior" in line]
    covered = [int(t) for s in steps for t in s["trials"]]
    if not steps or sorted(covered) != sorted(int(t) for t in wanted):
        return None
    return steps
