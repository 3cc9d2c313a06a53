"""How a bisect ends: its exit code, the answer "so far" of a bisect stopped before its end
(interrupted, or at its budget), and the posterior replay kept for the report.

A stopped run still tells the user what it knows: the commit the search points at and how
sure it is, the culprits already named, and what it was still looking for; the report reads
it from the findings written here, marked `provisional`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.answer.provisional import so_far
from orchestrator.answer.text import commit_label
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import BisectRequest
from orchestrator.config.settings import RunSettings
from orchestrator.run import findings
from orchestrator.strategies.base import Verdict, probability_relation

if TYPE_CHECKING:  # any controller: only `bisect._execute` starts the Ray one
    from orchestrator.control.controller import Controller

EXIT_INCONCLUSIVE = 3


def stop_reason(verdict: Verdict) -> str:
    """Why a bisect stopped before naming everything, as the provisional answer says it."""
    if any(n.startswith("stopped early") for n in verdict.notes):
        return (f"stopped after {verdict.n_trials} restarts: its forecast far exceeded the"
                f" budget of {verdict.budget}")
    return f"budget of {verdict.budget} restarts spent"


def leading(verdict: Verdict, commits) -> str:
    """The commit the search points at now, with its posterior, while it is still searching
    (a finished stage's culprit is named as a cause instead)."""
    if verdict.done or verdict.status != "searching" or not verdict.posterior:
        return ""
    named = {c.point for c in verdict.culprits}
    open_ = [i for i in range(min(len(verdict.posterior), len(commits))) if i not in named]
    if not open_ or sum(verdict.posterior[i] for i in named if i < len(verdict.posterior)) > 0.5:
        return ""  # the posterior shown is a finished stage's: the next one measures first
    point = max(open_, key=verdict.posterior.__getitem__)
    p = verdict.posterior[point]
    if p <= 0:
        return ""
    c = commits[point]
    return f"{commit_label(c.sha, c.subject)} (P {probability_relation(p)})"


def provisional_findings(cfg: RunSettings, req: BisectRequest, ctl: Controller, run_dir: Path,
                         commits, points,
                         verdict: Verdict, why: str, findings_name: str | None) -> dict:
    """The findings of a bisect stopped before its end, with its answer so far; written where
    the finished run's would be, marked `provisional`."""
    rows = ctl.store.trials()
    doc = findings.bisect_findings(run_id=ctl.store.run_id, metric=req.metric,
                                   verdict=verdict, commits=commits,
                                   keys=[p.key for p in points], rows=rows,
                                   min_effect_pct=experiment_params.of(cfg).min_effect_pct)
    doc["answer"] = so_far(doc["answer"], why=why, searching=not verdict.done or
                           verdict.status == "budget_exhausted",
                           confidence=req.confidence, leading=leading(verdict, commits))
    doc["provisional"] = doc["answer"]["provisional"]
    findings.write(run_dir, doc, findings_name)
    return doc


def keep_posterior_replay(run_dir: Path) -> None:
    """Keep the posterior history beside the run as it ends (`ui/report/replay_cache.py`):
    read from the run's own record (linear in the trials), replayed only where there is no
    complete record; `sleuth report` then reads it in milliseconds. Never a reason for the
    run to fail."""
    from orchestrator.ui.report import load_run
    from orchestrator.ui.report.series import posterior_history

    try:
        posterior_history(load_run(run_dir))
    except Exception:  # noqa: BLE001 - the report replays it then
        pass


def exit_code(verdict: Verdict, doc: dict) -> int:
    """0 when the culprits are named, or when the range holds nothing reproducibly slower:
    its change's interval lies within the min effect ("no change larger than x%"), or, with a
    change being chased (`doc["chased"]`: a reference run's or `was=`), is confidently under
    half of it (`ruled_out`), which is what "not reproducible" then means; 3 for a run stopped at its
    budget, a change it could neither rule in nor out, and the rest."""
    if verdict.status == "found":
        return 0
    settled = verdict.status == "not_reproducible" and (
        (doc.get("answer") or {}).get("explains") or (doc.get("chased") or {}).get("ruled_out"))
    return 0 if settled else EXIT_INCONCLUSIVE
