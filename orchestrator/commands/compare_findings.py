"""What a compare found, as a findings document and as the terminal shows it.

Kept apart from the command (:mod:`orchestrator.commands.compare`) so the command's measuring
loop, its decision and its stop stay readable in one place; nothing here measures or decides.
"""

from __future__ import annotations

from orchestrator.answer.text import change_text
from orchestrator.system.fingerprint_diff import Difference

# The confidence a "not reproduced" needs (the compare's interval to exclude no change).
CHANGE_CONFIDENCE = 0.99


def findings_doc(run_id, metric, verdict, eff, effects, ranked, ref, trial_ids) -> dict:
    """The compare's findings document: its verdict in words, the change on every metric, and
    the fingerprint differences ranked by mechanism (suspects, never causes: no probability
    until `sleuth isolate` tests them)."""
    pct = eff.get("pct")
    assumption = (effects.get(metric) or {}).get("assumption")
    if verdict == "not_reproduced":
        message = (f"same code, same configuration, different result -> system level: {metric}"
                   f" is {change_text(eff, metric)} against the"
                   f" reference; {len(ranked)} difference(s) in the fingerprint, the most"
                   " likely mechanism first")
    elif verdict == "reproduced" and eff.get("bounded"):
        n_ref, n_now = eff["n"]
        lo, hi = eff["ci"]
        small = ("no change detected" if lo <= 0 <= hi else
                 f"a small change may remain (not confirmed at {CHANGE_CONFIDENCE:.0%})")
        message = (f"the reference reproduces as far as {n_ref} + {n_now} restarts can tell: "
                   f"{metric} {pct:+.1f}% [{lo:+.1f}, {hi:+.1f}], {small}; a change beyond"
                   f" {lo:+.1f}% or {hi:+.1f}% is ruled out (more reference restarts would"
                   " narrow it)")
    elif verdict == "reproduced":
        message = f"the reference reproduces: {metric} {pct:+.1f}% [{eff['ci'][0]:+.1f}, {eff['ci'][1]:+.1f}]"
    else:
        message = "could not decide within the trial budget whether the reference reproduces"
        if eff:
            message += (f": {metric} {pct:+.1f}% [{eff['ci'][0]:+.1f}, {eff['ci'][1]:+.1f}]"
                        f" over {eff['n'][0]} + {eff['n'][1]} restarts (more reference restarts,"
                        " or max_trials=N, would narrow it)")
    if assumption:
        message += f" ({assumption})"
    items = []
    if ranked:
        for i, (d, why) in enumerate(ranked, 1):
            items.append({
                "rank": i, "kind": "system" if d.category not in ("env", "clock", "package") else d.category,
                "id": d.key, "summary": f"{d.label} ({d.category}{', ' + d.detail if d.detail else ''})"
                + ("; controllable" if d.controllable else ""),
                # A fingerprint difference is a suspect, not a measured cause: no probability
                # until `sleuth isolate` has tested it.
                "probability": None, "effect": {}, "difference": d.to_json(), "why": why,
            })
    return {"run": run_id, "experiment": "compare", "metric": metric, "verdict": verdict,
            "message": message, "reference": {"name": ref["name"], "trials": ref.get("trials", []),
                          "run": ref.get("run", True)},
            "total_effect": {m: {k: e[k] for k in ("pct", "ci", "n", "evidence", "caveat",
                                                   "assumption", "log", "before", "after")
                                 if k in e}
                             for m, e in effects.items()},
            "n_trials": len(trial_ids), "findings": items}


def print_findings(out, doc: dict, ranked: list[tuple[Difference, str]]) -> None:
    """The change against the reference and what changed since, as tables."""
    from rich.table import Table

    t = Table(title="now vs reference (same candidate, same configuration)")
    for col in ("metric", "change", "interval", "restarts", "note"):
        t.add_column(col)
    for m, e in doc["total_effect"].items():
        n = e.get("n") or ["?", "?"]
        note = f"not evidence: {e['caveat']}" if not e.get("evidence", True) else ""
        t.add_row(m, f"{e['pct']:+.1f}%", f"[{e['ci'][0]:+.1f}, {e['ci'][1]:+.1f}]",
                  f"{n[0]} then, {n[1]} now", note)
    out.print(t)
    out.print(doc["message"])
    if ranked:
        d = Table(title="what changed since the reference (most likely mechanism first)")
        for col in ("#", "category", "difference", "where", "controllable"):
            d.add_column(col)
        for i, (x, _) in enumerate(ranked, 1):
            d.add_row(str(i), x.category, x.label, x.detail, "yes" if x.controllable else "no")
        out.print(d)
        out.print(f"why #1: {ranked[0][1]}")
