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
import json
from pathlib import Path

from orchestrator.answer.provisional import so_far
from orchestrator.commands import (
    bisect,
    common,
    compare,
    investigate_answer,
    investigate_plan,
    investigate_release,
    isolate,
    sweep,
)
from orchestrator.commands.final_check import final_check
from orchestrator.commands.investigate_answer import Plan
from orchestrator.config import params as experiment_params
from orchestrator.config.bisect import bisect_strategy
from orchestrator.config.requests import CompareRequest, InvestigateRequest, SweepRequest
from orchestrator.config.settings import RunSettings, evolve
from orchestrator.control.controller import Controller
from orchestrator.errors import RunInterrupted, UserError, answer_exit
from orchestrator.evidence import collect as evidence
from orchestrator.evidence import plan as evidence_plan
from orchestrator.records import Candidate
from orchestrator.reference import record as log_record
from orchestrator.run import findings
from orchestrator.run.plan import BudgetSpent, parse_budget
from orchestrator.run.rundir import create_run, pin_run, running
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
    """Every step on a running controller; returns the investigation's document (with its
    answer) and the steps' findings documents by experiment."""
    req = p.request
    docs: dict[str, dict] = {}
    marks: dict[str, int] = {}  # the first trial id of each step, for a node that changes

    def mark(step: str) -> None:
        marks[step] = max((r.id for r in ctl.store.trials()), default=0) + 1

    ref = p.reference
    step = ["start"]
    yardstick: dict | None = None
    planned = investigate_plan.start(cfg, ctl, run_dir, p, out)
    planned.marks = marks
    spent: BudgetSpent | None = None
    try:
        if ref is not None:
            step[0] = "compare"
            out.print("\n== the reference, re-measured now ==")
            mark("compare")
            earlier = compare.finished(run_dir)
            if earlier is not None:  # a resumed run: the compare finished before
                docs["compare"] = earlier
                out.print(f"the compare finished before: {docs['compare']['message']}")
            else:
                # the compare keeps its own budget: max_trials is the bisect's and the isolate's
                docs["compare"] = compare.execute(
                    cfg, CompareRequest.step(cfg, max_trials=None), ctl, run_dir, ref, out,
                    findings_name="compare", progress=progress)
            investigate_plan.after_compare(planned, cfg, docs["compare"], ctl.store.trials(), out)
            if docs["compare"]["verdict"] in ("not_reproduced", "unresolved"):
                step[0] = "isolate"
                out.print("\n== the system: which differences cause it ==")
                if docs["compare"]["verdict"] == "unresolved":
                    out.print(isolate.undecided_compare(docs["compare"]))
                mark("isolate")
                isolated = isolate.isolate_system(cfg, req.isolate_step(), ctl, run_dir, ref,
                                                  docs["compare"], ws.resolve, out, progress)
                if isolated is not None:
                    docs["isolate"] = isolated[1]
                    p.recreated = recreated(ref, req.metric, docs["isolate"])
                    found = investigate_release.follow(cfg, req, ctl, run_dir, docs["isolate"],
                                                       out, progress)
                    if found is not None:  # the isolate's package cause now names the release
                        docs["release"] = found
                investigate_plan.after_step(planned, "isolate", ctl.store.trials(), out)
        if p.commits:
            step[0] = "bisect"
            out.print("\n== the code: bisect the range under today's system ==")
            mark("bisect")
            yardstick = investigate_answer.code_yardstick(cfg, ctl.store.trials(), p,
                                                          docs.get("compare"))
            if yardstick is not None:
                out.print(yardstick["line"])
            for line in investigate_plan.reuse_lines(ctl.store.trials(), [p.base.key], marks,
                                                     "bisect", "its good end"):
                out.print(line)
            _, docs["bisect"] = bisect.execute(
                cfg, req.bisect_step(p.base.commit, p.bad), ctl, run_dir, p.commits, p.points, p.weights, out, findings_name="bisect",
                progress=progress, reference=yardstick["level"] if yardstick else None)
        if p.sweep is not None:
            step[0] = "sweep"
            out.print("\n== recover: a short sweep on the bad commit as the node is now ==")
            mark("sweep")
            _, docs["sweep"] = sweep.execute(cfg, p.sweep, ctl, run_dir, p.bad_candidate, out,
                                             progress=progress, findings_name="sweep")
            findings.write(run_dir, docs["sweep"], "sweep")
        if p.commits:
            investigate_plan.after_step(planned, "bisect", ctl.store.trials(), out)
        step[0] = "final check"
        both = p.reference is None and p.bad_candidate.key != p.base.key
        first = p.recreated if p.recreated is not None else p.base
        both = both or p.recreated is not None
        result = final_check(
            ctl, [first, p.bad_candidate] if both else [p.bad_candidate],
            lambda rows, check: investigate_answer.answer(cfg, rows, p, docs, ws, check,
                                                          marks=marks, yardstick=yardstick),
            experiment_params.of(cfg).final_trials, out, progress, metric=req.metric)
    except BudgetSpent as reached:  # the answer so far, and what finishing would cost
        spent = reached
        out.print(f"\n{reached.why}: the answer so far")
        read_stored(run_dir, docs)  # the interrupted step stored its findings so far
        result = investigate_plan.at_budget(
            investigate_answer.answer(cfg, ctl.store.trials(), p, docs, ws, marks=marks,
                                      yardstick=yardstick),
            planned, ctl.store.trials(), reached.why, req.confidence)
    except (KeyboardInterrupt, RunInterrupted):
        try:  # best effort: nothing here may turn a clean stop into a crash
            done = sum(1 for r in ctl.store.trials() if r.finished)
            stopped(cfg, ctl, run_dir, p, docs, ws, out,
                    f"interrupted during the {step[0]} after {done} restarts", marks=marks,
                    yardstick=yardstick)
        except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
            out.print(f"(the answer so far could not be stored: {exc})")
        raise
    why = investigate_answer.incomplete(docs)
    if why and spent is None:
        result = so_far(result, why=why, confidence=req.confidence)
    ctl.before_restart = None
    if evidence_plan.kernels_enabled(cfg) and result.get("causes") and spent is None:
        out.print("\n== kernel evidence: each named cause's two sides, profiled ==")
        result["evidence"] = evidence.for_causes(
            ctl, result["causes"], p.bad_candidate, p.base,
            [docs.get("bisect"), docs.get("isolate")], ws.resolve,
            restarts=cfg.evidence.restarts, max_causes=cfg.evidence.max_causes,
            say=out.print, attribution=result.get("attribution"))
    rows = ctl.store.trials()
    doc = {"run": ctl.store.run_id, "experiment": "investigate", "metric": req.metric,
           "verdict": result["status"], "message": result["sentence"], "findings": [],
           "steps": list(docs), "n_trials": len(rows), "answer": result}
    findings.write(run_dir, doc, "investigate")
    return doc, docs


