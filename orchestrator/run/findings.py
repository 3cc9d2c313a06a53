"""Findings: causes with their evidence, ranked, in the `findings.json` contract of DESIGN.md.

Every number here comes from stored trials: effects are computed from trial-level values
(restarts are the unit) of the culprit against its parent, with intervals from
`orchestrator.stats.effect`; probabilities are the strategy's posterior.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from orchestrator import answer
from orchestrator.answer import text
from orchestrator.answer.phases import SIDE_METRICS, mechanism
from orchestrator.metrics import EFFECT_METRICS, METRICS, effect_metrics
from orchestrator.records import NOT_EVIDENCE_PHASES
from orchestrator.run.paired import paired_difference
from orchestrator.stats.effect import effect, log_difference
from orchestrator.store import TrialRow
from orchestrator.strategies.base import Verdict
from orchestrator.strategies.sweep import noise
from orchestrator.system.watch import epochs
from orchestrator.util.files import write_atomic
from orchestrator.workspace import CommitInfo


def trial_values(rows: Sequence[TrialRow], key: str, metric: str, *, include_suspect: bool = False,
                 exclude: frozenset[int] = frozenset()) -> list[float]:
    """Trial-level values of `metric` for the candidate with `key` (measured trials only).

    Reference trials are left out: they may come from an earlier state of the node, so mixing
    them with this state's restarts would blur both an effect and the pooled restart noise."""
    out = []
    for r in rows:
        if r.candidate.key != key or r.outcome is None or not r.outcome.measured:
            continue
        if r.phase in NOT_EVIDENCE_PHASES:
            continue
        if (r.suspect and not include_suspect) or r.id in exclude:
            continue
        v = r.result.value(metric) if r.result else None
        if v is not None and math.isfinite(v):
            out.append(v)
    return out


def pooled_log_ss(rows: Sequence[TrialRow], metric: str, exclude: Sequence[str],
                  trials: frozenset[int] = frozenset()) -> tuple[float, int]:
    """Within-candidate sum of squares (log scale) and its degrees of freedom over the other
    candidates of the run: restart-to-restart noise is a property of the node and server, so
    every candidate measured more than once informs it."""
    keys = {r.candidate.key for r in rows} - set(exclude)
    return noise.pooled_log_ss(trial_values(rows, key, metric, exclude=trials) for key in keys)


def effects_between(rows: Sequence[TrialRow], before_key: str, after_key: str,
                    metrics: Sequence[str] = EFFECT_METRICS, confidence: float = 0.95,
                    exclude: frozenset[int] = frozenset()) -> dict:
    """`{metric: {"pct", "ci", "p_value", "n"}}` for each metric both sides measured.

    Positive metrics use the same estimator as the bisect strategy (t-interval on log values
    with the run's pooled restart variance); others fall back to Fieller's interval on means.
    `exclude`: trials left out (a bisect's outlier restarts: flagged, not evidence)."""
    out = {}
    for metric in metrics:
        a = trial_values(rows, before_key, metric, exclude=exclude)
        b = trial_values(rows, after_key, metric, exclude=exclude)
        if not a or not b or len(a) + len(b) < 3:
            continue
        try:
            log = None
            if min(a + b) > 0:
                # Sides measured within shared lifetimes are paired (orchestrator/run/paired.py).
                d = paired_difference(rows, before_key, after_key, metric, confidence, exclude)
                if d is None:
                    ss, df = pooled_log_ss(rows, metric, (before_key, after_key), exclude)
                    d = log_difference([math.log(v) for v in a], [math.log(v) for v in b],
                                       confidence, ss, df)
                e = d.to_effect(len(a), len(b), confidence)
                log = [d.diff, d.se, d.df]  # what an answer adds and subtracts
            else:
                e = effect(a, b, confidence=confidence)
        except ValueError:
            continue
        if not (math.isfinite(e.pct) and math.isfinite(e.ci[0]) and math.isfinite(e.ci[1])):
            continue
        out[metric] = {"pct": round(e.pct, 3), "ci": [round(e.ci[0], 3), round(e.ci[1], 3)],
                       "p_value": e.p_value, "n": [e.n_before, e.n_after],
                       "before": sum(a) / len(a), "after": sum(b) / len(b)}
        if log is not None:
            out[metric]["log"] = log
    return out


