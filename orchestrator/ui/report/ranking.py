"""One ranking across the experiments of a run.

A run can hold several experiments (a bisect over commits, a compare/isolate over system
differences, an NCCL sweep), each writing its own findings document in the `findings.json`
contract of DESIGN.md. A reviewer wants one list: the causes, most probable first, with the
effect on every metric, the phase that moved, and the trials behind each. This module merges
the documents into that list without recomputing any statistic: probabilities and intervals
stay what the experiment that produced them said. What it adds is bookkeeping from the store:
which evidence trials were suspect (excluded from the effects) or failed (never measured).

Ranking order, and why:
  1. findings with a probability of being a cause, highest first (that is the question asked);
  2. among equals, a finding whose interval on its experiment's metric excludes zero first;
  3. then the larger absolute effect on that metric;
  4. findings without a probability (e.g. a sweep's better setting) come after all causes.
When the run has an answer (an investigation's), the causes it names come first and in its
order, so the answer's table and the causes table never list the same causes differently.
The same cause named by two experiments (same kind and id) is one finding: the more probable
record is kept and the other experiment is listed beside it, with the evidence merged.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.answer import pick
from orchestrator.store import TrialRow
from orchestrator.system.watch import system_changes

# Metrics whose interval tells "which part of the server moved": the three phase timings, the
# draft acceptance and the share of verify passes that ran inside a CUDA graph.
MOVED_METRICS = ("verify_ms", "draft_ms", "decode_ms", "accept_len", "cuda_graph_share")
COMBINED_EXPERIMENT_SEPARATOR = "+"


def excludes_zero(effect: Mapping | None) -> bool:
    """True when an `{"pct", "ci"}` effect's interval lies entirely on one side of zero."""
    if not effect or "ci" not in effect:
        return False
    lo, hi = effect["ci"]
    return (lo > 0 or hi < 0) and math.isfinite(lo) and math.isfinite(hi)


def moved_metrics(effect: Mapping[str, Mapping]) -> dict[str, float]:
    """`{metric: pct}` for the phase metrics whose interval excludes no change."""
    return {m: float(effect[m]["pct"]) for m in MOVED_METRICS if excludes_zero(effect.get(m))}


def _sort_key(finding: Mapping, metric: str, doc_index: int) -> tuple:
    probability = finding.get("probability")
    has_probability = probability is not None and math.isfinite(float(probability))
    headline = (finding.get("effect") or {}).get(metric)
    magnitude = abs(float(headline["pct"])) if headline and "pct" in headline else 0.0
    return (
        0 if has_probability else 1,
        -float(probability) if has_probability else 0.0,
        0 if excludes_zero(headline) else 1,
        -magnitude,
        doc_index,
        int(finding.get("rank", 0) or 0),
    )


def _answer_position(answer: Mapping | None, identity: tuple[str, str]) -> int:
    """Where the answer lists the cause `(kind, id)`; after all of them when it does not."""
    causes = (answer or {}).get("causes") or []
    for position, cause in enumerate(causes):
        if (str(cause.get("kind", "")), str(cause.get("id", ""))) == identity:
            return position
    return len(causes)


def _trial_flags(evidence: Sequence[int], rows_by_id: Mapping[int, TrialRow]) -> dict:
    """Which evidence trials were suspect (excluded) or failed (never a measurement)."""
    suspect, failed, interrupted, measured = [], [], [], 0
    for tid in evidence:
        row = rows_by_id.get(int(tid))
        if row is None:
            continue
        if row.outcome is not None and row.outcome.value == "interrupted":
            interrupted.append(int(tid))  # stopped, not failed: it ran again
        elif row.outcome is None or not row.outcome.measured:
            failed.append(int(tid))
        elif row.suspect:
            suspect.append(int(tid))
        else:
            measured += 1
    return {"suspect_trials": suspect, "failed_trials": failed,
            "interrupted_trials": interrupted, "measured_trials": measured}


def combined_verdict(docs: Sequence[Mapping]) -> str:
    """'found' when any experiment found a cause; otherwise the first experiment's verdict."""
    verdicts = [str(d.get("verdict", "")) for d in docs]
    if "found" in verdicts:
        return "found"
    return verdicts[0] if verdicts else "empty"


def experiment_summaries(docs: Sequence[Mapping]) -> list[dict]:
    return [
        {
            "experiment": d.get("experiment", "?"),
            "metric": d.get("metric"),
            "verdict": d.get("verdict"),
            "message": d.get("message", ""),
            "n_findings": len(d.get("findings", [])),
            "n_trials": d.get("n_trials"),
            "total_effect": d.get("total_effect"),
        }
        for d in docs
    ]


