"""The report's tables as plain strings, shared by the terminal, Markdown and HTML renderers.

One place decides what each table says (columns, number formats, flags); the renderers only
lay the cells out and escape them for their medium. Cells are untrusted text (commit subjects,
environment values, server messages) and are never pre-escaped here.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.answer.compose import not_tested
from orchestrator.answer.text import change_text
from orchestrator.system.fingerprint_diff import show_value
from orchestrator.ui.render import finding_id
from orchestrator.ui.render import probability as fmt_probability
from orchestrator.ui.report import series as S
from orchestrator.ui.report.collect import RunData
from orchestrator.ui.report.fingerprints import fingerprint_diffs
from orchestrator.ui.report.ranking import excludes_zero


@dataclass(frozen=True)
class TextTable:
    key: str  # stable id (HTML anchors, tests)
    title: str
    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    note: str = ""


def fmt_effect(effect: Mapping | None, metric: str = "") -> str:
    """`+53.0% [+47.1, +59.2]`; a large change as a ratio with its levels (`x325 (0.67 ms
    -> 218 ms)`, :func:`orchestrator.answer.text.change_text`)."""
    if not effect or "pct" not in effect:
        return "-"
    return change_text(effect, metric)


def effect_of(finding: Mapping, metric: str) -> dict | None:
    """A finding's effect on `metric`, with the means behind it where the detail has them."""
    e = (finding.get("effect") or {}).get(metric)
    if not e:
        return None
    return {**((finding.get("effect_detail") or {}).get(metric) or {}), **e}


# Columns only some targets fill (SGLang's accept length and CUDA-graph share, the phase):
# left out of a table where no row has a value.
OPTIONAL_COLUMNS = ("phase", "accept len", "cuda graph share", "flags")


def drop_empty(headers: tuple[str, ...], rows: list[tuple[str, ...]],
               optional: tuple[str, ...] = OPTIONAL_COLUMNS
               ) -> tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]:
    keep = [i for i, h in enumerate(headers)
            if h not in optional or any(r[i] not in ("", "-") for r in rows)]
    return (tuple(headers[i] for i in keep), tuple(tuple(r[i] for i in keep) for r in rows))


def split_findings(ranked: Mapping) -> tuple[list[dict], list[dict], list[dict]]:
    """(causes, untested, settings): what was tested as a cause; differences listed but never
    tested (a compare's fingerprint diff); a sweep's better settings, which are not causes."""
    causes, untested, settings = [], [], []
    for f in ranked.get("findings", []):
        if f.get("experiment") == "sweep":
            settings.append(f)
        elif f.get("probability") is None and (f.get("difference") or f.get("untested")):
            untested.append(f)
        else:
            causes.append(f)
    return causes, untested, settings


def untested_lines(ranked: Mapping) -> list[str]:
    """The untested differences, one collapsed line per reason, when the answer does not list
    them: every medium opens with the answer, and its lines said once are enough."""
    if (ranked.get("answer") or {}).get("not_tested") is not None:
        return []
    return [g["line"] for g in not_tested({"findings": split_findings(ranked)[1]})]


