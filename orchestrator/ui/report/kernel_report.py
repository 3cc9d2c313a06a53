"""The kernel-evidence figure and tables: per named cause, how much each (mode, kernel family)
row moved between the cause's two sides, with its interval across restarts (orchestrator/evidence)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.evidence.families import FAMILY_LABELS
from orchestrator.ui.report.figure import new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MOVED_COLOR, STILL_COLOR = "#c62828", "#9e9e9e"
ROWS_SHOWN = 8


def kernel_figure(entries: Sequence[Mapping]) -> Figure | None:
    """One panel per cause with a diff; None when no cause was profiled."""
    shown = [e for e in entries if e.get("families")]
    if not shown:
        return None
    fig = new_figure(layout="constrained", figsize=(11, 0.6 + 2.4 * len(shown)))
    axes = fig.subplots(len(shown), 1, squeeze=False)[:, 0]
    for ax, e in zip(axes, shown, strict=True):
        rows = list(e["families"])[:ROWS_SHOWN][::-1]  # movers first, drawn top down
        y = np.arange(len(rows))
        pct = np.array([r["pct"] for r in rows])
        # no interval (one trace a side): the bar alone, no whisker
        lo = np.array([r["ci"][0] if r.get("ci") else r["pct"] for r in rows])
        hi = np.array([r["ci"][1] if r.get("ci") else r["pct"] for r in rows])
        colors = [MOVED_COLOR if r.get("mover") else STILL_COLOR for r in rows]
        ax.barh(y, pct, color=colors, alpha=0.85,
                xerr=np.vstack([np.clip(pct - lo, 0, None), np.clip(hi - pct, 0, None)]),
                capsize=3)
        ax.axvline(0, color="black", linewidth=0.8)
        ax.set_yticks(y, [f"{r['mode']}: {FAMILY_LABELS.get(r['family'], r['family'])} "
                          f"({r['before_ms']:.2f} -> {r['after_ms']:.2f} ms)" for r in rows])
        ax.set_xlabel("change in device time per pass, % (interval across restarts)")
        ax.set_title(str(e.get("cause", "")), loc="left")
        ax.grid(axis="x", alpha=0.3)
    return fig


def kernel_tables(entries: Sequence[Mapping]) -> list:
    """One table per profiled cause (family rows, then the kernels inside the moved ones), for
    the HTML report; the markdown report prints the same rows from the entry's `table`."""
    from orchestrator.evidence.kernels import short_name
    from orchestrator.ui.report.tables import TextTable

    out = []
    for i, e in enumerate(entries):
        if not e.get("families"):
            continue
        rows = [(r["mode"], FAMILY_LABELS.get(r["family"], r["family"]), "(all)",
                 f"{r['before_ms']:.3f}", f"{r['after_ms']:.3f}", f"{r['pct']:+.1f}%",
                 f"[{r['ci'][0]:+.0f}%, {r['ci'][1]:+.0f}%]" if r.get("ci") else "none",
                 ("yes" if r.get("mover") else "no") if r.get("ci") else "not judged")
                for r in e["families"]]
        rows += [(k["mode"], FAMILY_LABELS.get(k["family"], k["family"]),
                  short_name(k["kernel"]), f"{k['before_ms']:.3f}", f"{k['after_ms']:.3f}",
                  f"{k['pct']:+.1f}%" if k["before_ms"] > 0 and k.get("pct") is not None
                  else "new", "", "")
                 for k in e.get("kernels", [])]
        out.append(TextTable(f"kernels-{i}", f"Kernels: {e.get('cause', '')}",
                             ("mode", "family", "kernel", "before ms/pass", "after ms/pass",
                              "change", "interval", "moved"),
                             tuple(tuple(r) for r in rows), str(e.get("line", ""))))
    return out
