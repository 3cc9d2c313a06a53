"""The report of a `sleuth kernels` run: report.md, report.html and plots/kernels.png.

A kernels run diffs traces the user already has: no trials, no candidates, no fingerprints, so
the trial report's sections would all say "none". Its page is the evidence alone: the line,
the sides (which files, how they group into restarts), the table and the figure, drawn by the
same functions as an investigation's kernel evidence (`kernel_report.py`). `sleuth report RUN`
on such a run renders this page again from its findings.json.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

from orchestrator.ui.report.figure import matplotlib_module

FINDINGS = "findings.json"


def _md(doc: dict, plot: str | None) -> str:
    from orchestrator.ui.report.markdown import md_escape

    e = doc["answer"]["evidence"][0]
    out = [f"# sleuth kernels: {md_escape(doc['run'])}", "", f"**{md_escape(e['line'])}**", ""]
    for side in ("then", "now"):
        s = doc["sides"][side]
        out += [f"- {side} ({'before' if side == 'then' else 'after'}): {s['restarts']}"
                f" restart(s) from {len(s['files'])} file(s)"
                + (f"; {md_escape(s['note'])}" if s.get("note") else "")]
        out += [f"  - `{md_escape(f, line_start=False)}`" for f in s["files"]]
    out += ["", *e.get("table", []), ""]
    if plot:
        out += [f"![kernel diff]({plot})", ""]
    return "\n".join(out) + "\n"


def _html(doc: dict, figure) -> str:
    from orchestrator.ui.report.html import _CSS, CSP, _figure, esc, html_table
    from orchestrator.ui.report.kernel_report import kernel_tables

    e = doc["answer"]["evidence"][0]
    body = [f"<h1>sleuth kernels: {esc(doc['run'])}</h1>",
            f'<section id="answer"><p class="answer">{esc(e["line"])}</p></section>',
            f'<p class="note">generated {esc(time.strftime("%Y-%m-%d %H:%M:%S"))}</p>']
    for side in ("then", "now"):
        s = doc["sides"][side]
        body += [f"<h3>{side}: {s['restarts']} restart(s)</h3>",
                 f'<p class="note">{esc(s.get("note") or "")}</p>',
                 "<pre>" + esc("\n".join(s["files"])) + "</pre>"]
    tables = kernel_tables([e])
    body += [html_table(t) for t in tables] or [f"<p>{esc(e['line'])}</p>"]
    if figure is not None:
        body.append(_figure(figure))
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            '<link rel="icon" href="data:,">'
            f"<title>sleuth kernels {esc(doc['run'])}</title><style>{_CSS}</style></head>"
            f"<body>{''.join(body)}</body></html>\n")


def write(run_dir: Path, doc: dict | None = None, out_dir: Path | None = None
          ) -> tuple[Path, Path, Path | None]:
    """Write report.md, report.html and plots/kernels.png (when there are rows to draw) for
    a kernels run's findings (`doc`, else the run's findings.json); returns their paths."""
    from orchestrator.ui.report.plots import _RC, kernels_plot

    if doc is None:
        doc = json.loads((run_dir / FINDINGS).read_text())
    target = out_dir or run_dir
    target.mkdir(parents=True, exist_ok=True)
    with matplotlib_module().rc_context(_RC):
        plot = kernels_plot(doc["answer"]["evidence"])
    if plot is not None:
        plot = dataclasses.replace(
            plot, title="Kernel diff: then -> now",
            caption="Device time per pass of each kernel family in each forward mode, the"
                    " traces of each side as restarts; red: a mover (interval across restarts"
                    " excludes zero at the Bonferroni-corrected level, change of 3% or more);"
                    " no whisker: one trace a side, no interval.")
    png = None
    if plot is not None:
        (target / "plots").mkdir(exist_ok=True)
        png = target / "plots" / "kernels.png"
        png.write_bytes(plot.png)
    md, page = target / "report.md", target / "report.html"
    md.write_text(_md(doc, "plots/kernels.png" if png else None))
    page.write_text(_html(doc, plot))
    return md, page, png
