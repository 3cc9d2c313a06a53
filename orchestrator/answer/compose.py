"""The `answer` of a findings document: one sentence, its causes with intervals, what is left.

Every run kind ends in an answer built here from its findings document (and, where the command
has the trials, the mechanism of :mod:`orchestrator.answer.phases`). Its parts, as
`findings.json` carries them:

- `sentence`: what a person reads first, e.g. "verify_ms +53.2% [+47.1, +59.6] = power limit
  600 W -> 450 W +30.1% [..] + commit b2d8735e1f0a "Refactor verify" +17.9% [..]; unexplained
  -0.4% [-5.1, +4.5]";
- `total`: the change being explained, with its interval (`before` / `after` means);
- `causes`: each named cause with its effect on the run's metric, its share of the total on the
  log scale, the probability the experiment gave it, and what found it;
- `explained` / `unexplained`: the causes' sum and the remainder, with intervals
  (:mod:`orchestrator.answer.combine`); `min_effect`: the run's min effect the remainder is
  judged against; `explains`: whether the remainder's interval lies within it (or, with no
  cause named, the change's own interval does: "no change larger than x%");
- `status`: explained (the remainder within the min effect, or undecided against it while
  the named causes carry the change: `unexplained.up_to` / `left` say how much may be left) |
  no_change | partly_explained (a remainder larger than the min effect is shown) |
  unexplained (a change, no cause named) | undecided | not_in_code; the exit code reads it
  (`orchestrator/errors.py`);
- `headline` / `lines`: the first line and the labelled lines a person reads first
  (:mod:`orchestrator.answer.headline`); the full `sentence` stays;
- `final_check`: the restarts the final check may spend and spent, when one ran;
- `not_tested`: differences that were listed but never tested, one group per reason;
- `settings`: a sweep's better configuration, kept apart from causes;
- `mechanism`: which phase moved, CUDA-graph share, SM clock and power, before vs after.

Size: one module because every run kind's answer goes through `assemble`, and the rules it
applies (how the remainder is judged, when the causes carry the change, how it is worded)
must read the same for all of them; the per-kind adapters (`for_bisect`, `for_isolate`,
`for_compare`, `for_sweep`) are a few lines each over it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from orchestrator.answer import text as T
from orchestrator.answer.attribution import sentence as attribution_sentence
from orchestrator.answer.combine import (
    EXPLAINED,
    NO_CHANGE,
    REMAINDER,
    UNDECIDED,
    Decision,
    LogChange,
    decide,
    min_effect,
    share,
    total,
)
from orchestrator.answer.combine import min_effect_pct as min_effect_pct_of
from orchestrator.answer.headline import refresh

NOT_TESTED_SHOWN = 8


def _effect_of(finding: Mapping, metric: str) -> Mapping | None:
    detail = (finding.get("effect_detail") or {}).get(metric)
    return detail if detail else (finding.get("effect") or {}).get(metric)


def cause_label(finding: Mapping) -> str:
    """How a finding reads as a cause: a commit with its subject, a difference with its
    levels (`power limit 600 W -> 450 W`), a pair joined by `+`."""
    if finding.get("kind") == "commit":
        return T.commit_label(str(finding.get("id", "")), finding.get("subject"))
    if finding.get("kind") == "package" and finding.get("release") and finding.get("label"):
        return str(finding["label"])  # a release against the one before it
    diffs = finding.get("differences") or []
    if diffs:
        joined = " with ".join(T.change_label(str(d.get("label") or d.get("key"))) for d in diffs)
        return joined + (" (only together)" if finding.get("interaction") else "")
    return T.subject(finding.get("id", ""), 80)


def cause(finding: Mapping, metric: str, experiment: str) -> dict | None:
    """A finding with a probability of being a cause, as an answer's cause (None if it has no
    effect on `metric`)."""
    effect = _effect_of(finding, metric)
    change = LogChange.from_effect(effect)
    if change is None:
        return None
    doc = {"kind": finding.get("kind"), "id": finding.get("id"), "label": cause_label(finding),
           "experiment": experiment, "probability": finding.get("probability"),
           **change.to_json(), "phase": finding.get("phase")}
    for key in ("before", "after"):
        if isinstance((effect or {}).get(key), int | float):
            doc[key] = effect[key]
    if finding.get("kind") == "commit":
        doc["sha"], doc["subject"] = finding.get("id"), finding.get("subject")
    if isinstance(finding.get("verified"), bool):
        doc["verified"] = finding["verified"]
    if finding.get("before_key") and finding.get("after_key"):  # what the effect compares
        doc["keys"] = [finding["before_key"], finding["after_key"]]
    return doc


def causes_of(doc: Mapping) -> list[dict]:
    """The tested causes of a bisect or isolate document, most probable first. With an
    isolate's attribution, each cause's effect is its share (they sum to what restoring all of
    them wins back, whatever their overlap) and it carries its "restore alone" and "added
    alone" effects (:mod:`orchestrator.answer.attribution`)."""
    metric = str(doc.get("metric", ""))
    shares = {c.get("id"): c for c in (doc.get("attribution") or {}).get("causes", [])}
    out = []
    for f in doc.get("findings", []):
        if f.get("probability") is None:
            continue
        c = cause(f, metric, str(doc.get("experiment", "")))
        if c is None:
            continue
        attributed = shares.get(f.get("id"))
        if attributed is not None:
            c.update(LogChange(*attributed["share"]["log"]).to_json())  # 95%, as every cause
            for key in ("restore_alone", "add_alone"):
                if attributed.get(key):
                    c[key] = dict(attributed[key])
        out.append(c)
    return out


