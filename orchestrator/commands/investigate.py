"""`sleuth investigate`: "it was 19 ms, now it is 29 ms: why?" in one command, one answer.

    sleuth investigate repo=PATH reference=RUN [bad=REF] [metric=verify_ms] [nodes=K]
                       [recover=true] [max_trials=N]
    sleuth investigate repo=PATH good=REF bad=REF [metric=verify_ms] [nodes=K]

With a reference (a run that measured the good state, e.g. `sleuth trial commit=GOOD
restarts=3`, or a fingerprint JSON), sleuth re-measures the reference's whole candidate now
(`compare`). If it no longer reproduces, part of the cause is at the system level: the
fingerprint diff is ranked by mechanism and its controllable differences are tested (`isolate`);
so they are when the compare is undecided (a reference of one restart, its own noise in the
estimate), since the isolate measures the reference's configuration recreated now.
When `bad` is another commit than the reference's, the range between them is bisected too, under
today's system (`bisect`); when the system changed, the range is judged against the change left
once the system's part is taken out
(:func:`orchestrator.commands.investigate_answer.code_yardstick`), so a commit smaller than the
system causes beside it is still found. `recover=true` ends with a short sweep of `space`
(default `nccl_quick`) on the bad commit as the node is now. Then one answer: the total change
from the reference (then) to the bad commit (now) on the log scale, each named cause with its
interval, and what they leave unexplained (:mod:`orchestrator.answer`), after a final check that
measures the endpoints interleaved until the remainder's interval decides
(:func:`orchestrator.commands.final_check.final_check`). Exit codes: the rule every command
shares (`orchestrator/errors.py`: 0 the causes carry the change or nothing is reproducibly
slower, 3 a remainder beyond the min effect or a change no cause carries, 4 nothing decided, 5
the node's system changed during the run).

Without a reference, `good=REF bad=REF` bisects; when the range does not reproduce today, the
cause is not in the code, and the answer names earlier runs in `runs_dir` that measured the
good commit, with the `reference=` command that continues from there.

One run directory; `sleuth resume RUN` continues an interrupted investigation, reusing every
finished trial (a finished compare is not repeated; the isolate and the bisect replay theirs).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from orchestrator.answer.provisional import so_far
from orchestrator.commands import (
    bisect,
    common,
    compare,
    investigate_answer,
    investigate_steps,
    isolate,
    parts,
)
from orchestrator.commands.investigate_answer import Plan
from orchestrator.commands.investigate_steps import Steps
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config import params as experiment_params
from orchestrator.config.bisect import bisect_strategy
from orchestrator.config.requests import InvestigateRequest, SweepRequest
from orchestrator.config.settings import RunSettings, evolve
from orchestrator.control.controller import Controller
from orchestrator.errors import RunInterrupted, UserError, answer_exit
from orchestrator.evidence import plan as evidence_plan
from orchestrator.run import findings
from orchestrator.run.plan import BudgetSpent, parse_budget
from orchestrator.run.rundir import running
from orchestrator.store import RunStore
from orchestrator.ui import render
from orchestrator.ui.progress import Progress
from orchestrator.ui.report.terminal import print_answer


def exit_code(answer: dict) -> int:
    """The investigation's exit code from its answer: the rule every command shares
    (:func:`orchestrator.errors.answer_exit`, README "Exit codes"); a run that reached its
    `budget=` is a provisional answer: 3 with a best guess, 4 with nothing decided."""
    return answer_exit(answer)


def plan(cfg: RunSettings,
         reference: dict | None = None) -> tuple[RunSettings, Plan, object]:
    """Check the request and plan it; returns (settings to run with, plan, workspace); the
    plan holds the request (`InvestigateRequest`) its steps take theirs from. `reference` is
    given by the demo (its reference trials live in the same run); otherwise
    `reference=RUN` names one."""
    cfg = common.check_common(cfg)
    req = InvestigateRequest.of(cfg)
    parse_budget(cfg.budget)  # a bad budget= is refused before anything is written
    if reference is None and req.reference:
        reference = compare.load_reference(cfg, req.reference)
        cfg = evolve(cfg, repo=cfg.repo or reference.get("repo"))
    if reference is None and not (req.good and req.bad):
        raise UserError("investigate needs reference=RUN (an earlier run that measured the good"
                        " state) or good=REF bad=REF")
    ws = common.workspace(cfg)
    if reference is not None:
        base = reference["candidate"]
        ws.resolve(base.commit)
        if reference.get("run", True) and "adopted" not in reference:
            cfg, reference["adopted"] = compare.adopt_reference_config(cfg, reference,
                                                                       ws.resolve)
        if req.good and ws.resolve(req.good) != base.commit:
            raise UserError(f"the reference measured commit {base.commit[:12]}: the range starts"
                            f" there, so leave good= out (or give good={base.commit[:12]})")
    else:
        base = common.candidate(evolve(cfg, commit=req.good), ws)
    bad = ws.resolve(req.bad) if req.bad else base.commit
    commits, points, weights = [], [], None
    if bad != base.commit:
        commits = ws.commits_between(base.commit, bad, first_parent=req.first_parent)
        points = [dataclasses.replace(base, commit=c.sha) for c in commits]
        untouched = experiment_params.of(cfg).untouched_weight
        weights = bisect.prior_weights(commits, list(req.paths), ws, untouched)
        # its own checks, before anything is written
        bisect_strategy(req.bisect_step(base.commit, bad), experiment_params.of(cfg),
                        len(points), weights)
    sweep_plan = SweepRequest.of(cfg) if req.recover else None
    return cfg, Plan(reference, base, bad, commits, points, weights, sweep_plan, req), ws


def execute(cfg: RunSettings, ctl: Controller, run_dir: Path, p: Plan, ws, out,
            progress: Progress | None = None) -> tuple[dict, dict[str, dict]]:
    """Every step on a running controller (`investigate_steps.Steps`); returns the
    investigation's document (with its answer) and the steps' findings documents by
    experiment. At its `budget=` the answer so far; interrupted, the answer so far stored."""
    steps = Steps(cfg, ctl, run_dir, p, ws, out, progress)
    spent = False
    try:
        result = steps.run()
    except BudgetSpent as reached:  # the answer so far, and what finishing would cost
        result, spent = steps.at_budget(reached), True
    except (KeyboardInterrupt, RunInterrupted):
        steps.interrupted()
        raise
    ctl.before_restart = None  # the budget's check is over: evidence is not the run's search
    if not spent:
        why = investigate_answer.incomplete(steps.docs)
        if why:
            result = so_far(result, why=why, confidence=p.request.confidence)
        steps.kernels(result)
    return steps.document(result), steps.docs


def finish(cfg: RunSettings, run_dir: Path, store: RunStore, doc: dict, out) -> int:
    """Rank every step's findings into `findings.json`, write the report, print the answer."""
    from orchestrator.ui.report import write_report
    from orchestrator.ui.report.ranking import rank

    code = exit_code(doc["answer"])
    findings.write(run_dir, rank(investigate_steps.step_docs(run_dir), store.trials()))
    store.set_status("done" if code == 0 else "inconclusive")  # what the report shows
    _, files = write_report(run_dir)
    out.print("")
    print_answer(out, doc["answer"])
    out.print(f"report: {files.markdown}\nreport: {files.html}")
    return code


