"""`sleuth report RUN [out=DIR]`: ranked findings in the terminal, `report.md` and `report.html`.

    sleuth report RUN            RUN is a run id under runs_dir or a run directory
    sleuth report RUN out=DIR    write the report files into DIR instead of the run directory

Reads only what the run stored (trials, findings, the bisect plan); runs nothing. A run that
does not exist, or whose store is damaged, is bad input (exit 2) and nothing is written. A run
in a read-only directory is still shown in the terminal; its files need `out=DIR`.
"""

from __future__ import annotations

import json
import os

from orchestrator.commands.parts import find_run
from orchestrator.config.requests import RunRequest
from orchestrator.config.settings import RunSettings
from orchestrator.errors import UserError
from orchestrator.ui import render
from orchestrator.ui.report import load_run, write_files
from orchestrator.ui.report.terminal import print_report


def run(cfg: RunSettings) -> int:
    req = RunRequest.of(cfg)
    run_dir = find_run(cfg, req.run)
    out_dir = req.out
    console = render.console()
    if _kernels_run(run_dir):  # `sleuth kernels`: traces diffed, no trials to report
        return _kernels_report(console, run_dir, out_dir)
    data = load_run(run_dir)
    if out_dir is None and not os.access(run_dir, os.W_OK):
        print_report(console, data)
        console.print(f"{run_dir} is read-only: report.md and report.html were not written"
                      " (add out=DIR to write them elsewhere)")
        return 0
    files = write_files(data, out_dir)
    paths = [files.markdown, files.html] + ([files.findings] if files.findings else [])
    print_report(console, data, paths)
    return 0


def _kernels_run(run_dir) -> bool:
    try:
        doc = json.loads((run_dir / "findings.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and doc.get("experiment") == "kernels"


def _kernels_report(console, run_dir, out_dir) -> int:
    from orchestrator.ui.report import kernels_page

    if out_dir is None and not os.access(run_dir, os.W_OK):
        raise UserError(f"{run_dir} is read-only: add out=DIR to write the report elsewhere")
    md, page, _ = kernels_page.write(run_dir, out_dir=out_dir)
    doc = json.loads((run_dir / kernels_page.FINDINGS).read_text())
    console.print(doc["message"])
    console.print(f"report: {md}\nreport: {page}")
    return 0
