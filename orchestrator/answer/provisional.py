"""The answer of a run that stopped before its end, as far as it is known.

A run interrupted after 73 restarts, or stopped at its budget or cap, has usually learnt
something: a culprit verified at P > 0.999, where the search points next, how large a further
step can still be. Saying only "interrupted" threw that away, and `sleuth report` on such a run
showed no answer at all. :func:`so_far` turns the answer built from the trials so far into
that sentence; the numbers stay the answer's own (:mod:`orchestrator.answer.compose`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from orchestrator.answer import text as T
from orchestrator.answer.combine import LogChange, decide
from orchestrator.answer.compose import clause
from orchestrator.answer.headline import refresh, short_label

_SUBJECT = re.compile(r' "[^"]*"')  # a commit's subject: the table and the labelled lines have it


def _relation(p: float) -> str:
    return "> 0.999" if p > 0.999 else f"= {p:.3f}"


def so_far(answer: Mapping, *, why: str, searching: bool = True,
           confidence: float = 0.99, leading: str = "", keep_sentence: bool = False) -> dict:
    """The answer of a run that stopped before its end (interrupted, at its cap or its
    budget), as far as it is known: "so far (interrupted after 73 restarts): commit X +y%
    [..] at P > 0.999; searching for a further step of up to +z%".

    Causes named at the run's `confidence` are stated with their intervals; the rest are a best
    guess with their probability, never a cause. `searching`: the run was still looking for
    more, and the remainder's interval says how large a further step can be. The answer keeps
    its numbers; `provisional` says why it is not final, and it never counts as explained.
    `leading`: where the search points now ("commit X (P = 0.62)"), said as that.
    `keep_sentence`: the answer's own sentence is what is known (a compare's undecided
    interval, a sweep's leading setting: they name no causes)."""
    doc = dict(answer)
    metric = str(doc.get("metric", ""))
    causes = list(doc.get("causes") or [])
    named = [c for c in causes if (c.get("probability") or 0.0) >= confidence
             and c.get("verified", True)]
    guesses = [c for c in causes if c not in named and c.get("probability") is not None]
    lead = f"so far ({why})"
    parts = [f"{clause(c['label'], c)} at P {_relation(float(c['probability']))}"
             for c in named]
    total_ = doc.get("total")
    if parts:
        text = f"{lead}: " + "; ".join(parts)
    elif keep_sentence:
        text = f"{lead}: {doc.get('sentence') or 'nothing measured yet'}"
    elif total_:
        text = f"{lead}: no cause named yet; {metric} {T.change_text(total_, metric)}"
    else:
        text = f"{lead}: nothing measured yet"
    if guesses:
        text += "; best guess" + ("es" if len(guesses) > 1 else "") + ": " + ", ".join(
            f"{c['label']} (P {_relation(float(c['probability']))})" for c in guesses)
    if leading:
        after = any(c.get("kind") == "commit" for c in named)
        text += f"; most likely {'next ' if after else ''}culprit: {leading}"
    rest = _left_over(doc, named) if searching else None
    further = ""
    if rest is not None:
        ci = rest.get("ci") or []
        ends = [v for v in ci if isinstance(v, int | float)]
        if ends:
            edge = max(ends, key=abs)
            further = (f"searching for {'a further step' if named else 'a step'} of up to"
                       f" {T.pct_text(edge)}")
            text += f"; {further}"
    doc["sentence"] = text
    doc["provisional"] = {"why": why, "searching": searching, "confidence": confidence,
                          "status": doc.get("status"), "leading": leading,
                          "headline": _headline(doc, why, named, guesses, leading,
                                                keep_sentence, further)}
    doc["status"] = "provisional"
    doc["explains"] = False
    return refresh(doc)


def _headline(doc: Mapping, why: str, named: Sequence[Mapping], guesses: Sequence[Mapping],
              leading: str, keep_sentence: bool, further: str) -> str:
    """The first line of an answer so far: what is named (short labels, no intervals: the
    table has them), the best guess or where the search points, what it still looks for."""
    lead = f"so far ({why})"
    if keep_sentence and not named:
        first = doc.get("headline") or doc.get("sentence") or "nothing measured yet"
        return f"{lead}: {first}"
    parts = [f"{short_label(c)} {T.pct_text(c.get('pct'))} (P {_relation(float(c['probability']))})"
             for c in named]
    text = f"{lead}: " + ("; ".join(parts) if parts else "no cause named yet")
    if guesses:
        text += "; best guess: " + ", ".join(
            f"{short_label(c)} (P {_relation(float(c['probability']))})" for c in guesses[:2])
    if leading:
        text += "; leading: " + _SUBJECT.sub("", leading)
    if further:
        text += f"; {further}"
    return text


def _left_over(doc: Mapping, named: Sequence[Mapping]) -> Mapping | None:
    """What the named causes leave of the total (the remainder of the named ones only)."""
    whole = LogChange.from_effect(doc.get("total"))
    if whole is None:
        return None
    rest = decide(whole, [LogChange(*c["log"]) for c in named]).rest
    return rest.to_json()
