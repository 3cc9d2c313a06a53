"""The bisect's posterior as the run went, recorded by the run itself.

After each verdict the experiment loop computes anyway, one line in `posterior-steps.jsonl`:
the trials it took in, its status, its posterior, its best point and its culprits. The report's
posterior plot reads it back (`ui/report/series.py`), in time linear in the trials. It used to
replay the stored observations through the strategy instead, whose cost grows with the square
of the trials (18 CPU-seconds on a 500-trial run) and which made a renderer build a strategy;
a run without the record (older than it) shows no posterior plot rather than a rebuilt one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

STEPS = "posterior-steps.jsonl"


class Recorder:
    """The live run's posterior history: one line per verdict it acted on that took in new
    trials, appended as it goes. The first verdict of a run that starts with stored trials (an
    investigation's compare restarts, a resumed run) takes them all in at once, as the run
    did; a resumed run appends to the file its first session wrote."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / STEPS
        self._covered: set[int] = {int(t) for line in read(run_dir) for t in line["trials"]}
        self._ok = True

    def record(self, verdict: Any, observations: Sequence[Any]) -> None:
        """One verdict over `observations`: a line when it took in trials not yet recorded."""
        new = [int(o.trial_id) for o in observations
               if getattr(o, "trial_id", None) is not None and int(o.trial_id) not in
               self._covered]
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
        except OSError:  # never a reason for the run to fail: the report has no plot then
            self._ok = False


def read(run_dir: Path) -> list[dict]:
    """The recorded steps, in order (a line cut short by a kill is left out)."""
    try:
        text = (Path(run_dir) / STEPS).read_text()
    except OSError:
        return []
    out = []
    for raw in text.splitlines():
        try:
            doc = json.loads(raw)
        except ValueError:
            continue
        if isinstance(doc, dict) and doc.get("trials") and "posterior" in doc:
            out.append(doc)
    return out
