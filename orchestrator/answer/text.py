"""How an answer's numbers read: relative changes, large ratios, cause labels.

A relative change reads best as a percentage while it is moderate (+53%), and as a ratio once
it is large: a benchmark that went from 0.67 ms to 218 ms is "x325 (0.67 ms -> 218 ms)", not
"+32329.6%", a number nobody can picture. Percentages and intervals here are the ones the
statistics computed; this module only lays them out.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence

from orchestrator.metrics import METRICS
from orchestrator.util.safe_text import printable

# A change this large (or a halving) reads as a ratio.
RATIO_FROM = 2.0
SUBJECT_CHARS = 60


def number(value: float | None) -> str:
    """Three significant digits, never in exponent form (0.67, 19.0, 218, 4312)."""
    if value is None or not math.isfinite(value):
        return "?"
    if abs(value) >= 1000:
        return f"{value:.0f}"
    text = f"{value:.3g}"
    return text if "e" not in text else f"{value:.4f}".rstrip("0").rstrip(".")


def unit_of(metric: str) -> str:
    info = METRICS.get(metric)
    return info.unit if info and info.unit not in ("", "share") else ""


def _ratio(pct: float) -> float:
    return 1.0 + pct / 100.0


def large(pct: float | None) -> bool:
    if pct is None or not math.isfinite(pct):
        return False
    r = _ratio(pct)
    return r >= RATIO_FROM or 0 < r <= 1.0 / RATIO_FROM


def _ratio_text(ratio: float) -> str:
    if ratio >= 10:
        return f"x{ratio:.0f}"
    return f"x{ratio:.3g}" if ratio >= 0.01 else f"x{ratio:.2g}"


def pct_text(pct: float | None, *, sign: bool = True) -> str:
    if pct is None or not math.isfinite(pct):
        return "?"
    if large(pct):
        return _ratio_text(_ratio(pct))
    return f"{pct:+.1f}%" if sign else f"{pct:.1f}%"


def interval_text(ci, pct: float | None = None) -> str:
    """`[+47.1, +59.2]`, or `[x250, x360]` when the change itself (`pct`, else both ends)
    reads as a ratio: an interval is in the estimate's units. Empty when there is none."""
    if not ci or len(ci) != 2 or not all(isinstance(v, int | float) for v in ci):
        return ""
    lo, hi = ci
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "[unbounded]"
    as_ratio = large(pct) if pct is not None else (large(lo) and large(hi))
    if as_ratio and lo > -100:
        return f"[{_ratio_text(_ratio(lo))}, {_ratio_text(_ratio(hi))}]"
    return f"[{lo:+.1f}, {hi:+.1f}]"


def change_text(effect: Mapping | None, metric: str = "", *, interval: bool = True) -> str:
    """`+53.0% [+47.1, +59.2]`, or `x325 [x301, x351] (0.67 ms -> 218 ms)` for a large one."""
    if not effect or not isinstance(effect.get("pct"), int | float):
        return "-"
    pct = float(effect["pct"])
    text = pct_text(pct)
    if interval:
        ci = interval_text(effect.get("ci"), pct)
        text += f" {ci}" if ci else ""
    before, after = effect.get("before"), effect.get("after")
    if large(pct) and isinstance(before, int | float) and isinstance(after, int | float):
        unit = unit_of(metric)
        unit = f" {unit}" if unit else ""
        text += f" ({number(before)}{unit} -> {number(after)}{unit})"
    return text


def subject(text: object, limit: int = SUBJECT_CHARS) -> str:
    s = " ".join(printable(text, newlines=False).split())
    return s if len(s) <= limit else s[: limit - 3].rstrip() + "..."


def commit_label(sha: str, subj: object = None) -> str:
    """`commit b2d8735e1f0a "Refactor verify input preparation"`."""
    return f"commit {sha[:12]}" + (f' "{subject(subj)}"' if subj else "")


_POINT_RANGE = re.compile(r"\bpoints (\d+)(\.\.| and )(\d+)\b")
_POINT = re.compile(r"\bpoint (\d+)\b")


def name_points(message: str, shas: Sequence[str],
                subjects: Sequence[str] | None = None) -> str:
    """A bisect strategy speaks of positions in its range ("point 35"), being pure; a user
    reads commits: each position becomes `commit <12 hex>` (one outside the range is kept).
    With `subjects`, a single commit's first mention also gets its subject, so the verdict
    says which change it is (`commit b2d8735bb927 "Refactor verify input..."`)."""
    named: set[int] = set()

    def commit(index: str) -> str | None:
        i = int(index)
        return shas[i][:12] if 0 <= i < len(shas) else None

    def pair(m: re.Match) -> str:
        lo, hi = commit(m[1]), commit(m[3])
        return f"commits {lo}{m[2]}{hi}" if lo and hi else m[0]

    def one(m: re.Match) -> str:
        sha, i = commit(m[1]), int(m[1])
        if not sha:
            return m[0]
        subject = printable(subjects[i], newlines=False) if subjects and i < len(subjects) \
            else ""
        if not subject or i in named:
            return f"commit {sha}"
        named.add(i)
        return f'commit {sha} "{subject if len(subject) <= 60 else subject[:57] + "..."}"'

    return _POINT.sub(one, _POINT_RANGE.sub(pair, message))


def change_label(label: str) -> str:
    """A difference's label as a cause reads: `power limit 600 W -> 450 W`."""
    return label.replace(": ", " ", 1)
