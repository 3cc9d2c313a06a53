"""Reviewing a run: one ranking across its experiments, and the report files built from it.

`write_report(run_dir)` is what `sleuth report RUN` (and the demo) call: it reads the run, ranks
its findings, draws the plots and writes `report.md`, `report.html` and `plots/*.png` into the
run directory. When the run holds more than one experiment's findings, `findings.json` is
rewritten as the combined ranking (it keeps every source document, so this is repeatable).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from orchestrator.ui.report.collect import RunData, load_run
from orchestrator.util.files import write_atomic


@dataclass(frozen=True)
class ReportFiles:
    markdown: Path
    html: Path
    plots: tuple[Path, ...]
    findings: Path | None  # rewritten combined ranking, when there was more than one experiment


def write_report(run_dir: Path, out_dir: Path | None = None) -> tuple[RunData, ReportFiles]:
    """Write the report files into the run directory, or into `out_dir` when given (a run in
    a read-only directory); a combined ranking goes to `findings.json` there."""
    data = load_run(Path(run_dir))
    return data, write_files(data, out_dir)


def write_files(data: RunData, out_dir: Path | None = None) -> ReportFiles:
    from orchestrator.ui.report.html import render_html
    from orchestrator.ui.report.markdown import render_markdown
    from orchestrator.ui.report.plots import PLOT_NAMES, make_plots

    target = Path(out_dir) if out_dir is not None else data.run_dir
    target.mkdir(parents=True, exist_ok=True)
    plots = make_plots(data)
    plot_dir = target / "plots"
    plot_dir.mkdir(exist_ok=True)
    for stale in plot_dir.glob("*.png"):  # a figure the data no longer supports must not linger
        if stale.stem in PLOT_NAMES:
            stale.unlink()
    plot_paths = []
    for p in plots:
        path = plot_dir / f"{p.name}.png"
        path.write_bytes(p.png)
        plot_paths.append(path)
    md = target / "report.md"
    page = target / "report.html"
    write_atomic(md, render_markdown(data, plots, plot_dir="plots"))
    write_atomic(page, render_html(data, plots))
    findings = None
    if len(data.docs) > 1:
        findings = target / "findings.json"
        write_atomic(findings, json.dumps(data.ranked, indent=2, default=float) + "\n")
    return ReportFiles(md, page, tuple(plot_paths), findings)


__all__ = ["ReportFiles", "RunData", "load_run", "write_files", "write_report"]
