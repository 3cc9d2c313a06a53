"""Report figures, drawn with matplotlib's Agg backend into PNG bytes.

Figures are built on `matplotlib.figure.Figure` directly (no pyplot state), so drawing works
without a display, in threads and in tests; matplotlib itself is imported only when a figure
is drawn (`figure.py`). Math-text parsing is switched off: commit subjects
and environment values are shown as typed, and a `$` in one can never break a figure.
"""

from __future__ import annotations

import io
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from orchestrator.metrics import METRICS
from orchestrator.ui.report import series as S
from orchestrator.ui.report import sweep_series as SW
from orchestrator.ui.report.collect import RunData
from orchestrator.ui.report.figure import matplotlib_module, new_figure

if TYPE_CHECKING:
    from matplotlib.figure import Figure

OUTCOME_COLORS = {"ok": "#2e7d32", "running": "#9e9e9e", "interrupted": "#9e9e9e"}
FAILED_COLOR = "#c62828"
SUSPECT_COLOR = "#ef6c00"
BEFORE_COLOR, AFTER_COLOR = "#1565c0", "#c62828"
PLOT_NAMES = ("distributions", "posterior", "phases", "kernels", "sweep", "timeline")
_RC = {"text.parse_math": False, "font.size": 9, "axes.titlesize": 10}


@dataclass(frozen=True)
class Plot:
    name: str  # file stem, e.g. "distributions"
    title: str
    caption: str
    png: bytes


def _png(fig: Figure) -> bytes:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        # A commit subject in another script or with an emoji has glyphs the bundled font
        # lacks: the figure shows a box for each, and a warning per glyph says nothing more.
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .*missing from",
                                category=UserWarning)
        # The constrained layout already fits labels; "tight" bbox would draw everything twice.
        fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def _unit(metric: str) -> str:
    info = METRICS.get(metric)
    return f"{metric} ({info.unit})" if info and info.unit else metric


def distribution_metrics(data: RunData) -> list[str]:
    """The run's metric first, then up to two of the headline metrics the trials measured."""
    present = {m for r in data.rows if r.result for m in r.result.metric_names()}
    wanted = [data.metric] + [m for m in ("verify_ms", "output_throughput", "accept_len")
                              if m != data.metric]
    return [m for m in wanted if m in present][:3]


