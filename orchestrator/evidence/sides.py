"""The two sides of a named cause, as candidates to profile (pure: no git, no processes).

Each cause is profiled as alone as the run allows, so its kernels are its own and not another
cause's riding along (a power cap measured on top of a slower attention commit slows that
commit's extra attention work too, and attention would then look like the power cap's kernel):

- a commit: the bad candidate at the commit's parent and at the commit, as the bisect measured
  it (everything else as it is now);
- a system or isolate cause (settings, patches, packages): the good candidate with the cause's
  differences at their good level, and at their bad level (for a system difference "bad" is the
  node as it is now: nothing overridden). On both sides every *other* difference the isolate
  tested is held at its good level (`restored`): a variable set on the node since the
  reference is inherited by every server that does not override it, so without this the other
  cause rode along on both sides (two overlapping variables each profiled with the other still
  set: both lines said "no kernel family moved");
- causes that overlap or hurt only together (the answer's attribution relates them): one pair
  of sides for both, everything restored vs. both at their bad level (`restore both` vs. now),
  the sides whose difference is the mechanism; either one alone shows all of it (overlap) or
  nothing (synergy), and says less.

Causes whose sides cannot be rebuilt (differences not recorded, or that change nothing) are
skipped with a reason, never guessed.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Mapping, Sequence

from orchestrator.records import Candidate
from orchestrator.system.differences import KINDS, candidate_of, normalize


def _finding(cause: Mapping, docs: Sequence[Mapping | None]) -> Mapping | None:
    for doc in docs:
        for f in (doc or {}).get("findings", []):
            if f.get("id") == cause.get("id") and f.get("kind") == cause.get("kind"):
                return f
    return None


def sides(cause: Mapping, bad: Candidate, good: Candidate, docs: Sequence[Mapping | None],
          resolve: Callable[[str], str], restored: Sequence[Mapping] = ()
          ) -> tuple[Candidate, Candidate] | str:
    """(before, after) of `cause`, or why it has no two sides.

    `docs`: the findings documents the cause may come from (isolate, bisect); `resolve` turns a
    ref into a SHA (a commit's parent is `resolve(sha + "^")`); `restored`: differences held at
    their good level on both sides of a system cause (`restored_differences`)."""
    if cause.get("kind") == "commit":
        sha = str(cause.get("sha") or cause.get("id") or "")
        try:
            parent = resolve(sha + "^")
        except Exception as exc:  # noqa: BLE001 - a root commit or a vanished ref
            return f"no parent of {sha[:12]}: {exc}"
        return dataclasses.replace(bad, commit=parent), dataclasses.replace(bad, commit=sha)
    return system_sides([cause], good, docs, resolve, restored)


def system_sides(causes: Sequence[Mapping], good: Candidate, docs: Sequence[Mapping | None],
                 resolve: Callable[[str], str], restored: Sequence[Mapping] = ()
                 ) -> tuple[Candidate, Candidate] | str:
    """The good candidate with `restored` and the causes' differences at their good level
    (before), and with the causes' differences at their bad level (after)."""
    diffs: list[Mapping] = []
    for cause in causes:
        found = (_finding(cause, docs) or {}).get("differences") or []
        if not found:
            return "its differences are not recorded in the findings"
        diffs += found
    for d in diffs:
        if d.get("factor") not in KINDS or d.get("factor") == "commit":
            return f"a {d.get('factor')} difference cannot be set per trial"
    held = [d for d in restored if d.get("factor") in KINDS and d.get("factor") != "commit"]
    out = []
    for side in ("good", "bad"):
        spec = copy.deepcopy(normalize({**good.to_json(), "clock": good.clock}))
        for d in held:
            KINDS[d["factor"]].set(spec, _key(d), d.get("good"))
        for d in diffs:
            KINDS[d["factor"]].set(spec, _key(d), d.get(side))
        out.append(candidate_of(spec, resolve))
    if out[0].key == out[1].key:
        return "its two levels launch the same candidate"
    return out[0], out[1]


def _key(d: Mapping) -> str:
    return str(d.get("level_key") or d.get("key"))


def restored_differences(causes: Sequence[Mapping], docs: Sequence[Mapping | None]
                         ) -> list[dict]:
    """What every system cause's sides hold at the good level: the differences the isolate
    tested (its good configuration), else those of every named system cause."""
    for doc in docs:
        if doc and doc.get("experiment") == "isolate" and doc.get("differences"):
            return [dict(d) for d in doc["differences"]]
    out: list[dict] = []
    for cause in causes:
        if cause.get("kind") != "commit":
            out += [dict(d) for d in (_finding(cause, docs) or {}).get("differences") or []]
    return out