def rank(
    docs: Sequence[Mapping],
    rows: Sequence[TrialRow] = (),
    *,
    run_id: str | None = None,
) -> dict:
    """One ranked findings document from per-experiment documents (the DESIGN.md contract).

    The result keeps the contract's keys (`run`, `experiment`, `metric`, `verdict`, `findings`
    with `rank`, `kind`, `id`, `summary`, `probability`, `effect`) and adds, per finding:
    `experiment` (the one whose record is kept), `experiments` (all that named it), `metric`
    (that experiment's metric), `moved` (phase metrics whose interval excludes zero),
    `suspect_trials`, `failed_trials` and `measured_trials` (from `rows`, when given). At the top
    it adds `experiments` (one summary per document), `system_changes` (from `rows`: every
    change of a node's system between its trials) and `sources` (the documents themselves, so
    a combined file can be ranked again without losing anything).
    """
    rows_by_id = {r.id: r for r in rows}
    # An investigation's own document holds its answer, not findings: the steps hold those.
    investigation = next((d for d in docs if d.get("experiment") == "investigate"), None)
    steps = [d for d in docs if d is not investigation]
    merged: dict[tuple[str, str], dict] = {}
    keys: dict[tuple[str, str], tuple] = {}
    for doc_index, doc in enumerate(steps):
        experiment = str(doc.get("experiment", "?"))
        metric = str(doc.get("metric", ""))
        for raw in doc.get("findings", []):
            finding = copy.deepcopy(dict(raw))
            finding["experiment"] = experiment
            finding["metric"] = metric
            identity = (str(finding.get("kind", "")), str(finding.get("id", "")))
            key = _sort_key(finding, metric, doc_index)
            previous = merged.get(identity)
            if previous is None:
                finding["experiments"] = [experiment]
                merged[identity], keys[identity] = finding, key
                continue
            experiments = previous["experiments"] + [
                e for e in [experiment] if e not in previous["experiments"]
            ]
            evidence = sorted({*previous.get("evidence", []), *finding.get("evidence", [])})
            if key < keys[identity]:
                merged[identity], keys[identity] = finding, key
            merged[identity]["experiments"] = experiments
            merged[identity]["evidence"] = evidence
    answer = pick(docs)
    ordered = sorted(merged, key=lambda identity: (_answer_position(answer, identity),
                                                   keys[identity]))
    findings = []
    for position, identity in enumerate(ordered, 1):
        finding = merged[identity]
        finding.pop("rank", None)
        finding["moved"] = moved_metrics(finding.get("effect") or {})
        if rows_by_id:
            finding.update(_trial_flags(finding.get("evidence", []), rows_by_id))
        findings.append({"rank": position, **finding})
    names = list(dict.fromkeys(str(d.get("experiment", "?")) for d in steps))
    return {
        "run": run_id or (docs[0].get("run") if docs else None),
        "experiment": ("investigate" if investigation else
                       COMBINED_EXPERIMENT_SEPARATOR.join(names) if names else "none"),
        "metric": docs[0].get("metric") if docs else None,
        "verdict": investigation.get("verdict") if investigation else combined_verdict(steps),
        "answer": answer,
        "experiments": experiment_summaries(steps),
        "findings": findings,
        "system_changes": [c.to_json() for c in system_changes(rows)],
        "sources": [copy.deepcopy(dict(d)) for d in docs],
    }


def _read(path: Path) -> dict | None:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def load_docs(run_dir: Path) -> list[dict]:
    """The per-experiment findings documents of a run directory.

    `findings.json` is either one experiment's document or a ranked one made by :func:`rank`
    (whose `sources` are expanded); every `findings-<name>.json` beside it is one more
    experiment's document. Identical documents are read once.
    """
    docs: list[dict] = []
    seen: set[str] = set()

    def add(doc: Mapping) -> None:
        blob = json.dumps(doc, sort_keys=True, default=str)
        if blob not in seen and isinstance(doc.get("findings", []), list):
            seen.add(blob)
            docs.append(dict(doc))

    main = _read(run_dir / "findings.json")
    if main is not None:
        for doc in main.get("sources") or [main]:
            add(doc)
    for path in sorted(run_dir.glob("findings-*.json")):
        doc = _read(path)
        if doc is not None:
            add(doc)
    return docs