def not_tested(compare_doc: Mapping | None) -> list[dict]:
    """The compare's differences nobody tested, one group per reason, most likely first."""
    if not compare_doc:
        return []
    groups: dict[str, list[str]] = {}
    for f in compare_doc.get("findings", []):
        d = f.get("difference") or {}
        reason = f.get("untested") or "not tested yet"
        if reason.startswith("set aside"):  # a shell's own variables: their names say enough
            item = str(d.get("key") or f.get("id"))
        elif d.get("category") == "unknown":  # what an old log cannot tell, and how it is now
            item = f"{d.get('key')} ({d.get('now')})"
        else:
            item = T.change_label(str(d.get("label") or f.get("id")))
        groups.setdefault(reason, []).append(item)
    order = ["not tested yet", "not settable per trial", "set aside: shell/session variable",
             "not in the reference's record (unknown then)"]
    out = []
    for reason in sorted(groups, key=lambda r: order.index(r) if r in order else len(order)):
        items = groups[reason]
        what = ("shell/session variable" if reason.startswith("set aside") else "difference")
        plural = "s" if len(items) != 1 else ""
        # Every renderer prints the line after "not tested: ", so the line does not say it
        # again (a package's reason arrives as "not tested: no package source ...").
        why = {"set aside: shell/session variable": "that changed",
               "not settable per trial": "that cannot be set per trial",
               "not in the reference's record (unknown then)": "the reference cannot tell"
                                                               " (unknown then)",
               "not tested yet": "in the fingerprint (most likely first)"}.get(reason)
        shown = ", ".join(items[:NOT_TESTED_SHOWN]) + (" ..." if len(items) > NOT_TESTED_SHOWN
                                                       else "")
        line = (f"{len(items)} {what}{plural} {why}: {shown}" if why else
                f"{len(items)} {what}{plural}: {shown} ({reason.removeprefix('not tested: ')})")
        out.append({"reason": reason, "count": len(items), "items": items, "line": line})
    return out


def restore_sentence(attribution: Mapping) -> str:
    """What restoring the system causes wins back, in words (overlap, synergy)."""
    return attribution_sentence(
        attribution, lambda c: f"{T.pct_text(c['pct'])} {T.interval_text(c['ci'], c['pct'])}")


def clause(label: str, change: Mapping) -> str:
    pct = change["pct"]
    return f"{label} {T.pct_text(pct)} {T.interval_text(change['ci'], pct)}".rstrip()


def _bound_text(decision: Decision) -> str:
    return f"{min_effect_pct_of(decision.bound):.1f}%"


def _rest_words(decision: Decision, check: Mapping | None, up_to: str | None = None) -> str:
    """What the remainder means against the min effect, in words after its interval."""
    bound = _bound_text(decision)
    if decision.status == EXPLAINED:
        return f"nothing larger than {bound} left"
    if decision.status == REMAINDER:
        return f"more than the {bound} min effect is left"
    if up_to is not None:
        return up_to + _check_words(check)
    return f"undecided whether more than {bound} is left" + _check_words(check)