def _fmt_number(value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    return f"{value:.4g}"


def _flags(f: Mapping) -> str:
    parts = []
    if f.get("suspect_trials"):
        parts.append(f"{len(f['suspect_trials'])} suspect excluded")
    if f.get("failed_trials"):
        parts.append(f"{len(f['failed_trials'])} failed")
    if f.get("range"):
        parts.append(f"one of {len(f['range'])} commits")
    if f.get("explained") is not None:
        parts.append(f"explains {100 * float(f['explained']):.0f}%")
    return "; ".join(parts)


def findings_table(ranked: Mapping, findings: list[dict] | None = None) -> TextTable:
    """The causes (tested findings), ranked; untested differences and sweep settings have
    their own lines and table."""
    rows = []
    for f in split_findings(ranked)[0] if findings is None else findings:
        effect = f.get("effect") or {}
        metric = f.get("metric") or ranked.get("metric") or ""
        prob = f.get("probability")
        evidence = f.get("evidence") or []
        n_measured = f.get("measured_trials")
        trials = f"{len(evidence)}" + (f" ({n_measured} used)" if n_measured is not None else "")
        rows.append((
            str(f.get("rank", "")),
            str(f.get("kind", "")),
            finding_id(f),
            ", ".join(f.get("experiments") or [str(f.get("experiment", ""))]),
            "-" if prob is None else fmt_probability(float(prob)),
            f"{metric} {fmt_effect(effect_of(f, metric), metric)}" if metric else "-",
            str(f.get("phase") or "-"),
            fmt_effect(effect.get("accept_len")),
            fmt_effect(effect.get("cuda_graph_share")),
            trials,
            _flags(f),
            str(f.get("summary", "")),
        ))
    headers, kept = drop_empty(
        ("rank", "kind", "id", "experiment", "P(cause)", "effect [95% CI]", "phase",
         "accept len", "cuda graph share", "trials", "flags", "summary"), rows)
    return TextTable(
        "findings", f"Causes ({ranked.get('experiment')}, verdict {ranked.get('verdict')})",
        headers, kept,
        "P(cause): the experiment's posterior probability. Effects compare trial-level values"
        " (restarts) of the cause against its parent or reference; suspect trials are excluded.",
    )


def settings_table(ranked: Mapping) -> TextTable:
    """A sweep's findings: the best configuration against the baseline, then each of its
    settings with its main effect. Better settings, not causes."""
    rows = []
    for f in split_findings(ranked)[2]:
        metric = f.get("metric") or ranked.get("metric") or ""
        p = f.get("p_better")
        imp = f.get("importance")
        rows.append((str(f.get("id", "")), f"{metric} {fmt_effect(effect_of(f, metric), metric)}",
                     "-" if p is None else fmt_probability(float(p)),
                     "-" if imp is None else f"{float(imp):.2f}", str(f.get("summary", ""))))
    return TextTable("settings", "Settings (sweep): better than the baseline, not causes",
                     ("setting", "effect [95% CI]", "P(better)", "importance", "summary"),
                     tuple(rows))


def effects_table(finding: Mapping) -> TextTable:
    detail = finding.get("effect_detail") or {}
    rows = []
    for metric, e in (finding.get("effect") or {}).items():
        d = detail.get(metric, {})
        n = d.get("n")
        rows.append((
            metric, fmt_effect({**e, **d}, metric), "yes" if excludes_zero(e) else "no",
            _fmt_number(d.get("before")), _fmt_number(d.get("after")),
            f"{n[0]} vs {n[1]}" if isinstance(n, list | tuple) and len(n) == 2 else "-",
        ))
    return TextTable(
        f"effects-{finding.get('rank')}",
        f"#{finding.get('rank')} {finding.get('kind')} {finding_id(finding)}: effect per metric",
        ("metric", "change [95% CI]", "interval excludes 0", "before", "after", "trials"),
        tuple(rows),
    )


def headline_total(summary: Mapping) -> Mapping | None:
    """An experiment's total change on its metric: bisect writes one `{pct, ci}`, compare one
    per metric."""
    total = summary.get("total_effect")
    if not isinstance(total, Mapping):
        return None
    if "pct" in total:
        return total
    metric_total = total.get(summary.get("metric"))
    return metric_total if isinstance(metric_total, Mapping) else None


def experiments_table(ranked: Mapping) -> TextTable:
    rows = []
    for e in ranked.get("experiments", []):
        rows.append((str(e.get("experiment", "")), str(e.get("metric") or "-"),
                     str(e.get("verdict") or "-"), str(e.get("n_findings", 0)),
                     fmt_effect(headline_total(e)), str(e.get("message") or "")))
    return TextTable("experiments", "Experiments",
                     ("experiment", "metric", "verdict", "findings", "total change", "message"),
                     tuple(rows))


def run_table(data: RunData) -> TextTable:
    outcomes = Counter(r.outcome.value if r.outcome else "running" for r in data.rows)
    nodes = sorted({r.node for r in data.rows if r.node})
    timed = [r.ended_at - r.started_at for r in data.rows if r.started_at and r.ended_at]
    rows = [
        ("run", data.run_id), ("command", data.command), ("status", data.status),
        ("metric", data.metric),
        ("trials", f"{len(data.rows)} ({', '.join(f'{k} {v}' for k, v in sorted(outcomes.items()))})"),
        ("suspect trials", str(sum(1 for r in data.rows if r.suspect))),
        ("nodes", ", ".join(nodes) or "-"),
        ("trial duration", f"median {statistics.median(timed):.1f} s" if timed else "-"),
        ("GPU time", _gpu_time(data)),
    ]
    for doc in data.docs:
        reps = doc.get("repetitions") if isinstance(doc, dict) else None
        if isinstance(reps, dict) and reps.get("reason"):
            rows.append(("repetitions", "; ".join(reps.get("changes") or [reps["reason"]])))
    return TextTable("run", "Run", ("field", "value"), tuple(rows))


def _gpu_time(data: RunData) -> str:
    """Node wall time x GPUs of every trial (modeled time against the simulator)."""
    from orchestrator.run.cost import describe_cost, gpu_minutes

    try:
        from orchestrator.config.settings import as_dict

        target = dict(as_dict(data.config.target))
    except Exception:  # noqa: BLE001 - an unreadable config: real time, GPUs from fingerprints
        target = {}
    spent = describe_cost(gpu_minutes(data.rows, target), modeled=data.simulated)
    return f"{spent} over {len(data.rows)} restarts"


def candidates_table(data: RunData) -> TextTable:
    rows = []
    for s in S.distributions(data, data.metric):
        vals = [p.value for p in s.points if not p.suspect]
        mean = statistics.fmean(vals) if vals else None
        sd = statistics.stdev(vals) if len(vals) > 1 else None
        rows.append((s.full or s.label, str(len(vals)), str(sum(p.suspect for p in s.points)),
                     str(len(s.failed)), _fmt_number(mean), _fmt_number(sd),
                     ", ".join(str(p.trial_id) for p in s.points)))
    return TextTable("candidates", f"Candidates on {data.metric} (trial-level)",
                     ("candidate", "measured", "suspect", "failed", "mean", "sd", "trials"),
                     tuple(rows))


def _suspect_flag(row) -> str:
    if not row.suspect:
        return ""
    reason = row.result.suspect_reason if row.result else ""
    return f"suspect: {reason}" if reason else "suspect"


def trials_table(rows: Sequence) -> TextTable:
    out = []
    for r in rows:
        secs = (r.ended_at - r.started_at) if r.started_at and r.ended_at else None
        out.append((str(r.id), r.node, r.phase, r.candidate.label,
                    r.outcome.value if r.outcome else "running", str(r.attempt),
                    "-" if secs is None else f"{secs:.1f}",
                    _suspect_flag(r), (r.detail or "")[:160]))
    return TextTable("trials", "All trials",
                     ("id", "node", "phase", "candidate", "outcome", "attempt", "seconds",
                      "flag", "detail"), tuple(out))


def fingerprint_tables(data: RunData) -> list[TextTable]:
    out = []
    for i, fd in enumerate(fingerprint_diffs(data)):
        rows = tuple((d.category, d.key, show_value(d.key, d.reference),
                      show_value(d.key, d.now), d.detail,
                      "yes" if d.controllable else "no") for d in fd.differences)
        out.append(TextTable(f"fingerprint-{i}", f"Fingerprint differences: {fd.title}",
                             ("category", "field", "before", "after", "where", "controllable"),
                             rows, "Most plausible cause of a performance change first;"
                             " controllable differences can be tested per trial (isolate)."))
    return out


def release_tables(data) -> list[TextTable]:
    """One table per package release search in the run: every release with its date, the
    restarts measured, or why it was skipped or left out (what "which versions were measured"
    asks of a report)."""
    out = []
    for doc in data.docs:
        package = doc.get("package") if isinstance(doc, Mapping) else None
        if not isinstance(package, Mapping) or "versions" not in package:
            continue
        dates = {r.get("version"): r.get("date", "") for r in package.get("releases", [])}
        named = {f.get("release"): f.get("step", "step") for f in doc.get("findings", [])
                 if f.get("kind") == "package" and f.get("release")}
        rows = []
        for s in package["versions"]:
            v = s.get("version")
            if s.get("skipped"):
                status = f"skipped: {s['skipped']}"
            elif s.get("measured"):
                status = "measured" + (f"; {named[v]} here" if v in named else "")
            else:
                status = "not needed by the search"
            rows.append((str(v), str(dates.get(v) or "-"), str(s.get("measured", 0)), status))
        rows += [(str(e.get("version")), "-", "0", f"left out: {e.get('why')}")
                 for e in package.get("excluded", [])]
        out.append(TextTable(key=f"releases-{package.get('name')}",
                             title=f"releases of {package.get('name')} ({package.get('source')})",
                             headers=("release", "date", "restarts", "status"),
                             rows=tuple(rows)))
    return out