def distributions_plot(data: RunData) -> Plot | None:
    metrics = distribution_metrics(data)
    if not metrics:
        return None
    per_metric = {m: S.distributions(data, m) for m in metrics}
    labels = [s.label for s in per_metric[metrics[0]]]
    if not labels:
        return None
    lines = max(label.count("\n") + 1 for label in labels)
    height = min(2.0 + (0.22 + 0.16 * lines) * len(labels), 40.0)
    fig = new_figure(layout="constrained", figsize=(3.6 * len(metrics) + 3.2, height))
    axes = fig.subplots(1, len(metrics), sharey=True, squeeze=False)[0]
    rng = np.random.default_rng(0)  # fixed jitter: the same run draws the same figure
    n_trials = 0
    for ax, metric in zip(axes, metrics, strict=True):
        by_label = {s.label: s for s in per_metric[metric]}
        reps_x, reps_y, filled, hollow = [], [], [], []
        means: list[tuple[float, int]] = []
        for y, label in enumerate(labels):
            s = by_label.get(label)
            if s is None:
                continue
            for p in s.points:
                jitter = y + rng.uniform(-0.18, 0.18)
                reps_x += p.repetitions
                reps_y += [jitter] * len(p.repetitions)
                (hollow if p.suspect else filled).append((p.value, jitter))
            good = [p.value for p in s.points if not p.suspect]
            if good:
                means.append((float(np.mean(good)), y))
            if (s.failed or s.interrupted) and metric == metrics[-1]:
                note = ", ".join(t for t in (f"{len(s.failed)} failed" if s.failed else "",
                                             f"{len(s.interrupted)} interrupted"
                                             if s.interrupted else "") if t)
                ax.annotate(note, (1.0, y), xycoords=("axes fraction", "data"),
                            xytext=(4, 0), textcoords="offset points", va="center",
                            color=FAILED_COLOR if s.failed else "#757575", fontsize=8)
            n_trials += len(s.points) if metric == metrics[0] else 0
        # One collection per kind of mark (not one per trial or candidate): a long run stays
        # quick to draw.
        ax.scatter(reps_x, reps_y, s=6, color="#bdbdbd", zorder=1)
        if means:
            ax.vlines([m for m, _ in means], [y - 0.35 for _, y in means],
                      [y + 0.35 for _, y in means], color="black", lw=1.2, zorder=2)
        if filled:
            ax.scatter(*zip(*filled, strict=True), s=28, color="#1565c0", zorder=3)
        if hollow:
            ax.scatter(*zip(*hollow, strict=True), s=28, facecolors="none",
                       edgecolors=SUSPECT_COLOR, zorder=3)
        ax.set_xlabel(_unit(metric))
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(range(len(labels)), labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle("trial-level values per candidate: dot = one server restart, grey ="
                 " repetitions, bar = mean, hollow orange = suspect", fontsize=9)
    return Plot("distributions", "Per-candidate metric distributions",
                f"Every measured trial ({n_trials} on {metrics[0]}) of every candidate; suspect"
                " trials are drawn hollow and left out of the means; failed trials are counted,"
                " interrupted ones (stopped, then run again) are not failures.",
                _png(fig))


def posterior_plot(history: S.PosteriorHistory) -> Plot:
    from matplotlib.ticker import MaxNLocator

    n = len(history.labels)
    matrix = np.array([s.posterior for s in history.steps])
    fig = new_figure(layout="constrained", figsize=(min(max(7.0, 4 + 0.12 * n), 16), 6.5))
    top, bottom = fig.subplots(2, 1, height_ratios=[3, 1.3])
    im = top.imshow(matrix, aspect="auto", cmap="magma_r", vmin=0, vmax=1, interpolation="nearest",
                    extent=(-0.5, n - 0.5, len(history.steps) + 0.5, 0.5))
    fig.colorbar(im, ax=top, label="P(first bad commit)")
    for c in history.culprits:
        top.axvline(c, color="#2e7d32", lw=1, ls="--")
    top.set_ylabel("after observation #")
    top.yaxis.set_major_locator(MaxNLocator(integer=True))
    culprit = (f"\ndashed: the culprit, {history.culprit_label}" if history.culprit_label
               else "")
    top.set_title(f"bisect posterior over commits as trials arrived{culprit}", fontsize=9)
    if n <= 40:
        top.set_xticks(range(n), history.labels, rotation=90, fontsize=7)
    else:
        top.set_xlabel("commit position (0 = good, last = bad)")
    steps = range(1, len(history.steps) + 1)
    bottom.plot(steps, [s.best_probability for s in history.steps], marker="o", ms=3,
                color="#6a1b9a")
    bottom.axhline(history.confidence, color="grey", ls=":", lw=1)
    bottom.set_ylim(0, 1.02)
    bottom.set_xlabel("observations (bisect trials, in trial-id order)")
    bottom.xaxis.set_major_locator(MaxNLocator(integer=True))
    bottom.set_ylabel("best P")
    bottom.grid(alpha=0.3)
    return Plot("posterior", "Bisect posterior as it progressed",
                f"The strategy's posterior replayed over {len(history.steps)} stored"
                f" observations; the dotted line is the requested confidence"
                f" {history.confidence:.2f}.", _png(fig))


def _bars(ax, pair: S.PhasePair, metrics: Sequence[str]) -> None:
    rows = [(m, a, b) for m, a, b in pair.metrics if m in metrics]
    x = np.arange(len(rows))
    for offset, side, color, label in ((-0.2, 1, BEFORE_COLOR, f"before: {pair.before_label}"),
                                       (0.2, 2, AFTER_COLOR, f"after: {pair.after_label}")):
        means = [r[side].mean if r[side] else np.nan for r in rows]
        err = np.array([[r[side].mean - r[side].lo, r[side].hi - r[side].mean] if r[side]
                        else [0, 0] for r in rows]).T.reshape(2, len(rows))
        ax.bar(x + offset, means, width=0.4, color=color, alpha=0.8, label=label,
               yerr=err, capsize=3)
        for xi, mean, r in zip(x + offset, means, rows, strict=True):
            if np.isfinite(mean):  # the label sits above the interval, clear of the dots
                top = max(r[side].hi, *r[side].values) if r[side] else mean
                ax.annotate(f"{mean:.3g}", (xi, top), ha="center", va="bottom", fontsize=7,
                            xytext=(0, 2), textcoords="offset points")
            if r[side] and r[side].values:  # every trial, not only its mean
                ax.scatter([xi] * len(r[side].values), r[side].values, s=9, color="black",
                           zorder=3)
    ax.set_xticks(x, [r[0] for r in rows])
    ax.margins(y=0.15)  # room for the labels above the tallest interval
    ax.grid(axis="y", alpha=0.3)


def phase_plot(pairs: Sequence[S.PhasePair]) -> Plot:
    fig = new_figure(layout="constrained", figsize=(11, 3.6 * len(pairs)))
    axes = fig.subplots(len(pairs), 2, squeeze=False, width_ratios=[3, 2])
    for (ms_ax, other_ax), pair in zip(axes, pairs, strict=True):
        _bars(ms_ax, pair, S.PHASE_MS_METRICS)
        ms_ax.set_ylabel("ms per pass")
        ms_ax.set_title(f"{pair.title}: phase time", loc="left")
        # Below the bars, never over them: what "before" and "after" are, in words.
        ms_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.12),
                     frameon=False, borderaxespad=0.0)
        _bars(other_ax, pair, S.PHASE_OTHER_METRICS)
        other_ax.set_title("accept length, CUDA-graph share", loc="left")
    return Plot("phases", "Phase breakdown before/after",
                "Mean over trials (dots: each trial) with 95% t-intervals over restarts:"
                " verify, draft and decode time, draft accept length and the share of passes"
                " run inside a CUDA graph.",
                _png(fig))