def carried(whole: LogChange, rest: LogChange) -> float | None:
    """Do the named causes demonstrably carry the change, where the remainder is undecided
    against the min effect? They do when the total is shown and the remainder's 95% interval
    cannot hold half of it; then the answer states how much may be left: the interval's end
    on the total's side, in percent (returned). None when they do not.

    An undecided remainder was exit 4: with 5% restart noise twelve restarts give it about
    +-5%, against a 4% min effect, so "undecided" was the expected outcome of a right answer.
    What a CI job needs to know is whether the named causes are the change; how much may be
    left beside them is said with the interval."""
    if whole.diff == 0 or not whole.excludes_zero():
        return None
    lo, hi = rest.log_interval()
    far = hi if whole.diff > 0 else -lo
    if not math.isfinite(far) or far >= 0.5 * abs(whole.diff):
        return None
    edge = hi if whole.diff > 0 else lo  # the end on the total's side: what may be left
    return round(100.0 * math.expm1(edge), 3)


def left_text(up_to: float, whole: LogChange, rest: LogChange, bound: float) -> str:
    """How much a bounded remainder may leave, in words: "up to +5.6% may be left" when the
    interval reaches past the min effect on the total's side; where only its other end does
    (the named causes may overstate the change), by how much they may overstate it."""
    lo, hi = rest.log_interval()
    toward, away = (hi, lo) if whole.diff > 0 else (-lo, -hi)
    if toward > bound or away >= -bound:
        return f"up to {T.pct_text(up_to)} may be left"
    over = 100.0 * -math.expm1(away)
    return f"the named causes may overstate it by up to {over:.1f}%"


def _check_words(check: Mapping | None) -> str:
    if not check or not check.get("budget"):
        return ""
    if check.get("resolution"):
        res = check["resolution"]
        return (f" (at the restart noise measured, {res['sigma_pct']:.1f}% a restart, the"
                f" final check's {check.get('spent', 0)} of {check['budget']} restarts resolve"
                f" the remainder to +-{res['pct']:.1f}%: more restarts, repetitions"
                " (bench.repetitions) or a quieter node would narrow it)")
    floor = check.get("floor")
    if floor:
        n = floor["n_then"]
        which = f"{n} restarts alone keep" if n != 1 else "1 restart alone keeps"
        return (f" (the reference's {which} its interval"
                f" +-{floor['pct']:.1f}% wide however often now is measured: the final check"
                f" stopped after {check.get('spent', 0)} of {check['budget']} restarts; a"
                " reference of more restarts could decide it)")
    return (f" (the final check's {check.get('spent', 0)} of {check['budget']} restarts did"
            " not decide it)")