def phase_moved(effects: dict) -> str | None:
    """The server phase whose time moved most (verify vs draft vs decode), if any moved."""
    best, best_abs = None, 0.0
    for metric in ("verify_ms", "draft_ms", "decode_ms"):
        e = effects.get(metric)
        if e and (e["ci"][0] > 0 or e["ci"][1] < 0) and abs(e["pct"]) > best_abs:
            best, best_abs = METRICS[metric].phase, abs(e["pct"])
    return best


def commit_summary(commit: CommitInfo, metric: str, effects: dict) -> str:
    e = effects.get(metric)
    moved = f"{metric} {text.change_text(e, metric)}" if e else f"{metric} changed"
    return f"commit {commit.sha[:12]} \"{commit.subject}\": {moved}"


def bisect_findings(
    *,
    run_id: str,
    metric: str,
    verdict: Verdict,
    commits: Sequence[CommitInfo],
    keys: Sequence[str],
    rows: Sequence[TrialRow],
    min_effect_pct: float | None = None,
    subjects: bool = True,
) -> dict:
    """`subjects`: name a commit with its subject too (not for a package's releases, whose
    "commits" are versions the release rewrite names)."""
    said = [c.subject for c in commits] if subjects else None
    findings = []
    outliers = {o.trial_id for o in verdict.outliers if o.trial_id is not None}
    for culprit in sorted(verdict.culprits, key=lambda c: -c.probability):
        commit = commits[culprit.point]
        parent_point = (culprit.parents[0] if culprit.parents
                        else culprit.range[0] if culprit.range else culprit.point - 1)
        effects = effects_between(rows, keys[parent_point], keys[culprit.point],
                                  metrics=effect_metrics(metric), exclude=frozenset(outliers))
        evidence = [r.id for r in rows if r.candidate.key in (keys[parent_point], keys[culprit.point])]
        finding = {
            "kind": "commit",
            "id": commit.sha,
            "summary": commit_summary(commit, metric, effects),
            "probability": round(float(culprit.probability), 4),
            "effect": {m: {"pct": e["pct"], "ci": e["ci"]} for m, e in effects.items()},
            "phase": phase_moved(effects),
            "subject": commit.subject,
            "author": commit.author,
            "parent": commits[parent_point].sha,
            # Verified head-to-head against its parent(s); a best guess of a stopped run is not.
            "verified": bool(culprit.parents),
            "evidence": evidence,
            "effect_detail": effects,
            "before_key": keys[parent_point], "after_key": keys[culprit.point],
        }
        if culprit.range:
            lo, hi = culprit.range
            finding["range"] = [commits[i].sha for i in range(lo + 1, hi + 1)]
            finding["summary"] += f" (one of {hi - lo} commits: untestable neighbours)"
        if culprit.explained is not None:
            finding["explained"] = round(float(culprit.explained), 3)
        if len(culprit.parents) > 1:  # a merge: verified against each of its parents
            finding["parents"] = [commits[p].sha for p in culprit.parents]
        if culprit.latest_effect_pct is not None:
            finding["effect_now"] = {"pct": round(culprit.latest_effect_pct, 3),
                                     "ci": [round(x, 3) for x in culprit.latest_effect_ci]}
        flagged = sorted(t for t in evidence if t in outliers)
        if flagged:
            finding["outlier_trials"] = flagged
        findings.append(finding)
    for rank, f in enumerate(findings, 1):
        f["rank"] = rank
    doc = {
        "run": run_id,
        "experiment": "bisect",
        "metric": metric,
        "verdict": verdict.status,
        "message": text.name_points(verdict.message, [c.sha for c in commits], said),
        "confidence": verdict.confidence,
        "n_trials": len(rows),
        "total_effect": ({"pct": verdict.total_effect_pct, "ci": list(verdict.total_effect_ci)}
                         if verdict.total_effect_pct is not None and verdict.total_effect_ci else None),
        "findings": [{"rank": f.pop("rank"), **f} for f in findings],
        "unexplained": [_unexplained_json(u, commits) for u in verdict.unexplained],
        "outliers": [{"trial": o.trial_id, "commit": commits[o.point].sha, "status": o.status,
                      "ratio": round(o.ratio, 4)} for o in verdict.outliers],
        "notes": [text.name_points(n, [c.sha for c in commits], said) for n in verdict.notes],
        "budget": verdict.budget,
        "min_effect_pct": min_effect_pct,
    }
    # Every kept endpoint trial of one system epoch (the latest that measured both), pooled
    # like the culprits' effects (outlier restarts left out as there): what they add to. A
    # node that changed mid-run would otherwise mix two systems into one total.
    scope, latest = one_system(rows, (keys[0], keys[-1]), metric)
    endpoints = effects_between(scope, keys[0], keys[-1], metrics=(metric,),
                                exclude=frozenset(outliers)).get(metric)
    if endpoints:
        fitted = _fitted_total(verdict)
        if fitted is not None and latest:
            # The strategy's level fit reads the endpoints with their time blocks (a load
            # step on one endpoint's restarts: +11.1% [-1.8, +25.7] pooled under a +23%
            # culprit) and its epochs; the means stay the restarts' own.
            endpoints = {**endpoints, **fitted}
        doc["total_detail"] = endpoints
        if not latest:
            doc["total_epoch"] = "earlier"
    good, bad = commits[0], commits[-1]
    doc["answer"] = answer.for_bisect(
        doc, good=text.commit_label(good.sha, good.subject),
        bad=text.commit_label(bad.sha, bad.subject),
        mechanism=mechanism_between([r for r in rows if r.id not in outliers], keys[0],
                                    keys[-1], "good", "bad"))
    return doc


