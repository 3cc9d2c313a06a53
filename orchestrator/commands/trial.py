"""`sleuth trial`: isolated, measured trials of one candidate.

    sleuth trial repo=PATH commit=REF [patches=[a.patch]] [env.NCCL_PROTO=LL128] [clock=...]
                 [restarts=N] [nodes=K] [bench.repetitions=3]

One trial is one server lifetime; `restarts=N` runs N of them (on up to `nodes` nodes), which
is how a reference for `sleuth investigate reference=RUN` is made in one command: one restart
says nothing about restart-to-restart noise, three do. Exit 0 when every trial measured, 1
otherwise (the trials that did measure are kept and usable as a reference), 5 when the node's
system changed between its restarts (they measured two systems: not one reference).
"""

from __future__ import annotations

from orchestrator.commands import common
from orchestrator.config.requests import TrialRequest
from orchestrator.config.settings import RunSettings, evolve
from orchestrator.control.controller import Controller
from orchestrator.errors import ANSWERED, FAILURE, SYSTEM_CHANGED
from orchestrator.run.rundir import create_run, pin_run, running
from orchestrator.system.watch import system_changes
from orchestrator.ui import render


def nodes_for(restarts: int, asked: int) -> tuple[int, str | None]:
    """The nodes worth starting for `restarts` restarts, and the line that says why when
    fewer than the `nodes=` asked (a node with no restart to run would stand idle)."""
    used = max(1, min(asked, restarts))
    if used < asked:
        return used, (f"restarts={restarts}: {used} of nodes={asked} used (one restart per node;"
                      " the others would have none to run)")
    return used, None


def run(cfg: RunSettings) -> int:
    cfg = common.check_common(cfg)
    req = TrialRequest.of(cfg)
    ws = common.workspace(cfg)
    cand = common.candidate(cfg, ws)
    restarts = req.restarts
    nodes, why = nodes_for(restarts, cfg.nodes)
    cfg = pin_run(evolve(cfg, nodes=nodes))
    run_dir, store = create_run(cfg)
    out = render.console()
    with running(store, run_dir, out) as run:
        if why:
            out.print(why)
        rows = []
        with Controller(cfg, store, run_dir, on_event=lambda m: out.print(f"  {m}")) as ctl:
            submitted = 0
            while submitted < restarts or ctl.in_flight():
                while submitted < restarts and ctl.idle_nodes():
                    ctl.submit(cand, phase="trial")
                    submitted += 1
                rows += ctl.wait()
        rows.sort(key=lambda r: r.id)
        if len(rows) == 1:
            out.print(render.trial_table(rows[0]))
        else:
            out.print(render.restarts_table(rows))
        failed = [r for r in rows if r.outcome is None or not r.outcome.measured]
        for row in failed:
            out.print(f"trial {row.id} {row.outcome.value if row.outcome else '?'}: {row.detail}",
                      style="red")
            out.print(f"server log: {row.log_path}")
        code = exit_for(rows)
        if code == SYSTEM_CHANGED:  # its restarts measured two systems: not one reference
            for change in system_changes(rows):
                out.print(change.warning)
            out.print("the node's system changed between these restarts: they are not one"
                      " reference; run them again on a node that holds still")
            run.status = "inconclusive"
        elif code == ANSWERED:
            run.status = "done"
            if restarts > 1:
                out.print(f"reference: sleuth investigate reference={run_dir.name} ...")
        return code


def exit_for(rows) -> int:
    """0 every restart measured, 1 one did not, 5 the node's system changed between them
    (the rule every command shares: `orchestrator/errors.py`)."""
    if any(r.outcome is None or not r.outcome.measured for r in rows):
        return FAILURE
    return SYSTEM_CHANGED if system_changes(rows) else ANSWERED
