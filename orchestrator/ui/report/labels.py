"""Short candidate labels a person reads: a commit as SHA + subject, settings as they are said.

`Candidate.label` is exact and long (`557fc874c9 NCCL_ALGO=Tree NCCL_PROTO=<unset>
clock=power:600`); a plot axis or a legend needs `557fc87 Use a shared workspace buffer...` and
`power limit 600 W`. Subjects come from what the run stored (its bisect plan, its commit
findings); the report never asks git.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping

from orchestrator.gpu.base import parse_parts
from orchestrator.records import UNSET, Candidate
from orchestrator.util.safe_text import printable

_CLOCK = {"power": ("power limit", " W"), "locked": ("SM clock lock", " MHz"),
          "mem_locked": ("memory clock lock", " MHz"), "app": ("SM app clock", " MHz"),
          "persistence": ("persistence", ""), "reset": ("clock reset", "")}
SHA = 7
WIDTH = 34


def subjects(data) -> dict[str, str]:
    """Commit SHA -> subject, from the run's bisect plan and its commit findings."""
    out: dict[str, str] = {}
    if data.plan:
        out.update({c.sha: c.subject for c in data.plan.commits})
    for f in data.ranked.get("findings", []):
        if f.get("kind") == "commit" and f.get("subject"):
            out.setdefault(str(f.get("id")), str(f["subject"]))
    return out


def clock_text(policy: str) -> list[str]:
    if policy in ("", "default"):
        return []
    out = []
    for part, value in parse_parts(policy).items():
        name, unit = _CLOCK.get(part, (part, ""))
        shown = ("unlocked" if value == "off" else f"{value}{unit}" if str(value).isdigit()
                 else str(value))
        out.append(f"{name} {shown}")
    return out


def _clip(value: str, limit: int = 12) -> str:
    value = printable(value, newlines=False)
    return value if len(value) <= limit else value[: limit - 3] + "..."


def settings(cand: Candidate, limit: int = 4) -> list[str]:
    """The candidate's non-commit factor levels, as people say them, at most `limit` (then
    "+N more")."""
    parts = [f"+{len(cand.patches)} patch{'es' if len(cand.patches) > 1 else ''}"] \
        if cand.patches else []
    parts += [f"{k} unset" if v == UNSET else f"{k}={_clip(v)}" for k, v in cand.env]
    parts += clock_text(cand.clock)
    parts += [f"{k}={v}" for k, v in cand.server]
    if len(parts) > limit + 1:
        parts = parts[:limit] + [f"+{len(parts) - limit} more"]
    return parts


def _wrap(text: str, width: int, lines: int) -> list[str]:
    wrapped = textwrap.wrap(text, width) or [text]
    if len(wrapped) > lines:
        wrapped = wrapped[:lines]
        wrapped[-1] = wrapped[-1][: width - 3].rstrip() + "..."
    return wrapped


def short(cand: Candidate, subject_of: Mapping[str, str] | None = None, *, prefix: str = "",
          width: int = WIDTH, lines: int = 3) -> str:
    """`#3 557fc87 Use a shared workspace\\nbuffer for the flashinfer...`: wrapped to `width`,
    at most `lines` lines. A candidate with settings keeps its commit to one line and gives
    each setting a line of its own below it: the settings are what tell the candidates of one
    commit apart (an isolate's), so they are never the part cut off."""
    subject = (subject_of or {}).get(cand.commit, "")
    head = " ".join(p for p in (prefix, cand.commit[:SHA], printable(subject, newlines=False))
                    if p)
    parts = settings(cand)
    if not parts or lines == 1:
        return "\n".join(_wrap(" · ".join([head, *parts]), width, lines))
    return "\n".join(_wrap(head, width, 1) + parts)


def one_line(cand: Candidate, subject_of: Mapping[str, str] | None = None,
             width: int = 60) -> str:
    return short(cand, subject_of, width=width, lines=1)
