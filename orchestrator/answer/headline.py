"""The answer as a person reads it first: one line, then labelled lines.

The whole answer in one sentence (total, causes, remainder, overlap, restore-all, restore-alone,
yardstick) ran to 15 wrapped lines in the README's own demo. Now the first line names the total
and the causes in order with their effects and the bound on what is left, in about 200
characters:

    verify_ms x2.06 (18.1 ms -> 37.4 ms) = power limit 600 W -> 450 W +29.0% + NCCL_PROTO
    LL128 -> unset +4.0% + commit b2d8735bb927 +52.7%; nothing larger than 7.5% left

and what follows it is one labelled line each (`compared:`, `left:`, `overlap:`, `restore:`,
`code:`, `system changed:` ...). Causes that overlap or hurt only together are one item there
and one row of the causes table (:func:`groups`): two rows of +17% each under "restore both"
read as two things to fix. The full sentence stays in `findings.json` (`sentence`).

Computed from the answer's structured fields only, so every renderer and every modifier of an
answer (a node that changed, a run stopped early) shows the same lines. Pure functions.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from orchestrator.answer import text as T
from orchestrator.answer.combine import LogChange, total

HEADLINE_CHARS = 200
LABEL_CHARS = 48


def short_label(cause: Mapping) -> str:
    """A cause as the first line names it: a commit by its SHA (its subject is in the
    table), a difference by its levels."""
    if cause.get("kind") == "commit" and cause.get("sha"):
        return f"commit {str(cause['sha'])[:12]}"
    label = str(cause.get("label", cause.get("id", "")))
    if len(label) > LABEL_CHARS:
        main = label.split(" (")[0]  # a release's "(regression in X against Y)": the table's
        if len(main) <= LABEL_CHARS and not label.endswith("(only together)"):
            return main
        if cause.get("id"):  # a pair's levels: its names say enough
            together = " (only together)" if label.endswith("(only together)") else ""
            label = str(cause["id"]) + together
    return T.subject(label, 80)


def groups(answer: Mapping) -> list[dict]:
    """The causes as the reader acts on them: two that overlap (either alone gives most of
    it: restore both) or hurt only together are one group, with their summed share; the rest
    one each, in the answer's order."""
    causes = list(answer.get("causes") or [])
    relations = (answer.get("attribution") or {}).get("relations") or []
    labels = [str(c.get("label") or "") for c in causes]
    attributed = [str(c.get("label", "")) for c in
                  (answer.get("attribution") or {}).get("causes", [])]
    merged: dict[int, int] = {}
    kinds: dict[int, str] = {}
    for rel in relations:
        pair = rel.get("causes") or []
        if len(pair) != 2 or not (rel.get("full") or rel.get("most")):
            continue
        try:  # the attribution numbers its causes; the answer lists them by label
            a, b = (labels.index(attributed[k]) for k in pair)
        except (ValueError, IndexError):
            continue
        if a in merged or b in merged:
            continue
        merged[b] = a
        kinds[a] = str(rel.get("kind"))
    out: list[dict] = []
    for i, c in enumerate(causes):
        if i in merged:
            continue
        members = [c] + [causes[j] for j, head in merged.items() if head == i]
        if len(members) == 1:
            out.append({"label": short_label(c), "causes": [c], "pct": c.get("pct"),
                        "ci": c.get("ci"), "log": c.get("log"), "share": c.get("share"),
                        "probability": c.get("probability"),
                        **{k: c[k] for k in ("before", "after") if k in c}})
            continue
        joined = total(LogChange(*m["log"]) for m in members if m.get("log"))
        word = "overlap: restore both" if kinds.get(i) == "overlap" else "only together"
        probs = [m.get("probability") for m in members if m.get("probability") is not None]
        shares = [m.get("share") for m in members if isinstance(m.get("share"), int | float)]
        item = {"label": " + ".join(short_label(m) for m in members) + f" ({word})",
                "causes": members, "probability": min(probs) if probs else None,
                "share": math.fsum(shares) if len(shares) == len(members) else None}
        if joined is not None:
            item.update(joined.to_json())
        out.append(item)
    return out


def _effect(item: Mapping) -> str:
    return T.pct_text(item.get("pct")) if isinstance(item.get("pct"), int | float) else "?"