def run(cfg: RunSettings) -> int:
    cfg, p, ws = plan(cfg)
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    return _execute(cfg, run_dir, store, p, ws)


def resume(run_dir: Path) -> int:
    def prepare(cfg: RunSettings) -> tuple[RunSettings, tuple]:
        isolate.refuse_redacted(cfg, run_dir.name)
        if cfg.live.server:
            raise UserError(f"{run_dir.name} started from a running server (live=), which it"
                            " relaunched: start a new investigation")
        cfg, p, ws = plan(cfg)
        return cfg, (p, ws)

    store, cfg, (p, ws) = common.reopen_run(run_dir, "investigate", prepare)
    return _execute(cfg, run_dir, store, p, ws)


def _execute(cfg: RunSettings, run_dir: Path, store: RunStore, p: Plan, ws) -> int:
    out = render.console()
    with running(store, run_dir, out) as run:
        out.print(evidence_plan.cost_line(cfg.evidence, cfg.target))
        if p.reference is not None and p.reference.get("adopted"):
            out.print("measuring with the reference's settings: "
                      + ", ".join(p.reference["adopted"]))
        with Progress(out, done=store.trials()) as progress, \
                Controller(parts.control(cfg, space=p.sweep and p.sweep.space),
                           store, run_dir, on_event=progress.on_event) as ctl:
            doc, _ = execute(cfg, ctl, run_dir, p, ws, out, progress=progress)
        code = finish(cfg, run_dir, store, doc, out)
        run.status = "done" if code == 0 else "inconclusive"
        return code
