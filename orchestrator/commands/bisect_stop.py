"""How a bisect ends: its exit code, the answer "so far" of a bisect stopped before its end
(interrupted, or at its budget), and the posterior replay kept for the report.

A stopped run still tells the user what it knows: the commit the search points at and how
sure it is, the culprits already named, and what it was still looking for; the report reads
it from the findings written here, marked `provisional`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.answer.epochs import mark_system_change
from orchestrator.answer.headline import refresh
from orchestrator.answer.provisional import so_far
from orchestrator.answer.text import commit_label
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import BisectRequest
from orchestrator.config.settings import RunSettings
from orchestrator.errors import answer_exit
from orchestrator.run import findings
from orchestrator.strategies.base import Verdict, probability_relation
from orchestrator.system.watch import system_changes

if TYPE_CHECKING:  # any controller: only `bisect._execute` starts the Ray one
    from orchestrator.control.controller import Controller

def stop_reason(verdict: Verdict) -> str:
    """Why a bisect stopped before naming everything, as the provisional answer says it."""
    if any(n.startswith("stopped early") for n in verdict.notes):
        return (f"stopped after {verdict.n_trials} restarts: its forecast far exceeded the"
                f" budget of {verdict.budget}")
    return f"budget of {verdict.budget} restarts spent"


def leading(verdict: Verdict, commits, release: bool = False) -> str:
    """The commit (or release) the run points at now, with its posterior: while it searches,
    the posterior's mode; while it verifies, the culprit under verification (a culprit at
    P = 0.999 being measured against its parent is the best thing a stopped run knows, and
    an interrupted verification used to say "no cause named yet"). A finished stage's culprit
    is named as a cause instead."""
    if verdict.done or verdict.status not in ("searching", "verifying") or not verdict.posterior:
        return ""
    named = {c.point for c in verdict.culprits if c.parents}
    open_ = [i for i in range(min(len(verdict.posterior), len(commits))) if i not in named]
    if not open_ or sum(verdict.posterior[i] for i in named if i < len(verdict.posterior)) > 0.5:
        return ""  # the posterior shown is a finished stage's: the next one measures first
    point = max(open_, key=verdict.posterior.__getitem__)
    p = verdict.posterior[point]
    if p <= 0:
        return ""
    c = commits[point]
    label = f"release {c.subject}" if release else commit_label(c.sha, c.subject)
    state = ", being verified against its parent" if verdict.status == "verifying" else ""
    return f"{label} (P {probability_relation(p)}{state})"


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
                           confidence=req.confidence,
                           leading=leading(verdict, commits, release=bool(req.package)))
    doc["provisional"] = doc["answer"]["provisional"]
    findings.write(run_dir, doc, findings_name)
    return doc


def settle(doc: dict, verdict: Verdict, rows) -> dict:
    """The bisect's answer as the exit code reads it (`orchestrator/errors.py`, one rule):
    a range that does not reproduce answers the question ("not in this range") only when its
    change lies within the min effect or, with a change being chased (`doc["chased"]`: a
    reference run's or `was=`), is confidently under half of it; stopped at the 48-a-side
    cap it is undecided. A reversal is a change shown with no cause. A node whose system
    changed during the run opens the answer, with what was measured again on the new state
    (`orchestrator/answer/epochs.py`). Returns `doc`, changed in place."""
    result = doc.get("answer")
    if not result:
        return doc
    if verdict.status == "not_reproducible":
        ruled_out = (doc.get("chased") or {}).get("ruled_out")
        if not (result.get("explains") or ruled_out):
            result["status"] = "undecided"
            result["explains"] = False
            said = "whether the code in between holds the change is undecided"
            result["code_clauses"] = [said]
            result["sentence"] = str(result.get("sentence", "")).replace(
                "the code in between is not the cause", said)
    elif verdict.status == "reversed":
        result["status"], result["explains"] = "reversed", False
    outside = outside_the_range(doc)
    if outside:
        result["outside"] = outside
        result["sentence"] = f"{result.get('sentence', '')}; {outside['line']}"
    changed = [c.to_json() for c in system_changes(rows)]
    if changed and result.get("status") != "provisional":
        now = doc.get("total_epoch") != "earlier"
        remeasured = (["the culprits (verified again on the new state)"]
                      if verdict.culprits else [])
        remeasured += ["the total (the endpoints on the new state)"] if now else []
        mark_system_change(result, changed, remeasured=remeasured,
                           not_comparable=[] if now else ["the total (the endpoints were not"
                                                          " measured on the new state)"])
    refresh(result)
    return doc


def outside_the_range(doc: dict) -> dict | None:
    """With a change being chased (`reference=RUN` or `was=`), what of it this range does not
    hold: the change since that level against the range's own, said when the rest is larger
    than the min effect. A standalone bisect on a node whose power limit dropped since the
    reference named the +23% commit and said nothing of the rest."""
    chased = doc.get("chased") or {}
    result = doc.get("answer") or {}
    total, bound = result.get("total") or {}, (result.get("min_effect") or {}).get("pct")
    pct, now = chased.get("pct"), total.get("pct")
    if not (isinstance(pct, int | float) and isinstance(now, int | float)
            and isinstance(bound, int | float)) or chased.get("ruled_out"):
        return None
    rest = 100.0 * ((1.0 + pct / 100.0) / (1.0 + now / 100.0) - 1.0)
    if abs(rest) <= bound:
        return None
    since = chased.get("since") or "the level given"
    return {"pct": round(rest, 2),
            "line": (f"the change since {since} is {pct:+.1f}%; this range holds {now:+.1f}%:"
                     f" about {rest:+.1f}% lies outside it (the system since then, or code"
                     " outside the range)")}


def exit_code(verdict: Verdict, doc: dict) -> int:
    """The exit code of the bisect's answer, by the rule every command shares
    (:func:`orchestrator.errors.answer_exit`; :func:`settle` reads the bisect's verdict into
    that answer first)."""
    return answer_exit(doc.get("answer"))
