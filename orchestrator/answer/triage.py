"""Answers that join several experiments' documents: a whole investigation (the compare, the
isolate, the bisect and the sweep of one triage), the system-level answer of a compare and
its isolate, and the choice of which answer a run with several documents leads with.

`compose` builds the answer of one document; these add the parts up across documents (the
system's part, the code's part, what neither names).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.answer import text as T
from orchestrator.answer.combine import LogChange
from orchestrator.answer.compose import (
    _means,
    _total,
    _total_effect,
    assemble,
    causes_of,
    for_sweep,
    not_tested,
)
from orchestrator.answer.provisional import so_far


def for_system(compare_doc: Mapping, isolate_doc: Mapping | None, *,
               same_code: str = "") -> dict:
    """Same code, different result: the compare's change since the reference, the isolate's
    tested causes, and the differences nobody tested."""
    metric = str(compare_doc.get("metric", ""))
    causes = causes_of(isolate_doc) if isolate_doc else []
    lead = "since the reference" + (f", same code ({same_code})" if same_code else
                                    ", same code and configuration")
    whole_doc = compare_doc
    if compare_doc.get("verdict") == "unresolved" and isolate_doc and _total(isolate_doc):
        # The reference's own restarts could not decide (often a single number from an
        # earlier session); the isolate measured its configuration, recreated, against the
        # node as it is, both sides now: that total is the one its causes add up to.
        whole_doc = isolate_doc
        old = _total_effect(compare_doc)
        lead = ("against the reference's configuration recreated now (against the reference's"
                " own restarts: undecided"
                + (f", {T.change_text(old, metric)}" if old and "ci" in old else "") + ")")
        if compare_doc.get("no_level"):  # an old log that never printed the metric
            lead = (f"against the reference's configuration recreated now (the log holds no"
                    f" {metric})")
    return assemble(metric, _total(whole_doc), causes, lead=lead,
                    whole_extra=_means(whole_doc), not_tested_groups=not_tested(compare_doc),
                    mechanism=(compare_doc.get("answer") or {}).get("mechanism"),
                    code_clause="code not the cause (the same commit then and now)",
                    attribution=(isolate_doc or {}).get("attribution"))


def for_investigation(metric: str, whole: LogChange | None, *, whole_extra: Mapping,
                      reference: str, bad: str, compare_doc: Mapping | None,
                      isolate_doc: Mapping | None, bisect_doc: Mapping | None,
                      sweep_doc: Mapping | None, mechanism: Mapping | None,
                      next_step: str = "", min_effect_pct: float | None = None,
                      check: Mapping | None = None, compare_stale: bool = False) -> dict:
    """The whole triage's answer: the change from the reference (then) to the bad commit
    (now), split into the system's part (the compare, its causes tested by the isolate) and
    the code's part (the bisect, its culprits), with what neither names left over.

    Without a reference the total is the bisect's own (good vs bad, both now).
    `compare_stale`: the node's system changed after the compare: its verdict is not said as
    the system's part (a clock lock set mid-run is then in the total, and "the system is not
    the cause" right after "+31% left" contradicted it)."""
    causes = (causes_of(isolate_doc) if isolate_doc else []) + code_causes(bisect_doc)
    clauses = []
    parts: dict = {}
    if compare_doc is not None:
        system = _total_effect(compare_doc)
        verdict = compare_doc.get("verdict")
        if system:
            parts["system"] = {k: system[k] for k in ("pct", "ci", "log") if k in system}
        if compare_stale:
            clauses.append("whether the system is the cause is not comparable (the reference"
                           " was re-measured before the node changed)")
        elif verdict == "reproduced":
            clauses.append("the system is not the cause (the reference reproduces: "
                           f"{T.change_text(system, metric)})")
        elif verdict != "not_reproduced" and not compare_doc.get("no_level"):
            clauses.append("whether the reference still reproduces is undecided")
    if bisect_doc is None:
        if compare_doc is not None:
            clauses.append("code not the cause (the same commit then and now)")
    else:
        code = _total_effect(bisect_doc)
        if code:
            parts["code"] = {k: code[k] for k in ("pct", "ci", "log") if k in code}
        verdict = bisect_doc.get("verdict")
        if verdict == "not_reproducible":
            clauses.append("code not the cause (today the range measures "
                           f"{T.change_text(code, metric) if code else 'alike'})")
        elif verdict != "found":
            clauses.append(f"the code range is undecided ({verdict})")
    lead = f"from {reference} to {bad}"
    elsewhere = (compare_doc is None and bisect_doc is not None
                 and bisect_doc.get("verdict") == "not_reproducible")
    doc = assemble(metric, whole, causes, lead=lead, whole_extra=whole_extra,
                   status="not_in_code" if elsewhere else None,
                   code_clause="; ".join(clauses),
                   not_tested_groups=not_tested(compare_doc),
                   settings=for_sweep(sweep_doc)["settings"] if sweep_doc else (),
                   mechanism=mechanism, next_step=next_step, min_effect_pct=min_effect_pct,
                   check=check, attribution=(isolate_doc or {}).get("attribution"))
    doc["parts"] = parts
    return doc


def code_causes(bisect_doc: Mapping | None) -> list[dict]:
    """The bisect's culprits as causes: all of a finished bisect's; of one stopped before its
    end (budget, interrupted), those verified against their parent at the run's confidence,
    never its best guess."""
    if not bisect_doc:
        return []
    causes = causes_of(bisect_doc)
    if bisect_doc.get("verdict") == "found":
        return causes
    level = float(bisect_doc.get("confidence") or 0.99)
    return [c for c in causes if c.get("verified") and (c.get("probability") or 0.0) >= level]


def pick(docs: Sequence[Mapping]) -> dict | None:
    """The answer of a run holding several experiments' documents: an investigation's own, else
    the only one, else the first cause-finding experiment's."""
    for d in docs:
        if d.get("experiment") == "investigate" and d.get("answer"):
            return dict(d["answer"])
    by_kind = {d.get("experiment"): d for d in docs}
    compare, isolate = by_kind.get("compare"), by_kind.get("isolate")
    if compare and isolate and compare.get("verdict") in ("not_reproduced", "unresolved") \
            and "bisect" not in by_kind:
        joined = for_system(compare, isolate)
        stop = isolate.get("provisional") or (isolate.get("answer") or {}).get("provisional")
        if stop:  # an isolate stopped before its end: the joined answer is as far as known
            joined = so_far(joined, why=str(stop.get("why", "")),
                            searching=bool(stop.get("searching", True)),
                            confidence=float(stop.get("confidence") or 0.99))
        return joined
    with_answer = [d for d in docs if d.get("answer")]
    if len(with_answer) == 1:
        return dict(with_answer[0]["answer"])
    for kind in ("bisect", "isolate", "compare", "sweep"):
        for d in with_answer:
            if d.get("experiment") == kind:
                return dict(d["answer"])
    return None