def _fitted_total(verdict: Verdict) -> dict | None:
    """The verdict's endpoint change from the strategy's level fit as an effect record
    (`pct`, 95% `ci`, `log`)."""
    if verdict.total_log is None:
        return None
    return answer.LogChange(*verdict.total_log).to_json()


def one_system(rows: Sequence[TrialRow], keys: Sequence[str],
               metric: str) -> tuple[Sequence[TrialRow], bool]:
    """The rows of the latest system epoch where every candidate in `keys` was measured,
    and whether that is the latest epoch (all rows, True, when the node never changed)."""
    parts = epochs(rows)
    if len(parts) <= 1:
        return rows, True
    for n, part in enumerate(reversed(parts)):
        if all(trial_values(part, k, metric) for k in keys):
            return part, n == 0
    return parts[-1], True


def side_values(rows: Sequence[TrialRow], key: str,
                metrics: Sequence[str] = SIDE_METRICS) -> dict[str, list[float]]:
    """Trial-level values of one candidate per metric (what a mechanism compares)."""
    return {m: vals for m in metrics if (vals := trial_values(rows, key, m))}


def side_telemetry(rows: Sequence[TrialRow], key: str) -> list[dict]:
    return [r.result.fingerprint.get("telemetry") for r in rows
            if r.candidate.key == key and r.outcome is not None and r.outcome.measured
            and not r.suspect and r.phase not in NOT_EVIDENCE_PHASES and r.result
            and r.result.fingerprint]


def mechanism_between(rows: Sequence[TrialRow], before_key: str, after_key: str,
                      before_label: str = "before", after_label: str = "after") -> dict:
    """Which phase moved between two candidates of a run, and what the GPUs did."""
    return mechanism(side_values(rows, before_key), side_values(rows, after_key),
                     side_telemetry(rows, before_key), side_telemetry(rows, after_key),
                     before_label=before_label, after_label=after_label)


def _unexplained_json(part, commits: Sequence[CommitInfo]) -> dict:
    """A part of the change no named commit explains: between two commits, with its size."""
    doc = {"kind": part.kind, "from": commits[part.lo].sha, "to": commits[part.hi].sha,
           "pct": round(part.effect_pct, 3), "ci": [round(x, 3) for x in part.effect_ci],
           "unexplained": bool(part.flagged)}
    if part.candidates:
        doc["likeliest"] = [commits[p].sha for p in part.candidates]
    return doc


def write(run_dir: Path, doc: dict, name: str | None = None) -> Path:
    """`findings.json`, or `findings-<name>.json` when a run holds several experiments (the
    report ranks them together)."""
    path = run_dir / (f"findings-{name}.json" if name else "findings.json")
    write_atomic(path, json.dumps(doc, indent=2, default=float) + "\n")
    return path