def assemble(metric: str, whole: LogChange | None, causes: Sequence[dict], *, lead: str,
             whole_extra: Mapping | None = None, code_clause: str = "",
             not_tested_groups: Sequence[dict] = (), settings: Sequence[dict] = (),
             mechanism: Mapping | None = None, next_step: str = "",
             status: str | None = None, attribution: Mapping | None = None,
             min_effect_pct: float | None = None, check: Mapping | None = None) -> dict:
    """An answer from the total change, the named causes and the rest.

    `lead` is what the total compares ("from good X to bad Y"); `code_clause` says what the
    code range contributed when no commit was named ("code not the cause ..."); `attribution`
    what restoring the system causes wins back and how they overlap, said after the causes.
    The remainder is judged against the run's min effect (`min_effect_pct` when the user
    stated one, else :func:`orchestrator.answer.combine.min_effect`); `check` describes the
    final check that measured the endpoints for it (its restart budget and what it spent), if
    one ran."""
    logs = [LogChange(*c["log"]) for c in causes]
    doc: dict = {"metric": metric, "causes": [dict(c) for c in causes],
                 "not_tested": list(not_tested_groups), "settings": list(settings),
                 "mechanism": dict(mechanism or {}), "next": next_step, "lead": lead,
                 "code_clauses": [c for c in code_clause.split("; ") if c]}
    if check:
        doc["final_check"] = dict(check)
    if whole is None:
        doc.update(total=None, explained=None, unexplained=None, explains=False,
                   status=status or "undecided")
        doc["sentence"] = lead
        return refresh(doc)
    doc["total"] = {**whole.to_json(), **(whole_extra or {})}
    for c, change in zip(doc["causes"], logs, strict=True):
        c["share"] = share(change, whole)
    decision = decide(whole, logs, min_effect(whole, min_effect_pct))
    doc["min_effect"] = {"pct": _round_pct(min_effect_pct_of(decision.bound)),
                         "stated": min_effect_pct is not None}
    if logs:
        named = total(logs)
        doc["explained"] = {**named.to_json(), "share": share(named, whole)}
        doc["unexplained"] = {**decision.rest.to_json(), "share": share(decision.rest, whole),
                              "decision": decision.status}
    else:
        doc["explained"] = None
        doc["unexplained"] = {**whole.to_json(), "share": 1.0 if whole.excludes_zero() else None,
                              "decision": decision.status}
    up_to = carried(whole, decision.rest) if logs and decision.status == UNDECIDED else None
    bounded = (left_text(up_to, whole, decision.rest, decision.bound) if up_to is not None
               else None)
    if up_to is not None:
        doc["unexplained"]["up_to"] = up_to
        doc["unexplained"]["left"] = bounded
    doc["explains"] = decision.settled or up_to is not None
    if status is None:
        status = {EXPLAINED: "explained", NO_CHANGE: "no_change",
                  REMAINDER: "partly_explained" if logs else "unexplained",
                  UNDECIDED: "explained" if up_to is not None else "undecided"}[decision.status]
    doc["status"] = status
    doc["check_words"] = _check_words(check) if decision.status == UNDECIDED else ""
    total_text = f"{metric} {T.change_text(doc['total'], metric)}"
    head = f"{total_text} {lead}".strip() if lead else total_text
    if causes:
        sentence = head + " = " + " + ".join(clause(c["label"], c) for c in doc["causes"])
        sentence += ("; " + clause("unexplained", doc["unexplained"]) + ": "
                     + _rest_words(decision, check, bounded))
    elif decision.status == NO_CHANGE:
        sentence = head + f": no change larger than {_bound_text(decision)}"
    elif decision.status == REMAINDER:
        sentence = head + "; no cause named"
    else:
        sentence = (head + f": undecided whether it changed by more than"
                    f" {_bound_text(decision)}" + _check_words(check))
    if attribution and causes:
        doc["attribution"] = dict(attribution)
        sentence += "; " + restore_sentence(attribution)
    if code_clause:
        sentence += f"; {code_clause}"
    doc["sentence"] = sentence
    return refresh(doc)


def _round_pct(value: float) -> float:
    return round(value, 2)


def _total_effect(doc: Mapping) -> Mapping | None:
    """A document's total change on its metric: `total_detail` (every endpoint trial, with
    its log-scale estimate) where a bisect has one, else `total_effect` (one `{pct, ci}`, or
    one per metric as compare and isolate write it)."""
    t = doc.get("total_detail") or doc.get("total_effect")
    if isinstance(t, Mapping) and "pct" not in t:
        t = t.get(doc.get("metric"))
    return t if isinstance(t, Mapping) else None


def _total(doc: Mapping) -> LogChange | None:
    return LogChange.from_effect(_total_effect(doc))


def _means(doc: Mapping) -> dict:
    t = _total_effect(doc) or {}
    return {k: t[k] for k in ("before", "after", "n") if k in t}


def _stated(doc: Mapping) -> float | None:
    """The min effect the user stated for the run (`min_effect_pct` in its document)."""
    value = doc.get("min_effect_pct")
    return float(value) if isinstance(value, int | float) else None


def for_bisect(doc: Mapping, *, good: str = "", bad: str = "",
               mechanism: Mapping | None = None, next_step: str = "") -> dict:
    metric = str(doc.get("metric", ""))
    whole = _total(doc)
    verdict = doc.get("verdict")
    span = f"from good {good} to bad {bad}" if good and bad else ""
    if verdict == "not_reproducible":
        lead = f"between good {good} and bad {bad} today" if good and bad else \
            "between the endpoints today"
        return assemble(metric, whole, [], lead=lead, whole_extra=_means(doc),
                        code_clause="the code in between is not the cause",
                        mechanism=mechanism, next_step=next_step, status="not_in_code",
                        min_effect_pct=_stated(doc))
    if whole is None:
        return assemble(metric, None, [], lead=f"bisect {verdict}: {doc.get('message', '')}",
                        mechanism=mechanism, next_step=next_step)
    return assemble(metric, whole, causes_of(doc), lead=span, whole_extra=_means(doc),
                    mechanism=mechanism, next_step=next_step, min_effect_pct=_stated(doc))


