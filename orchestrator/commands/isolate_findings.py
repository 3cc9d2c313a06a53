"""An isolate's findings document from its trials and a verdict, finished or not.

The isolate writes the same document whether it ended (found, cleared, at its budget or its
cap) or was interrupted: a run stopped after 40 restarts has usually named a cause or two, and
an interrupted isolate that stored nothing left `sleuth report` with no answer at all. So the
document is built here from whatever trials exist and the verdict they give; a run that stopped
before its end marks its answer `provisional` (:func:`orchestrator.answer.provisional.so_far`),
with the numbers still the answer's own. Every effect, total and share is read from the latest
system epoch (one system per comparison, :mod:`orchestrator.answer.epochs`).
"""

from __future__ import annotations

from orchestrator import answer
from orchestrator.answer.provisional import so_far
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import IsolateRequest
from orchestrator.config.settings import RunSettings
from orchestrator.control.controller import Controller
from orchestrator.metrics import effect_metrics
from orchestrator.run import findings
from orchestrator.run.attribution import isolate_attribution
from orchestrator.stats import caveats
from orchestrator.strategies.base import Verdict
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.strategies.isolate.report import remainder_stands
from orchestrator.system.differences import Change
from orchestrator.system.watch import latest_epoch, system_changes


def qualified(effects: dict, metric: str, rows, keys: tuple[str, str]) -> dict:
    """Effects with the caveats that make some of them not evidence (too few restarts,
    client-side timings that follow the host's load; :mod:`orchestrator.stats.caveats`)."""
    fps = {k: [r.result.fingerprint for r in rows if r.candidate.key == k and r.result
               and r.result.fingerprint] for k in keys}
    cpus = next(((fp.get("host") or {}).get("cpus") for k in keys for fp in fps[k]), None)
    return caveats.qualify(effects, headline=metric, cpus=cpus,
                           loads=(caveats.mean_load(fps[keys[0]]), caveats.mean_load(fps[keys[1]])))


def remainder(verdict) -> dict:
    """`{"remainder": ...}` when bad without the named causes still measures apart from good:
    differences listed as cleared do not then explain the rest, and the findings say how
    large the unexplained part is."""
    ci = getattr(verdict, "residual_ci", None)
    if verdict.status != "found" or not remainder_stands(ci):
        return {}
    return {"remainder": {"pct": round(float(verdict.residual_pct), 3),
                          "ci": [round(float(x), 3) for x in ci], "unexplained": True}}


def _finding(culprit, changes: list[Change], rows, points, strategy: IsolateStrategy,
             good_key: str, measured, metric: str) -> dict:
    """One named difference (or pair): its effect from the good configuration to the good
    one with it, and the trials that are its evidence."""
    subset = frozenset(culprit.differences)
    with_key = points.candidate(strategy.point_of(subset)).key
    effects = qualified(findings.effects_between(rows, good_key, with_key, measured),
                        metric, rows, (good_key, with_key))
    first = changes[culprit.differences[0]]
    pair = len(culprit.differences) > 1
    return {
        "kind": first.kind,
        "id": " + ".join(changes[i].name for i in culprit.differences),
        "summary": (" together with ".join(culprit.labels)
                    + (" (only together)" if culprit.kind == "interaction" else "")),
        "probability": round(float(culprit.probability), 4),
        "effect": caveats.evidence_only(effects),
        "not_evidence": caveats.not_evidence(effects),
        "phase": findings.phase_moved(caveats.evidence_only(effects)),
        "interaction": pair and culprit.kind == "interaction",
        "differences": [changes[i].to_json() for i in culprit.differences],
        "verified": culprit.verified,
        "evidence": [r.id for r in rows if r.candidate.key in (good_key, with_key)],
        "effect_detail": effects,
        "before_key": good_key, "after_key": with_key,
    }


def document(cfg: RunSettings, req: IsolateRequest, ctl: Controller, strategy: IsolateStrategy,
             points,
             changes: list[Change], verdict: Verdict, *, stopped: str = "") -> dict:
    """The isolate's findings document for `verdict` over the run's trials so far.

    `stopped`: why a run ended before its verdict was final ("interrupted after 12
    restarts"); its answer is then the answer so far. A verdict at the budget or the cap is
    provisional too, with that as its reason."""
    metric = req.metric
    all_rows = ctl.store.trials()
    rows = latest_epoch(all_rows)  # every effect, total and share on one system
    good_key = points.candidate(0).key
    # The run's own metric too (a command target's `value` is none of the SGLang metrics).
    measured = effect_metrics(metric)
    items = [_finding(culprit, changes, rows, points, strategy, good_key, measured, metric)
             for culprit in sorted(verdict.culprits, key=lambda c: -c.probability)]
    doc = {"run": ctl.store.run_id, "experiment": "isolate", "metric": metric,
           "verdict": verdict.status, "message": verdict.message,
           "confidence": float(verdict.probability), "n_trials": verdict.n_trials,
           "cleared": [changes[i].to_json() for i in verdict.cleared],
           **remainder(verdict),
           "differences": [c.to_json() for c in changes],
           "findings": [{"rank": rank, **item} for rank, item in enumerate(items, 1)],
           "min_effect_pct": experiment_params.of(cfg).min_effect_pct}
    system = system_changes(all_rows)
    doc["system_changes"] = [c.to_json() for c in system]
    if system:
        doc["epoch_note"] = (f"the node's system changed during the run ({system[-1].summary}):"
                             f" every effect here is from the {len(rows)} trials on the new"
                             " system, measured again there")
    attribution = isolate_attribution(rows, points.point, strategy.subset, changes,
                                      verdict.culprits, items, metric)
    if attribution is not None:
        doc["attribution"] = attribution
    bad_end = points.candidate(strategy.point_of(frozenset(range(len(changes)))))
    bad_key = bad_end.key
    # Both ends as candidates: an investigation whose reference holds no level of the metric
    # (an old log) measures its total between them (`investigate_answer.whole`).
    doc["ends"] = {"good": points.candidate(0).to_json(), "bad": bad_end.to_json()}
    total = findings.effects_between(rows, good_key, bad_key, measured)
    if total:
        doc["total_effect"] = total
    doc["answer"] = answer.for_isolate(
        doc, mechanism=findings.mechanism_between(rows, good_key, bad_key, "good", "bad"))
    if not stopped and verdict.status in ("budget_exhausted", "inconclusive"):
        stopped = (f"budget spent after {verdict.n_trials} restarts" if verdict.status ==
                   "budget_exhausted" else f"inconclusive after {verdict.n_trials} restarts")
    if stopped:  # at its budget, its cap, or interrupted: the answer so far
        doc["answer"] = so_far(doc["answer"], confidence=req.confidence, why=stopped)
        doc["provisional"] = doc["answer"]["provisional"]
    return doc
