"""Terminal rendering (rich). Computation lives elsewhere; this only lays numbers out.

Everything printed may hold repository text (commit subjects, patch names, server log lines):
the console and the tables here pass it through `safe_text.printable`, so no terminal escape
from a commit message reaches the user's terminal.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from rich.console import Console
from rich.table import Table
from rich.text import Text

from orchestrator.store import TrialRow
from orchestrator.strategies.base import probability_text
from orchestrator.util.safe_text import printable

# (metric key, column title, format). Medians only, short titles: a trial's table fits an
# 80-column terminal; the p90s and everything else are in trials.db and the report.
TRIAL_COLUMNS = (
    ("output_throughput", "tok/s", "{:.1f}"),
    ("ttft_ms_p50", "TTFT ms", "{:.1f}"),
    ("itl_ms_p50", "ITL ms", "{:.2f}"),
    ("tpot_ms_p50", "TPOT ms", "{:.2f}"),
    ("verify_ms", "verify", "{:.2f}"),
    ("draft_ms", "draft", "{:.2f}"),
    ("decode_ms", "decode", "{:.2f}"),
    ("accept_len", "accept", "{:.2f}"),
    ("cuda_graph_share", "graph", "{:.0%}"),
)


def _columns(results) -> list[tuple[str, str, str]]:
    """The known columns the trials measured, then (for target=command) their own metrics."""
    present = [c for c in TRIAL_COLUMNS if any(r and r.values(c[0]) for r in results)]
    if present:  # an SGLang server's (real or simulated): its diagnostics stay in trials.db
        return present
    own = sorted({m for r in results if r for m in r.metric_names()} - set(_HIDDEN))
    return [(m, m, "{:.4g}") for m in own]


# Measured but not worth a terminal column (p90s, per-request verify).
_HIDDEN = ("ttft_ms_p90", "itl_ms_p90", "tpot_ms_p90", "verify_ms_per_request")


probability = probability_text  # the tables' name for it


def _fmt(fmt: str, value: float | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return fmt.format(value)


def trial_table(row: TrialRow) -> Table:
    """One row per repetition plus the trial mean, for the metrics the trial measured."""
    result = row.result
    present = _columns([result])
    table = Table(title=printable(f"trial {row.id} · {row.candidate.label} · "
                                  f"{row.outcome.value if row.outcome else 'running'}",
                                  newlines=False),
                  caption="verify, draft, decode: ms per pass")
    table.add_column("rep", justify="right")
    for _, title, _ in present:
        table.add_column(title, justify="right")
    if result:
        for m in result.measurements:
            table.add_row(str(m.repetition + 1), *[_fmt(f, m.metrics.get(k)) for k, _, f in present])
        if len(result.measurements) > 1:
            table.add_row("mean", *[_fmt(f, result.value(k)) for k, _, f in present], style="bold")
    return table


def restarts_table(rows: Sequence[TrialRow]) -> Table:
    """One row per restart (its trial-level values), then the mean and the spread between
    restarts: the restart-to-restart noise that decides how many restarts a change needs."""
    results = [r.result for r in rows if r.outcome is not None and r.outcome.measured]
    present = _columns(results)
    label = rows[0].candidate.label if rows else ""
    table = Table(title=printable(f"{len(rows)} restarts · {label}", newlines=False),
                  caption="trial-level values (mean over each restart's repetitions)")
    table.add_column("trial", justify="right")
    for _, title, _ in present:
        table.add_column(title, justify="right")
    for r in rows:
        cells = [_fmt(f, r.result.value(k) if r.result and r.outcome and r.outcome.measured
                      else None) for k, _, f in present]
        table.add_row(str(r.id), *cells)
    means, cvs = [], []
    for k, _, f in present:
        vals = [v for res in results if (v := res.value(k)) is not None]
        means.append(_fmt(f, statistics.fmean(vals) if vals else None))
        cv = (statistics.stdev(vals) / abs(statistics.fmean(vals))
              if len(vals) > 1 and statistics.fmean(vals) else None)
        cvs.append("-" if cv is None else f"{100 * cv:.1f}%")
    table.add_row("mean", *means, style="bold")
    if len(results) > 1:
        table.add_row("cv", *cvs)
    return table


class SafeConsole(Console):
    """A rich console whose plain-string arguments lose their control characters first.

    Rich renders a string as text, but passes ESC and most C0 bytes through to the terminal;
    strings printed here often quote repository text (an event line naming a patch, a
    verdict naming a commit). Renderables (tables, panels) are built from cleaned cells."""

    def print(self, *objects, **kwargs) -> None:  # type: ignore[override]
        super().print(*(printable(o) if isinstance(o, str) else o for o in objects), **kwargs)


def console() -> Console:
    """Rich on a terminal; wide plain tables when output goes to a file or pipe (160 columns,
    or `COLUMNS` where the caller sets it, as a script that greps whole lines does)."""
    import os
    import sys

    # markup=False: commit subjects and server output are printed as text, never interpreted.
    piped = not sys.stdout.isatty() and "COLUMNS" not in os.environ
    return SafeConsole(highlight=False, soft_wrap=False, markup=False,
                       width=160 if piped else None)


def finding_id(finding: dict, width: int = 40) -> str:
    """A finding's id as a table shows it: a commit by its first 12 hex digits, a patch (or a
    pair of them) by file name rather than a path truncated to its directory."""
    raw = str(finding.get("id", ""))
    if finding.get("kind") == "commit":
        return raw[:12]
    short = " + ".join(part.rsplit("/", 1)[-1] for part in raw.split(" + "))
    return short if len(short) <= width else short[: width - 3] + "..."


def findings_table(doc: dict, max_without_probability: int = 5) -> Table | Text:
    """Ranked findings with probability and the effect on the run's metric. Differences that
    were listed but not tested (no probability) are capped; findings.json has them all.
    Without findings ("not reproducible", a budget spent early) it is one line, not an empty
    table: the verdict's message that follows says why."""
    metric = doc.get("metric", "")
    title = f"findings · {doc.get('experiment')} · {doc.get('verdict')}"
    if not doc.get("findings"):
        return Text(printable(f"{title}: none"))
    from orchestrator.answer.text import change_text

    table = Table(title=title)
    items = doc.get("findings", [])
    with_phase = any(f.get("phase") for f in items)  # SGLang servers name the phase
    # An isolate's finding is its effect added alone to good; the answer's causes table shows
    # its share of what restoring all of them wins back, which differs when causes interact.
    effect = "added alone" if doc.get("experiment") == "isolate" else "effect"
    columns = ["rank", "kind", "id", "probability", f"{metric} {effect}"]
    columns += ["phase"] * with_phase + ["summary"]
    for col in columns:
        table.add_column(col)
    causes = [f for f in items if f.get("probability") is not None]
    others = [f for f in items if f.get("probability") is None]
    shown = causes + others[:max(0, max_without_probability)]
    for f in shown:
        e = f.get("effect", {}).get(metric)
        detail = (f.get("effect_detail") or {}).get(metric) or {}
        eff = change_text({**detail, **e}, metric) if e else "-"
        prob = f.get("probability")
        row = [str(f["rank"]), f["kind"], printable(finding_id(f), newlines=False),
               "-" if prob is None else probability(prob), eff]
        row += [f.get("phase") or "-"] * with_phase
        table.add_row(*row, printable(f.get("summary", ""), newlines=False))
    hidden = len(others) - max(0, max_without_probability)
    if hidden > 0:
        table.add_row(*[""] * (len(columns) - 1), f"... {hidden} more untested difference(s)"
                      " in findings.json")
    return table
