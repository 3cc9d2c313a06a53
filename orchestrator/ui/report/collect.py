"""Everything a report shows, read once from a run directory.

The report never re-runs anything: it reads the store (trials, measurements, fingerprints), the
findings documents the experiments wrote and, for a bisect, the commit plan (`commits.json`), and
hands the renderers one frozen value. Opening a run that does not exist is bad input (exit 2).
It opens the store read-only, so a run in a read-only directory (an archive, a copy from a
cluster) can be reviewed as it is.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.settings import RunSettings, load_saved
from orchestrator.errors import UserError
from orchestrator.records import Candidate
from orchestrator.store import RunStore, TrialRow
from orchestrator.ui.report import ranking
from orchestrator.workspace import CommitInfo


@dataclass(frozen=True)
class BisectPlan:
    """The ordered commits a bisect searched and the candidate measured at each point."""

    commits: tuple[CommitInfo, ...]
    candidates: tuple[Candidate, ...]
    prior_weights: tuple[float, ...] | None


@dataclass(frozen=True)
class RunData:
    run_dir: Path
    run_id: str
    command: str
    status: str
    config_yaml: str
    metric: str
    rows: tuple[TrialRow, ...]
    docs: tuple[dict, ...]  # one findings document per experiment
    ranked: dict  # ranking.rank(docs, rows)
    plan: BisectPlan | None

    @property
    def config(self) -> RunSettings:
        """The run's stored settings, merged onto today's schema (once per stored text: the
        merge costs a tenth of a second, and a report asks a dozen times)."""
        return _saved(self.config_yaml)

    @property
    def simulated(self) -> bool:
        """A run on the simulated node: every report of it says so in its header."""
        from orchestrator.targets.registry import is_simulated

        try:
            return is_simulated(self.config.target)
        except Exception:  # noqa: BLE001 - an unreadable config: no claim either way
            return False

    def row(self, trial_id: int) -> TrialRow | None:
        return next((r for r in self.rows if r.id == trial_id), None)


@functools.lru_cache(maxsize=4)
def _saved(config_yaml: str) -> RunSettings:
    return load_saved(config_yaml)  # a frozen tree: one object serves every reader


def load_plan(run_dir: Path) -> BisectPlan | None:
    """`commits.json` as written by the bisect command, or None when absent or unreadable."""
    path = run_dir / "commits.json"
    try:
        doc = json.loads(path.read_text())
        commits = tuple(
            CommitInfo(**{**c, "parents": tuple(c["parents"]), "files": tuple(c["files"])})
            for c in doc["commits"]
        )
        candidates = tuple(Candidate.from_json(c) for c in doc["candidates"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if len(commits) != len(candidates) or len(commits) < 2:
        return None
    weights = doc.get("prior_weights")
    return BisectPlan(commits, candidates, tuple(weights) if weights else None)


def _stored_metric(config_yaml: str | None) -> str:
    try:
        return load_saved(config_yaml).metric
    except Exception:  # noqa: BLE001 - an unreadable config: the default metric
        return "verify_ms"


def load_run(run_dir: Path) -> RunData:
    """Read a run directory; a missing or foreign store is a UserError."""
    run_dir = Path(run_dir)
    if not (run_dir / "trials.db").is_file():
        raise UserError(f"no run at {run_dir}: expected a run directory with trials.db")
    store = RunStore.open(run_dir / "trials.db", readonly=True)
    try:
        rows = tuple(store.trials())
        run_id, command, status = store.run_id, store.command, store.status()
        config_yaml = store.config_yaml()
    finally:
        store.close()
    if status == "running":  # stored while it ran: is anybody still running it?
        writer = RunStore.writer_of(run_dir)
        if writer:
            status = f"running: {writer}"
        elif writer == "":
            status = (f"stopped without a word (no process writes it; sleuth resume"
                      f" {run_dir.name} continues it)")
    docs = tuple(ranking.load_docs(run_dir))
    metric = str(docs[0].get("metric") if docs and docs[0].get("metric") else
                 _stored_metric(config_yaml))
    return RunData(
        run_dir=run_dir.resolve(),
        run_id=run_id or run_dir.name,
        command=command,
        status=status,
        config_yaml=config_yaml,
        metric=metric,
        rows=rows,
        docs=docs,
        ranked=ranking.rank(docs, rows, run_id=run_id or run_dir.name),
        plan=load_plan(run_dir),
    )
