"""One system per comparison: what an answer says when a node changed during the run.

Every comparison of an answer (the total, each cause, the remainder) assumes both sides ran on
one system. A clock lock set by another process halfway through an isolate broke that: the
isolate's total mixed trials before and after the lock and read "+1.0%" next to a "+16.0%"
cause, the answer exited 0, and only a scrolled-by warning said why. Now the strategies take
their decisions again on the new system's trials (the isolate re-measures its configurations,
the bisect re-verifies its culprits), the answer's own numbers come from the latest epoch where
they were measured there, and the answer says which parts were measured again and which are not
comparable. Its status is ``system_changed`` and it does not count as explaining the change:
the run finished, but what it compares is not one system, so every command exits 5
(`orchestrator/errors.py`; 1 is for a run that failed) and tells the user to run it again on
a node that holds still. Pure functions, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from orchestrator.answer.headline import refresh

STATUS = "system_changed"


def mark_system_change(answer: dict, changes: Sequence[Mapping], *,
                       remeasured: Sequence[str] = (), not_comparable: Sequence[str] = ()
                       ) -> dict:
    """Mark `answer` (in place, and return it) with the node changes seen during the run
    (``SystemChange.to_json`` records) and the steps measured again on the new state or
    stated as not comparable."""
    if not changes:
        return answer
    last = changes[-1]
    where = (f"{last.get('node')}, between trials {last.get('before_trial')} and"
             f" {last.get('after_trial')}")
    parts = []
    if remeasured:
        parts.append("measured again on the new state: " + ", ".join(remeasured))
    if not_comparable:
        parts.append("measured before it, not comparable: " + ", ".join(not_comparable))
    head = (f"the node's system changed during the run ({last.get('summary')}; {where})"
            + (f": {'; '.join(parts)}" if parts else ""))
    answer["system_changed"] = {"summary": last.get("summary"), "changes": list(changes),
                                "remeasured": list(remeasured),
                                "not_comparable": list(not_comparable), "line": head}
    answer["status"] = STATUS
    answer["explains"] = False
    answer["sentence"] = f"{head}. {answer.get('sentence', '')}".strip()
    answer["next"] = ("run it again on a node that holds still (nothing else setting clocks,"
                      " power or packages)" + (f"; {answer['next']}" if answer.get("next")
                                               else ""))
    return refresh(answer)
