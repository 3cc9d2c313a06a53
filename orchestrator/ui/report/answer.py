"""The answer as every medium opens with it: a sentence, the causes that add up, the rest.

Shared by the terminal, `report.md` and `report.html`: the same lines and the same table, so
the three never tell different stories. The numbers are the answer's own
(:mod:`orchestrator.answer`); this module only decides their order and wording.
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.answer.headline import groups
from orchestrator.answer.text import change_text
from orchestrator.ui.render import probability as fmt_probability
from orchestrator.ui.report.tables import TextTable


def _share(value) -> str:
    return "-" if not isinstance(value, int | float) else f"{100 * value:.0f}%"


def causes_table(answer: Mapping) -> TextTable:
    """Cause, effect on the metric with its interval, share of the total (log scale), the
    probability the experiment gave it and which experiment named it; then the remainder."""
    metric = str(answer.get("metric", ""))
    rows = []
    for g in groups(answer):  # an overlapping or synergistic pair is one row
        prob = g.get("probability")
        label = (str(g["causes"][0].get("label", "")) if len(g["causes"]) == 1
                 else str(g["label"]))
        rows.append((label, change_text(g, metric), _share(g.get("share")),
                     "-" if prob is None else fmt_probability(float(prob)),
                     str(g["causes"][0].get("experiment", ""))))
    rest = answer.get("unexplained")
    if rows and rest:
        rows.append(("unexplained", change_text(rest, metric), _share(rest.get("share")), "",
                     ""))
    total = answer.get("total")
    if rows and total:
        rows.append(("total change", change_text(total, metric), "100%", "", ""))
    note = ("Effects compound: they add on the log scale, and share is each cause's part of"
            " the total there; the unexplained remainder has its own interval.")
    levels = [r for r in rows if " -> " in r[1]]
    if len(levels) > 1:
        note += (" Levels in parentheses are each row's own restarts' means, measured at"
                 " different times (and host loads): compare the ratios across rows, not the"
                 " levels.")
    if any(c.get("add_alone") for c in answer.get("causes", [])):
        note += (" A system cause's effect is its share of what restoring all of them wins"
                 " back (Shapley), not its effect added alone to good (the isolate's findings).")
    return TextTable("answer", f"Causes of the change in {metric}",
                     ("cause", f"{metric} [95% CI]", "share", "P(cause)", "found by"),
                     tuple(rows), note)


def detail_lines(answer: Mapping) -> list[str]:
    """What follows the sentence and the table, one line each: mechanism, what was not
    tested, better settings (a sweep's, apart from the causes) and what to run next."""
    lines = []
    mech = (answer.get("mechanism") or {}).get("text")
    if mech:
        lines.append(f"mechanism: {mech}")
    for e in answer.get("evidence", []):  # orchestrator/evidence: kernels of each cause's sides
        lines.append(f"evidence, {e.get('cause')}: {e.get('line')}")
    for group in answer.get("not_tested", []):
        lines.append(f"not tested: {group['line']}")
    for s in answer.get("settings", []):
        lines.append(f"better setting (a sweep's, not a cause): {s.get('id')}: "
                     f"{change_text(s, str(answer.get('metric', '')))} against the baseline")
    if answer.get("hint"):
        lines.append(f"hint: {answer['hint']}")
    if answer.get("next"):  # a complete command, copied as it is (`commands/next_step.py`)
        lines.append(f"next: {answer['next']}")
    return lines