SWEEP_MARKS = {  # what a dot of the sweep's history measured: color, legend label
    SW.WINNER: ("#c62828", "a restart of the confirmed winner"),
    SW.BASELINE: ("#616161", "a restart of the baseline"),
    SW.OTHER: ("#90caf9", "a restart of another configuration"),
}


def sweep_legend(sweep: SW.SweepSeries) -> list[str]:
    """The legend of the history panel, in drawing order: every kind of dot drawn, the best
    configuration mean so far, and the confirmed winner's and the baseline's means."""
    kinds = {k for *_, k in sweep.history}
    out = [SWEEP_MARKS[k][1] + (f" ({sweep.winner})" if k == SW.WINNER and sweep.winner else "")
           for k in (SW.OTHER, SW.BASELINE, SW.WINNER) if k in kinds]
    if any(b is not None for _, _, b, _ in sweep.history):
        out.append(f"best configuration so far (its mean, >= {SW.MIN_RESTARTS_FOR_BEST}"
                   " restarts)")
    if sweep.winner_mean is not None:
        out.append("confirmed winner: mean of its confirmation restarts")
    if sweep.baseline_mean is not None:
        out.append("baseline: mean of its confirmation restarts")
    return out


def sweep_plot(sweep: SW.SweepSeries) -> Plot:
    fig = new_figure(layout="constrained",
                     figsize=(11, max(4.2, 1.0 + 0.35 * len(sweep.importance))))
    imp_ax, hist_ax = fig.subplots(1, 2, width_ratios=[2, 3])
    names = [k for k, _ in sweep.importance][::-1]
    imp_ax.barh(names, [v for _, v in sweep.importance][::-1], color="#00838f")
    imp_ax.set_xlabel("importance")
    imp_ax.set_title("parameter importance", loc="left")
    if sweep.history:
        labels = iter(sweep_legend(sweep))
        xs = np.arange(1, len(sweep.history) + 1)
        for kind in (SW.OTHER, SW.BASELINE, SW.WINNER):
            at = [i for i, (*_, k) in enumerate(sweep.history) if k == kind]
            if at:
                hist_ax.scatter(xs[at], [sweep.history[i][1] for i in at], s=16, zorder=3,
                                color=SWEEP_MARKS[kind][0], label=next(labels))
        best = [np.nan if b is None else b for _, _, b, _ in sweep.history]
        if not np.all(np.isnan(best)):
            hist_ax.step(xs, best, where="post", color="#2e7d32", label=next(labels))
        if sweep.winner_mean is not None:
            hist_ax.axhline(sweep.winner_mean, color=SWEEP_MARKS[SW.WINNER][0], ls="--", lw=1,
                            label=next(labels))
        if sweep.baseline_mean is not None:
            hist_ax.axhline(sweep.baseline_mean, color=SWEEP_MARKS[SW.BASELINE][0], ls=":",
                            lw=1, label=next(labels))
        # Below the axes: over the dots a legend hides the very restarts it explains.
        hist_ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(0.0, -0.14),
                       frameon=False)
    hist_ax.set_xlabel("sweep trial")
    hist_ax.set_ylabel(_unit(sweep.metric))
    hist_ax.set_title("trial history", loc="left")
    hist_ax.grid(alpha=0.3)
    return Plot("sweep", "Sweep: parameter importance and trial history",
                f"Importance: {sweep.importance_source}. History: every measured sweep restart"
                f" on {sweep.metric} ({'higher' if sweep.higher_is_better else 'lower'} is"
                " better), colored by what it measured; the line is the best configuration's"
                " mean so far, not the best single restart.",
                _png(fig))