def left_words(answer: Mapping) -> str:
    """What the causes leave, in words the first line ends with."""
    rest = answer.get("unexplained") or {}
    bound = (answer.get("min_effect") or {}).get("pct")
    bound_text = f"{bound:.1f}%" if isinstance(bound, int | float) else "the min effect"
    decision = rest.get("decision")
    causes = answer.get("causes") or []
    if decision == "explained":
        return f"nothing larger than {bound_text} left"
    if decision == "no_change":
        return f"no change larger than {bound_text}"
    if rest.get("left"):
        return str(rest["left"])
    if decision == "remainder":
        if not causes:
            return "no cause named"
        return f"more than the {bound_text} min effect is left ({T.pct_text(rest.get('pct'))})"
    if not causes:
        return f"undecided whether it changed by more than {bound_text}"
    return f"undecided whether more than {bound_text} is left"


def headline(answer: Mapping, limit: int = HEADLINE_CHARS) -> str:
    """The first line: the total, the causes (grouped) with their effects, what is left."""
    stop = answer.get("provisional") or {}
    if answer.get("status") == "provisional" and stop.get("headline"):
        return str(stop["headline"])
    metric = str(answer.get("metric", ""))
    head = ""
    if (answer.get("system_changed") or {}).get("summary"):
        head = f"node changed during the run ({answer['system_changed']['summary']}): "
    whole = answer.get("total")
    if not whole:
        return head + str(answer.get("lead") or answer.get("sentence") or "")
    items = groups(answer)
    for levels in (True, False):
        total_text = f"{metric} {T.change_text(whole, metric, interval=False)}" if levels \
            else f"{metric} {T.pct_text(whole.get('pct'))}"
        for shown in range(len(items), -1, -1):
            parts = [f"{g['label']} {_effect(g)}" for g in items[:shown]]
            if shown < len(items):
                parts.append(f"{len(items) - shown} more (table)")
            line = head + total_text
            if parts:
                line += " = " + " + ".join(parts)
            line += "; " + left_words(answer)
            if len(line) <= limit or (not levels and shown == 0):
                return line
    return line  # pragma: no cover - the loop always returns


def lines(answer: Mapping) -> list[dict]:
    """The labelled lines after the first: what the total compares, the remainder with its
    interval, overlap and synergy, what restoring wins back, the code range's clause, a node
    that changed, a final check that could not decide, a run stopped early."""
    from orchestrator.answer.attribution import relation_lines

    metric = str(answer.get("metric", ""))
    out: list[dict] = []

    def add(label: str, text: str) -> None:
        if text:
            out.append({"label": label, "text": text})

    changed = answer.get("system_changed") or {}
    add("system changed", str(changed.get("line") or ""))
    stop = answer.get("provisional") or {}
    if answer.get("status") == "provisional":
        add("stopped", str(stop.get("why") or ""))
    whole = answer.get("total")
    if whole and answer.get("lead"):
        add("compared", f"{metric} {T.change_text(whole, metric)} {answer['lead']}")
    rest = answer.get("unexplained")
    if rest and answer.get("causes"):
        add("left", f"unexplained {T.change_text(rest, metric)}: {left_words(answer)}"
            + str(answer.get("check_words") or ""))
    elif whole and answer.get("check_words"):
        add("left", left_words(answer) + str(answer["check_words"]))
    for label, text in relation_lines(answer.get("attribution") or {}, _pct_ci):
        add(label, text)
    for clause in answer.get("code_clauses") or []:
        add("code", str(clause))
    said = (answer.get("code_yardstick") or {}).get("said")
    add("yardstick", str(said or ""))
    add("outside the range", str((answer.get("outside") or {}).get("line") or ""))
    for merge in answer.get("merges") or []:
        add("merge", f"commit {str(merge['sha'])[:12]} is a merge: the step came in with the"
            f" branch it merged; {merge['command']} searches that branch's commits")
    return out


def _pct_ci(change: Mapping) -> str:
    return f"{T.pct_text(change['pct'])} {T.interval_text(change['ci'], change['pct'])}"


def refresh(answer: dict) -> dict:
    """Store the first line and the labelled lines in `answer` (in place; returned)."""
    answer["headline"] = headline(answer)
    answer["lines"] = lines(answer)
    return answer


def text_lines(answer: Mapping) -> Sequence[str]:
    """`answer: <first line>` and `  <label>: <text>` lines, as every renderer prints them."""
    first = answer.get("headline") or headline(answer)
    rest = answer.get("lines")
    if rest is None:
        rest = lines(answer)
    return [f"answer: {first}", *(f"  {item['label']}: {item['text']}" for item in rest)]