def recreated(ref: dict, metric: str, isolate_doc: dict) -> Candidate | None:
    """The isolate's recreation of the reference's configuration, when the reference holds no
    level of `metric` (an old log that never printed it): "then" is measured now instead."""
    ends = isolate_doc.get("ends") or {}
    if not ends.get("good") or log_record.no_level(ref, metric) is None:
        return None
    return Candidate.from_json(ends["good"])


def stopped(cfg: RunSettings, ctl: Controller, run_dir: Path, p: Plan, docs: dict[str, dict],
            ws, out, why: str, *, marks: dict[str, int] | None = None,
            yardstick: dict | None = None) -> None:
    """An interrupted investigation stores and says its answer as far as it is known: the
    steps that finished, a bisect's provisional findings, the trials so far."""
    from orchestrator.ui.report.ranking import rank

    read_stored(run_dir, docs)
    rows = ctl.store.trials()
    # Where a search stopped mid-way points: the range's bisect, else the release search
    pointing = next((lead for name in ("bisect", "release")
                     if (lead := ((docs.get(name) or {}).get("provisional") or {})
                         .get("leading"))), "")
    now = investigate_answer.answer(cfg, rows, p, docs, ws, marks=marks, yardstick=yardstick)
    result = so_far(now, why=why, confidence=p.request.confidence, leading=pointing)
    doc = {"run": ctl.store.run_id, "experiment": "investigate", "metric": p.request.metric,
           "verdict": result["status"], "message": result["sentence"], "findings": [],
           "steps": list(docs), "n_trials": len(rows), "answer": result,
           "provisional": result["provisional"]}
    findings.write(run_dir, doc, "investigate")
    findings.write(run_dir, rank(step_docs(run_dir), rows))
    out.print("")
    print_answer(out, result)


def read_stored(run_dir: Path, docs: dict[str, dict]) -> None:
    """The findings a step stored before the run stopped, for the steps `docs` lacks."""
    for name in ("compare", "isolate", "release", "bisect", "sweep"):
        path = run_dir / f"findings-{name}.json"
        if name not in docs and path.exists():
            docs[name] = json.loads(path.read_text())


def step_docs(run_dir: Path) -> list[dict]:
    """Every step's findings document (`findings-<step>.json`), the investigation's own among
    them. Not `findings.json`: an interrupted run wrote one with its answer so far, and ranked
    again after a resume its old documents would come first."""
    docs = []
    for path in sorted(run_dir.glob("findings-*.json")):
        try:
            docs.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue  # a damaged step document is left out, as the report does
    return docs


def finish(cfg: RunSettings, run_dir: Path, store: RunStore, doc: dict, out) -> int:
    """Rank every step's findings into `findings.json`, write the report, print the answer."""
    from orchestrator.ui.report import write_report
    from orchestrator.ui.report.ranking import rank

    code = exit_code(doc["answer"])
    findings.write(run_dir, rank(step_docs(run_dir), store.trials()))
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
        out.print(evidence_plan.cost_line(cfg))
        if p.reference is not None and p.reference.get("adopted"):
            out.print("measuring with the reference's settings: "
                      + ", ".join(p.reference["adopted"]))
        with Progress(out, done=store.trials()) as progress, \
                Controller(cfg, store, run_dir, on_event=progress.on_event) as ctl:
            doc, _ = execute(cfg, ctl, run_dir, p, ws, out, progress=progress)
        code = finish(cfg, run_dir, store, doc, out)
        run.status = "done" if code == 0 else "inconclusive"
        return code