def timeline_plot(spans: Sequence[S.Span]) -> Plot:
    from matplotlib.patches import Patch

    nodes = sorted({s.node for s in spans})
    fig = new_figure(layout="constrained", figsize=(11, 1.2 + 0.55 * len(nodes)))
    ax = fig.subplots()
    end = max(s.end for s in spans) or 1.0
    # One collection per node and color, not one per trial: 500 trials drew in 0.85 s, most
    # of it matplotlib's per-artist overhead.
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for s in spans:
        y = nodes.index(s.node)
        color = (SUSPECT_COLOR if s.suspect else OUTCOME_COLORS.get(s.outcome, FAILED_COLOR))
        bars.setdefault((y, color), []).append((s.start, max(s.end - s.start, end / 1000)))
        if s.end - s.start > end / 40:
            ax.text((s.start + s.end) / 2, y, str(s.trial_id), ha="center", va="center",
                    fontsize=6, color="white")
    for (y, color), ranges in bars.items():
        ax.broken_barh(ranges, (y - 0.38, 0.76), facecolors=color, edgecolor="white",
                       linewidth=0.5)
    ax.set_yticks(range(len(nodes)), nodes)
    ax.set_xlabel("seconds since the first trial started")
    ax.set_title("trials per node (text = trial id)", loc="left")
    ax.grid(axis="x", alpha=0.3)
    seen = {("suspect" if s.suspect else "ok" if s.outcome == "ok" else
             "interrupted" if s.outcome in ("interrupted", "running") else "failed")
            for s in spans}
    kinds = [("ok", OUTCOME_COLORS["ok"]), ("failed", FAILED_COLOR),
             ("interrupted (stopped, not failed)", OUTCOME_COLORS["interrupted"]),
             ("suspect", SUSPECT_COLOR)]
    ax.legend(handles=[Patch(color=c, label=k) for k, c in kinds if k.split(" ")[0] in seen],
              fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0), frameon=False)
    return Plot("timeline", "Per-node trial timeline",
                f"{len(spans)} trials on {len(nodes)} node(s) over {end:.0f} s.", _png(fig))


def kernels_plot(entries: Sequence) -> Plot | None:
    from orchestrator.ui.report.kernel_report import kernel_figure

    fig = kernel_figure(entries)
    if fig is None:
        return None
    return Plot("kernels", "Kernel evidence: what each named cause moved",
                "Per cause, device time per pass of each kernel family in each forward mode,"
                " its two sides profiled over restarts; red: a mover (interval excludes zero at"
                " the Bonferroni-corrected level, change of 3% or more).", _png(fig))


def make_plots(data: RunData) -> list[Plot]:
    """Every figure the run's data supports, in reading order."""
    with matplotlib_module().rc_context(_RC):
        plots = [distributions_plot(data)]
        history = S.posterior_history(data)
        plots.append(posterior_plot(history) if history else None)
        pairs = S.phase_pairs(data)
        plots.append(phase_plot(pairs) if pairs else None)
        plots.append(kernels_plot((data.ranked.get("answer") or {}).get("evidence") or []))
        sweep = SW.sweep_series(data)
        plots.append(sweep_plot(sweep) if sweep else None)
        spans = S.timeline(data.rows)
        plots.append(timeline_plot(spans) if spans else None)
    return [p for p in plots if p is not None]