def for_isolate(doc: Mapping, *, mechanism: Mapping | None = None) -> dict:
    metric = str(doc.get("metric", ""))
    return assemble(metric, _total(doc), causes_of(doc),
                    lead="from the good to the bad configuration", whole_extra=_means(doc),
                    mechanism=mechanism, attribution=doc.get("attribution"),
                    min_effect_pct=_stated(doc))


def for_compare(doc: Mapping, *, mechanism: Mapping | None = None, next_step: str = "") -> dict:
    metric = str(doc.get("metric", ""))
    whole = _total(doc)
    verdict = doc.get("verdict")
    groups = not_tested(doc)
    if verdict == "reproduced":
        return assemble(metric, whole, [], lead="against the reference: it reproduces",
                        whole_extra=_means(doc), mechanism=mechanism, status="no_change",
                        min_effect_pct=_stated(doc))
    if verdict == "not_reproduced":
        return assemble(metric, whole, [], lead="against the reference, same code and"
                        " configuration: system level", whole_extra=_means(doc),
                        not_tested_groups=groups, mechanism=mechanism, next_step=next_step,
                        status="unexplained", min_effect_pct=_stated(doc))
    return assemble(metric, whole, [], lead="against the reference: undecided",
                    whole_extra=_means(doc), mechanism=mechanism, status="undecided",
                    min_effect_pct=_stated(doc))


def for_sweep(doc: Mapping) -> dict:
    """A sweep names better settings, not causes: its best configuration goes to `settings`."""
    metric = str(doc.get("metric", ""))
    settings = []
    best = next((f for f in doc.get("findings", []) if f.get("config") is not None), None)
    if best is not None:
        e = _effect_of(best, metric)
        settings.append({"id": best.get("id"), "config": best.get("config"),
                         "p_better": best.get("p_better"),
                         **({k: e[k] for k in ("pct", "ci", "before", "after") if k in e}
                            if e else {})})
    verdict = str(doc.get("verdict"))
    n = doc.get("n_configurations")
    if best is not None and settings[0].get("pct") is not None:
        # The search ranks its configurations on one restart or a few each; only the
        # confirmation (the leader against the baseline, interleaved) is a claim. So the
        # sentence says what was confirmed and against what, never "best of n".
        effect = f"{metric} {T.change_text(settings[0], metric)}"
        leader = f"the search's leader of {n} configurations" if n else "the search's leader"
        edge = _good_edge(settings[0], doc)
        sentence = {
            "found": f"{best.get('id')} beats the baseline: {effect} ({leader}, confirmed"
                     " against the baseline head to head, not against the other"
                     " configurations)",
            "baseline_best": f"the baseline is best: {best.get('id')}, {leader}, measured"
                             f" {effect} against it head to head",
            "no_better": f"no setting measured beats the baseline by more than"
                         f" {T.pct_text(edge)}: {best.get('id')}, {leader}, {effect} against"
                         " it head to head (within the noise)",
        }.get(verdict, f"{best.get('id')}: {effect} against the baseline ({leader}; not"
                       " confirmed: its interval reaches past the min effect on both sides)")
    else:
        sentence = f"sweep {verdict}: {doc.get('message', '')}".strip()
    out = {"metric": metric, "sentence": sentence, "total": None, "causes": [],
           "explained": None, "unexplained": None,
           "explains": verdict in ("found", "baseline_best", "no_better"),
           "status": verdict, "not_tested": [], "settings": settings, "mechanism": {},
           "next": ""}
    return refresh(out)


def _good_edge(effect: Mapping, doc: Mapping) -> float | None:
    """The end of a sweep effect's interval on the better side (which side is better: the
    sweep's direction)."""
    ci = effect.get("ci") or []
    if len(ci) != 2:
        return None
    return ci[1] if doc.get("maximize", doc.get("direction") == "maximize") else ci[0]
