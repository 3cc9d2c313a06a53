"""`sleuth resume RUN`: finish an interrupted run, reusing every trial it already finished."""

from __future__ import annotations

from orchestrator.commands.parts import find_run
from orchestrator.config.early import not_resumable
from orchestrator.config.requests import RunRequest
from orchestrator.config.settings import RunSettings
from orchestrator.errors import UserError
from orchestrator.run.rundir import RESUMABLE
from orchestrator.store import RunStore


def run(cfg: RunSettings) -> int:
    req = RunRequest.of(cfg)
    run_dir = find_run(cfg, req.run)
    store = RunStore.open(run_dir / "trials.db")
    command = store.command
    stored = store.config_yaml()
    store.close()
    if command not in RESUMABLE:  # before the commands' modules bring Ray and SciPy along
        raise UserError(not_resumable(run_dir, command))
    from orchestrator.commands.isolate import refuse_redacted
    from orchestrator.config.settings import load_saved

    refuse_redacted(load_saved(stored), run_dir.name)
    if command == "bisect":
        from orchestrator.commands import bisect

        # `sleuth resume RUN max_trials=N`: a larger budget
        return bisect.resume(run_dir, max_trials=req.max_trials)
    if command == "isolate":
        from orchestrator.commands import isolate

        return isolate.resume(run_dir)
    if command == "investigate":
        from orchestrator.commands import investigate

        return investigate.resume(run_dir)
    if command == "sweep":
        from orchestrator.commands import sweep

        return sweep.resume(run_dir)
    raise UserError(not_resumable(run_dir, command))
