"""`sleuth report RUN`: ranked findings in the terminal, `report.md` and `report.html` on disk.

    sleuth report RUN        RUN is a run id under runs_dir or a run directory

Reads only what the run stored (trials, findings, the bisect plan); runs nothing. A run that
does not exist is bad input (exit 2) and nothing is written.
"""

from __future__ import annotations

from omegaconf import DictConfig

from orchestrator import render
from orchestrator.errors import UserError
from orchestrator.report import write_report
from orchestrator.report.terminal import print_report
from orchestrator.rundir import find_run


def run(cfg: DictConfig) -> int:
    if not cfg.run_id:
        raise UserError("which run? usage: sleuth report RUN (a run id or run directory)")
    run_dir = find_run(cfg, str(cfg.run_id))
    data, files = write_report(run_dir)
    out = render.console()
    paths = [files.markdown, files.html] + ([files.findings] if files.findings else [])
    print_report(out, data, paths)
    return 0
