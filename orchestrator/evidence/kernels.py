"""Which kernels moved between the two sides of a named cause, with intervals across restarts.

Pure: takes per-restart `PassProfile`s (orchestrator/evidence/trace.py) of each side and returns
the rows of the diff and the one evidence line. The statistics follow the rest of sleuth: the
restart is the unit (one trace per restart; passes inside it share its clocks and NCCL rings),
changes are ratios on the log scale (`stats/effect.py`), and the decision is made on kernel
*families*, not single kernel names:

- Families (attention / GEMM / all-reduce / other) are what a cause moves: a slower attention
  backend, a clock or power cap that slows compute-bound GEMMs, an NCCL setting. Single names
  change across commits and settings (an NCCL protocol renames its kernel), so a per-name diff
  shows one kernel vanishing and another appearing where the family sum shows what happened.
- A mover is a (mode, family) row whose interval excludes zero at a Bonferroni-corrected level
  (every row of the table is a test; at 95% each, a harmless change with 12 rows would show a
  "mover" in almost half of the stories) *and* whose change is at least `min_pct`, so a real but
  negligible shift is not the headline.
- Each row's interval uses its own restart-to-restart variance, pooled with no other row:
  restart noise is not the same for every family (NCCL ring setup varies more between restarts
  than GEMM time), and within a family it is shared by every mode of a restart (one slow ring
  slows the all-reduces of verify, draft and prefill alike), so pooling across modes would
  count one restart's noise three times as independent evidence. It did: a harmless change
  showed a "-8% all-reduce mover" in 1 of 20 seeded stories until rows stopped pooling.
- Outlier restarts (`outlier_restarts`: 1.5x slower than their side's fastest) are left out
  and counted; three restarts cannot absorb a 3x restart, which otherwise hides every cause.

The top mover is the mover that adds the most device time to an average pass of the run (its
change per pass weighted by how often its mode runs), so a +30% on a 0.1 ms draft kernel does not
outrank +5 ms of verify attention.

The levels a row shows are the geometric means of its restarts (the change is computed on the
log scale, so "before -> after" and the percentage are the same two numbers; arithmetic means
beside a log-scale change read "10.29 -> 10.33, -59%" for one slow restart). Device time
launched outside any step span is a mode of its own (`other`, per step of any mode), tested
like every other row, and its share of the device time is stated. Profiles without any device
time are left out and counted; when a side has none at all the diff says the traces hold no
device time (never "no kernel family moved"). With one trace on a side there is no restart
noise to judge a change against: the rows are shown as measured, nothing is called a mover, and
the line says so.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.evidence.families import FAMILIES, FAMILY_LABELS, collective, family
from orchestrator.evidence.trace import OTHER_MODE, TORCH_STEP, WHOLE_MODE, PassProfile
from orchestrator.stats.effect import log_difference

OUTLIER_RATIO = 1.5
MODE_ORDER = ("target_verify", "draft", "decode", "extend", TORCH_STEP, WHOLE_MODE, OTHER_MODE)


def short_name(kernel: str, width: int = 40) -> str:
    """A kernel name as a table shows it: template arguments and parameters cut."""
    name = re.sub(r"^void\s+", "", kernel)
    name = re.split(r"[<(]", name, maxsplit=1)[0].strip() or kernel
    name = name.rsplit("::", 1)[-1]
    return name if len(name) <= width else name[: width - 1] + "…"


@dataclass(frozen=True)
class Row:
    """One (mode, family) or (mode, kernel) line of the diff, in ms per pass."""

    mode: str
    family: str
    kernel: str | None  # None for a family row
    before_ms: float
    after_ms: float
    pct: float
    ci: tuple[float, float]  # percent, at `level`
    level: float
    weight: float  # share of the run's passes that are this mode
    mover: bool = False

    @property
    def delta_ms(self) -> float:
        return self.after_ms - self.before_ms


NO_DEVICE_WHY = ("no kernel, memcpy or memset event: the profiler recorded host activity only"
                 " (a profile without the GPU activity, e.g. activities=[CPU], or a container"
                 " without profiling permission for CUPTI)")


@dataclass(frozen=True)
class KernelDiff:
    rows: list[Row]  # family rows, movers first by contribution
    kernels: list[Row]  # per-kernel rows of the movers' families (no intervals decided on them)
    n_before: int
    n_after: int
    confidence: float
    outliers: int = 0  # restarts left out as outliers (see `outlier_restarts`)
    no_device: str = ""  # why there is nothing to compare: the traces hold no device time
    empty: int = 0  # profiles left out because they hold no device time
    outside: tuple[float, float] = (0.0, 0.0)  # share of device time outside any step, per side

    @property
    def movers(self) -> list[Row]:
        return [r for r in self.rows if r.mover]

    @property
    def top(self) -> Row | None:
        movers = self.movers
        return movers[0] if movers else None

    @property
    def intervals(self) -> bool:
        """Whether the rows have intervals: two restarts a side or more."""
        return min(self.n_before, self.n_after) >= 2


def _family_ms(profile: PassProfile, mode: str) -> dict[str, float]:
    out = dict.fromkeys(FAMILIES, 0.0)
    for (fam, _), ms in profile.per_pass_families(mode, family).items():
        out[fam] += ms
    return out


def _mode_weights(profiles: Sequence[PassProfile]) -> dict[str, float]:
    """Each mode's share of the run's passes; `other` (device time per step of any mode) is
    part of every pass, weight 1."""
    counts: dict[str, float] = {}
    for p in profiles:
        for m, n in p.passes.items():
            counts[m] = counts.get(m, 0.0) + n
    total = sum(counts.values()) or 1.0
    return {**{m: n / total for m, n in counts.items()}, OTHER_MODE: 1.0}


def outlier_restarts(profiles: Sequence[PassProfile]) -> list[int]:
    """Indexes of restarts whose device time per pass is `OUTLIER_RATIO` or more above the
    fastest restart of their side. A side's restarts are one candidate, so a gap that size
    within a side is the restart, never the cause; and only slow restarts are outliers, because
    what goes wrong at a start (a slow NCCL ring, a JIT compile on the critical path, a
    throttled GPU, a neighbour) only ever slows it down. That also decides the case a median
    cannot: two slow restarts out of three agree with each other, but the fast one is right."""
    if len(profiles) < 2:
        return []
    modes = [m for m in MODE_ORDER if m != OTHER_MODE
             and all(p.passes.get(m, 0) > 0 for p in profiles)]  # fmt: skip
    totals = [sum(p.pass_ms(m) for m in modes) for p in profiles]
    if not modes or min(totals) <= 0:
        return []
    fastest = min(totals)
    return [i for i, t in enumerate(totals) if t >= OUTLIER_RATIO * fastest]


def _without_outliers(profiles: Sequence[PassProfile]) -> tuple[list[PassProfile], int]:
    drop = set(outlier_restarts(profiles))
    kept = [p for i, p in enumerate(profiles) if i not in drop]
    if len(kept) < 2:  # one good restart is no interval: keep all, and the intervals are wide
        return list(profiles), 0
    return kept, len(drop)


def _geomean(values: Sequence[float], floor_ms: float) -> float:
    return math.exp(sum(math.log(max(v, floor_ms)) for v in values) / len(values))


def _no_device(before: Sequence[PassProfile], after: Sequence[PassProfile]) -> str:
    sides = [name for name, ps in (("before", before), ("after", after)) if not ps]
    if len(sides) == 2:
        return NO_DEVICE_WHY
    return (f"the {sides[0]} side's traces hold none ({NO_DEVICE_WHY}) while the other side's"
            " do: the two sides were not profiled alike")


def _share(profiles: Sequence[PassProfile]) -> float:
    return sum(p.outside_share() for p in profiles) / len(profiles) if profiles else 0.0


def diff(
    before: Sequence[PassProfile],
    after: Sequence[PassProfile],
    confidence: float = 0.95,
    min_pct: float = 3.0,
    floor_ms: float = 1e-3,
) -> KernelDiff:
    """Family rows per forward mode with log-scale intervals across restarts, movers marked.

    `before`/`after`: one profile per restart of each side (two or more each for intervals;
    with one on a side the rows are descriptive, see `KernelDiff.intervals`); profiles without
    device time and outlier restarts (`outlier_restarts`) are left out and counted. Modes
    without step spans on both sides are left out: their per-pass times are not comparable.
    `other` (device time outside any step) is a row when every trace has step spans.
    `floor_ms` keeps an absent family (0 ms) finite on the log scale.
    """
    if not before or not after:
        raise ValueError("a kernel diff needs at least one profile on each side")
    with_b = [p for p in before if p.device_ms > 0]
    with_a = [p for p in after if p.device_ms > 0]
    empty = len(before) - len(with_b) + len(after) - len(with_a)
    if not with_b or not with_a:
        return KernelDiff([], [], len(before), len(after), confidence, 0,
                          _no_device(with_b, with_a), empty)
    before, dropped_b = _without_outliers(with_b)
    after, dropped_a = _without_outliers(with_a)
    both = (*before, *after)
    modes = [m for m in MODE_ORDER if m != OTHER_MODE
             and all(p.passes.get(m, 0) > 0 for p in both)]  # fmt: skip
    if all(sum(p.passes.values()) > 0 and WHOLE_MODE not in p.passes for p in both):
        modes.append(OTHER_MODE)  # device time outside the steps, per step
    logs: dict[tuple[str, str], tuple[list[float], list[float]]] = {}
    for mode in modes:
        fb = [_family_ms(p, mode) for p in before]
        fa = [_family_ms(p, mode) for p in after]
        for fam in FAMILIES:
            vb = [f[fam] for f in fb]
            va = [f[fam] for f in fa]
            if max(vb + va) < 10 * floor_ms:
                continue  # the family does not run in this mode
            logs[(mode, fam)] = ([math.log(max(v, floor_ms)) for v in vb],
                                 [math.log(max(v, floor_ms)) for v in va])
    paired = min(len(before), len(after)) >= 2
    tests = max(len(logs), 1)
    level = 1.0 - (1.0 - confidence) / tests
    weights = _mode_weights(both)
    rows = []
    for (mode, fam), (lb, la) in logs.items():
        mb, ma = math.exp(sum(lb) / len(lb)), math.exp(sum(la) / len(la))  # geometric means
        pct = 100.0 * (ma / mb - 1.0)
        ci, mover = (math.nan, math.nan), False
        if paired:
            iv = log_difference(lb, la, level)
            ci = (100.0 * math.expm1(iv.lo), 100.0 * math.expm1(iv.hi))
            mover = (ci[0] > 0.0 or ci[1] < 0.0) and abs(pct) >= min_pct
        rows.append(Row(mode, fam, None, mb, ma, pct, ci, level, weights.get(mode, 0.0), mover))
    rows.sort(key=lambda r: (not r.mover, -abs(r.delta_ms) * r.weight))
    shown = {(r.mode, r.family) for r in rows if r.mover} if paired else \
        {(r.mode, r.family) for r in rows[:3]}
    return KernelDiff(rows, _kernel_rows(before, after, shown, weights, floor_ms), len(before),
                      len(after), confidence, dropped_b + dropped_a, "", empty,
                      (_share(before), _share(after)))


def _kernel_rows(before: Sequence[PassProfile], after: Sequence[PassProfile],
                 moved: set[tuple[str, str]], weights: Mapping[str, float],
                 floor_ms: float) -> list[Row]:
    """Per-kernel levels inside the moved families (geometric means over the restarts, as the
    family rows): which names carry the change (descriptive, no interval)."""
    out = []
    for mode, fam in moved:
        pb = [p.per_pass_families(mode, family) for p in before]
        pa = [p.per_pass_families(mode, family) for p in after]
        names = {k for d in (*pb, *pa) for f, k in d if f == fam}
        for k in names:
            vb = [d.get((fam, k), 0.0) for d in pb]
            va = [d.get((fam, k), 0.0) for d in pa]
            mb = _geomean(vb, floor_ms) if max(vb) > 0 else 0.0
            ma = _geomean(va, floor_ms) if max(va) > 0 else 0.0
            pct = 100.0 * (ma / mb - 1.0) if mb > 0 else math.inf
            out.append(Row(mode, fam, k, mb, ma, pct, (math.nan, math.nan), math.nan,
                           weights.get(mode, 0.0)))
    out.sort(key=lambda r: -abs(r.delta_ms) * r.weight)
    return out


def _fmt_ci(row: Row) -> str:
    if not math.isfinite(row.ci[0]):
        return "none (one trace a side)"
    return f"[{row.ci[0]:+.0f}%, {row.ci[1]:+.0f}%]"


def _row_text(r: Row, d: KernelDiff, with_ci: bool = True) -> str:
    top = next((k for k in d.kernels if k.mode == r.mode and k.family == r.family), None)
    name = f" `{short_name(top.kernel)}`" if top and top.kernel else ""
    ci = f" {_fmt_ci(r)}" if with_ci else ""
    return (f"{r.mode}: {FAMILY_LABELS[r.family]}{name} {r.before_ms:.2f} -> "
            f"{r.after_ms:.2f} ms/pass ({r.pct:+.0f}%{ci})")


def outside_text(d: KernelDiff) -> str:
    """The share of device time launched outside any step span, when it is worth a word (5% or
    more on a side): that time is the row `other`, not spread over the steps."""
    b, a = d.outside
    if max(b, a) < 0.05:
        return ""
    return (f"device time outside any step (row `other`): {100 * b:.0f}% before,"
            f" {100 * a:.0f}% after")


def evidence_line(d: KernelDiff) -> str:
    """One line for the answer: the movers (top first, with the kernel that carries the change)
    and the families that held still, or that no kernel moved above the restart noise; or
    that the traces hold no device time; or, with one trace a side, the largest changes as
    measured and that they are not judged."""
    if d.no_device:
        return f"kernels: the traces hold no device time: {d.no_device}"
    notes = []
    if d.outliers:
        notes.append(f"{d.outliers} outlier restart{'s' if d.outliers > 1 else ''} left out")
    if d.empty:
        notes.append(f"{d.empty} profile{'s' if d.empty > 1 else ''} without device time"
                     " left out")
    if outside_text(d):
        notes.append(outside_text(d))
    tail_notes = f" ({'; '.join(notes)})" if notes else ""
    if not d.intervals:
        biggest = sorted(d.rows, key=lambda r: -abs(r.delta_ms) * r.weight)[:3]
        what = "; ".join(_row_text(r, d, with_ci=False) for r in biggest) or "no device rows"
        return (f"kernels: {d.n_before} trace(s) before, {d.n_after} after: no interval (two"
                f" traces a side are needed to know the restart noise), so nothing is called"
                f" a mover; largest changes as measured: {what}{tail_notes}")
    if not d.movers:
        return (f"kernels: no kernel family moved above the restart noise "
                f"({d.n_before} vs {d.n_after} profiled restarts{'; ' + '; '.join(notes) if notes else ''})")
    parts = [_row_text(r, d) for r in d.movers[:3]]
    moved_fams = {r.family for r in d.movers}
    still = [FAMILY_LABELS[f] for f in FAMILIES if f != "other"
             and f not in moved_fams and any(r.family == f for r in d.rows)]
    # not "unchanged": a row inside the noise may have moved less than the noise can show
    tail = f"; {', '.join(still)}: within the noise" if still else ""
    return "kernels: " + "; ".join(parts) + tail + tail_notes


HEADER = ["| mode | family | kernel | before ms/pass | after ms/pass | change | interval | moved |",
          "|---|---|---|---:|---:|---:|---|---|"]


def table(d: KernelDiff, limit: int = 12) -> list[str]:
    """Markdown table lines: family rows (movers first) then the kernels inside the movers;
    levels are the geometric means over the restarts the change is computed from."""
    if d.no_device:
        return [*HEADER, "| (all) | (none) | the traces hold no device time | 0 | 0 | | | |"]
    lines = list(HEADER)
    for r in d.rows[:limit]:
        moved = ("yes" if r.mover else "no") if d.intervals else "not judged"
        lines.append(f"| {r.mode} | {FAMILY_LABELS[r.family]} | (all) | {r.before_ms:.3f} | "
                     f"{r.after_ms:.3f} | {r.pct:+.1f}% | {_fmt_ci(r)} | {moved} |")
    for k in d.kernels[:limit]:
        pct = f"{k.pct:+.1f}%" if math.isfinite(k.pct) else "new"
        lines.append(f"| {k.mode} | {FAMILY_LABELS[k.family]} | `{short_name(k.kernel or '')}` | "
                     f"{k.before_ms:.3f} | {k.after_ms:.3f} | {pct} | | |")
    left = len(d.rows) - limit
    if left > 0:
        lines.append(f"| | | ({left} more family rows in findings.json) | | | | | |")
    return lines


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def to_json(d: KernelDiff) -> dict:
    """The diff for findings.json (numbers only; the line is built from the same rows). An
    interval that does not exist (one trace a side) is null, never NaN."""
    def row(r: Row) -> dict:
        doc = {"mode": r.mode, "family": r.family, "before_ms": r.before_ms,
               "after_ms": r.after_ms, "pct": _finite(r.pct)}
        if r.kernel is None:
            doc.update(ci=[_finite(c) for c in r.ci] if d.intervals else None,
                       level=r.level, mover=r.mover)
        else:
            doc["kernel"] = r.kernel
            if (c := collective(r.kernel)) is not None:
                doc["collective"] = c
        return doc

    top = d.top
    return {"n_before": d.n_before, "n_after": d.n_after, "confidence": d.confidence,
            "outliers": d.outliers, "intervals": d.intervals, "empty_profiles": d.empty,
            "no_device": d.no_device or None,
            "outside_share": {"before": d.outside[0], "after": d.outside[1]},
            "top": None if top is None else {"mode": top.mode, "family": top.family},
            "families": [row(r) for r in d.rows], "kernels": [row(k) for k in d.kernels],
            "line": evidence_line(d)}
