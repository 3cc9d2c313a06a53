"""`sleuth trial`: isolated, measured trials of one candidate.

    sleuth trial repo=PATH commit=REF [patches=[a.patch]] [env.NCCL_PROTO=LL128] [clock=...]
                 [restarts=N] [nodes=K] [bench.repetitions=3]

One trial is one server lifetime; `restarts=N` runs N of them (on up to `nodes` nodes), which
is how a reference for `sleuth investigate reference=RUN` is made in one command: one restart
says nothing about restart-to-restart noise, three do. Exit 0 when every trial measured, 1
otherwise (the trials that did measure are kept and usable as a reference), 5 when the node's
system changed between its restarts (they measured two systems: not one reference).

    sleuth trial from_log=PATH run_id=NAME [repo=PATH commit=REF] [log.pattern=REGEX]

keeps an old server log as a reference run instead of measuring (`orchestrator/reference`):
nothing runs, and `reference=NAME` later reads what the log tells (and says what it cannot).
"""

from __future__ import annotations

from orchestrator.commands import common, next_step, parts
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config.requests import TrialRequest
from orchestrator.config.settings import RunSettings, evolve
from orchestrator.control.controller import Controller
from orchestrator.errors import ANSWERED, FAILURE, SYSTEM_CHANGED, UserError
from orchestrator.run.rundir import running
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
    if cfg.from_log:
        return _from_log(cfg)
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
        with Controller(parts.control(cfg), store, run_dir, on_event=lambda m: out.print(f"  {m}")) as ctl:
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
                # complete, so it runs as printed once the node is slow: where and how this
                # run measured (target, repository, runs_dir, metric) carried along
                out.print("reference: " + next_step.command(
                    cfg, "investigate", f"reference={run_dir.name}", "bad=HEAD"))
        return code


def _from_log(cfg: RunSettings) -> int:
    """An old log kept as a run: parsed before anything is written (a log with no line sleuth
    can read is bad input), then its summary and one trial row per server run in it."""
    from orchestrator.reference import record, stored
    from orchestrator.reference.parsed import parse_files

    if cfg.restarts != 1:
        raise UserError(f"from_log= reads a log, restarts={cfg.restarts} measures: give one")
    cfg = common.absolute_paths(cfg)
    log = parse_files(str(cfg.from_log).removeprefix(record.PREFIX), cfg.log.pattern)
    summary = record.summarize(log)
    repo = sha = None
    how = "not named: repo=PATH commit=REF name it"
    if cfg.repo:
        ws = common.workspace(cfg)
        sha, repo = ws.resolve(str(cfg.commit)), str(cfg.repo)
        how = f"named: {cfg.commit} ({sha[:12]})"
    cfg = pin_run(evolve(cfg, from_log=",".join(log.files)))
    run_dir, store = create_run(cfg)
    out = render.console()
    with running(store, run_dir, out) as run:
        ids = stored.store_log(run_dir, store, log, summary, repo=repo, sha=sha)
        out.print(f"read {log.lines} lines of {len(log.files)} file(s): {len(ids)} server"
                  f" run(s), {len(summary['chosen'])} taken as the reference")
        for line in record.preview(summary, how):
            out.print(line)
        run.status = "done"
        # complete, as the measured reference's line is (`bad=HEAD` only where a commit is
        # named: without one the investigation compares configurations)
        out.print("reference: " + next_step.command(
            cfg, "investigate", f"reference={run_dir.name}", *(["bad=HEAD"] if repo else [])))
    return 0


def exit_for(rows) -> int:
    """0 every restart measured, 1 one did not, 5 the node's system changed between them
    (the rule every command shares: `orchestrator/errors.py`)."""
    if any(r.outcome is None or not r.outcome.measured for r in rows):
        return FAILURE
    return SYSTEM_CHANGED if system_changes(rows) else ANSWERED
