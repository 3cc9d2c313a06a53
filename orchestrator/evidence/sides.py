"""The two sides of a named cause, as candidates to profile (pure: no git, no processes).

Each cause is profiled as alone as the run allows, so its kernels are its own and not another
cause's riding along (a power cap measured on top of a slower attention commit slows that
commit's extra attention work too, and attention would then look like the power cap's kernel):

- a commit: the bad candidate at the commit's parent and at the commit, as the bisect measured
  it (everything else as it is now);
- a system or isolate cause (settings, patches, packages): the good candidate with the cause's
  differences at their good level, and at their bad level (for a system difference "bad" is the
  node as it is now: nothing overridden).

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
          resolve: Callable[[str], str]) -> tuple[Candidate, Candidate] | str:
    """(before, after) of `cause`, or why it has no two sides.

    `docs`: the findings documents the cause may come from (isolate, bisect); `resolve` turns a
    ref into a SHA (a commit's parent is `resolve(sha + "^")`)."""
    if cause.get("kind") == "commit":
        sha = str(cause.get("sha") or cause.get("id") or "")
        try:
            parent = resolve(sha + "^")
        except Exception as exc:  # noqa: BLE001 - a root commit or a vanished ref
            return f"no parent of {sha[:12]}: {exc}"
        return dataclasses.replace(bad, commit=parent), dataclasses.replace(bad, commit=sha)
    finding = _finding(cause, docs)
    diffs = (finding or {}).get("differences") or []
    if not diffs:
        return "its differences are not recorded in the findings"
    out = []
    for side in ("good", "bad"):
        spec = copy.deepcopy(normalize({**good.to_json(), "clock": good.clock}))
        for d in diffs:
            factor = d.get("factor")
            if factor not in KINDS or factor == "commit":
                return f"a {factor} difference cannot be set per trial"
            KINDS[factor].set(spec, str(d.get("level_key") or d.get("key")), d.get(side))
        out.append(candidate_of(spec, resolve))
    if out[0].key == out[1].key:
        return "its two levels launch the same candidate"
    return out[0], out[1]
