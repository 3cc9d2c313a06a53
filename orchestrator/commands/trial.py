"""`sleuth trial`: exactly one isolated, measured trial of one candidate on one node."""

from __future__ import annotations

from omegaconf import DictConfig

from orchestrator import render
from orchestrator.commands import common
from orchestrator.controller import Controller
from orchestrator.rundir import create_run, running


def run(cfg: DictConfig) -> int:
    common.check_common(cfg)
    ws = common.workspace(cfg)
    cand = common.candidate(cfg, ws)
    cfg.nodes = 1
    run_dir, store = create_run(cfg)
    out = render.console()
    with running(store, run_dir, out) as run:
        with Controller(cfg, store, run_dir, on_event=lambda m: out.print(f"  {m}")) as ctl:
            row = ctl.run_one(cand, phase="trial")
        out.print(render.trial_table(row))
        if row.outcome is not None and row.outcome.measured:
            run.status = "done"
            return 0
        out.print(f"trial {row.id} {row.outcome.value if row.outcome else '?'}: {row.detail}",
                  style="red")
        out.print(f"server log: {row.log_path}")
        return 1
