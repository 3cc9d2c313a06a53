"""`sleuth sweep`: search a space of settings for the fastest configuration, and rank the knobs.

    sleuth sweep repo=PATH space=nccl_pcie metric=output_throughput [direction=auto]
                 [trials=40] [nodes=K] [sampler=tpe|random|grid] [seed=S]
                 [experiment.params.KNOB=VALUE ...]   (knobs: `orchestrator/config/params.py`)

`trials` restarts search the space (the baseline first); then the best configuration is
re-measured against the baseline in interleaved rounds (3 to 16 rounds of 2 restarts, fewer when
the answer is clear early). Optuna's study is `runs/<id>/optuna.db` (view it with
`optuna-dashboard sqlite:///runs/<id>/optuna.db`). Resuming: `sleuth sweep run_id=RUN` or
`sleuth resume RUN` continues from both databases; no finished trial is run again.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator import answer
from orchestrator.answer.epochs import mark_system_change
from orchestrator.answer.headline import refresh
from orchestrator.answer.provisional import so_far
from orchestrator.commands import common, parts
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import SweepRequest
from orchestrator.config.settings import RunSettings, as_dict
from orchestrator.control.controller import Controller
from orchestrator.control.drive import observation
from orchestrator.errors import FAILURE, RunInterrupted, answer_exit
from orchestrator.records import Candidate
from orchestrator.run import findings
from orchestrator.run import sweep_findings as report
from orchestrator.run.rundir import running
from orchestrator.store import RunStore
from orchestrator.strategies.sweep import importance
from orchestrator.strategies.sweep.search import (
    SweepResult,
    SweepSearch,
    Work,
    parse_phase,
)
from orchestrator.strategies.sweep.study import make_sampler, open_study, storage_url
from orchestrator.system.watch import SystemWatch, system_changes
from orchestrator.ui import render
from orchestrator.ui.progress import Progress
from orchestrator.ui.report.terminal import print_answer

PLAN_FILE = "sweep.json"


def validate(cfg: RunSettings) -> SweepRequest:
    """Every check that needs no repository: the shared ones (`check_common`), then the
    sweep's own (`SweepRequest.of`: space, budget, knobs, sampler)."""
    common.check_common(cfg)
    return SweepRequest.of(cfg)


def run(cfg: RunSettings) -> int:
    if cfg.run_id and (cfg.runs_root / str(cfg.run_id)).exists():
        return resume(cfg.runs_root / str(cfg.run_id))
    cfg = common.check_common(cfg)
    req = SweepRequest.of(cfg)
    base = common.candidate(cfg, common.workspace(cfg))
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    (run_dir / PLAN_FILE).write_text(json.dumps({"base": base.to_json()}, indent=1) + "\n")
    return _execute(cfg, req, run_dir, store, base)


def resume(run_dir: Path) -> int:
    def prepare(cfg: RunSettings) -> tuple[RunSettings, tuple]:
        req = validate(cfg)
        base = Candidate.from_json(json.loads((run_dir / PLAN_FILE).read_text())["base"])
        return cfg, (req, base)

    store, cfg, (req, base) = common.reopen_run(run_dir, "sweep", prepare)
    return _execute(cfg, req, run_dir, store, base)


def _finished(store: RunStore, metric: str, final_attempt: int) -> list[tuple]:
    """(phase, candidate, value, suspect) of every stored restart that is evidence."""
    out = []
    for row in store.trials():
        o = observation(row, 0, metric, final_attempt) if row.finished else None
        if o is not None:
            out.append((row.phase or "", row.candidate, o.value, o.suspect))
    return out


def _progress_state(search: SweepSearch) -> tuple[str, str | None]:
    """(status, best so far) for the live progress line."""
    if search.search_over:
        keys = [k for k in (search.confirmation.keys or []) if k != search.baseline.key]
        return "confirming", search.configs[keys[0]].label if keys else None
    leaders = search.ranking()[:1]
    return "searching", leaders[0].label if leaders else None


def execute(cfg: RunSettings, req: SweepRequest, ctl: Controller, run_dir: Path,
            base: Candidate, out, progress: Progress | None = None,
            findings_name: str | None = None) -> tuple[SweepResult, dict]:
    """Run (or continue) the sweep on a running controller; returns the result and the
    findings document (the caller writes it: a run holding several experiments names it
    `findings_name`). Interrupted, it writes its answer so far there itself."""
    search = _open(cfg, req, ctl, run_dir, base, out, progress)
    try:
        _drive(ctl, search, req.metric, out, progress)
    except (KeyboardInterrupt, RunInterrupted):
        # What is known so far, stored before the run stops (`sleuth report` shows it).
        # Best effort: nothing here may turn a clean stop into a crash.
        try:
            doc = stopped_findings(ctl, search, req.metric, f"interrupted after {search.spent}"
                                   " restarts", req.confidence)
            findings.write(run_dir, doc, findings_name)
            if findings_name is None:  # its own run (an investigation says the whole answer)
                out.print("")
                print_answer(out, doc["answer"])
        except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
            out.print(f"(the answer so far could not be stored: {exc})")
        raise
    return _finish(cfg, ctl, search, req.metric, out)


def _open(cfg: RunSettings, req: SweepRequest, ctl: Controller, run_dir: Path,
          base: Candidate, out, progress: Progress | None) -> SweepSearch:
    """The search over its Optuna study (a resumed run's finished trials replayed)."""
    metric, space, settings = req.metric, req.space, req.search
    sampler = make_sampler(settings.sampler, space, seed=settings.seed,
                           budget=settings.budget, startup=settings.startup)
    study = open_study(name=ctl.store.run_id, storage=storage_url(run_dir), sampler=sampler,
                       maximize=settings.maximize)
    search = SweepSearch(space, study, base, as_dict(cfg.target), settings)
    search.replay(_finished(ctl.store, metric, ctl.retries + 1))
    out.print(f"sweeping {space.name} ({space.size() or 'continuous'} configurations) for "
              f"{'higher' if settings.maximize else 'lower'} {metric}: {settings.budget} search "
              f"trials, then up to {settings.confirm_reserve} confirming, on {len(ctl.nodes)} "
              f"node(s); study {storage_url(run_dir)}")
    if progress is not None:
        confirm = settings.confirm_min_rounds * (settings.confirm_top + 1)
        progress.set_total(settings.budget + confirm + len(ctl.store.trials()) - search.spent)
    return search


def _drive(ctl: Controller, search: SweepSearch, metric: str, out,
           progress: Progress | None) -> None:
    """Propose, run and record until the search is done."""
    final_attempt = ctl.retries + 1
    shown = len(search.events)
    watch = SystemWatch.primed(ctl.store.trials())  # changes among these were told then
    while not search.done:
        for work in search.propose(len(ctl.idle_nodes())):
            ctl.submit(work.candidate, phase=work.phase)
        if not ctl.in_flight():
            break
        for row in ctl.wait():
            change = watch.feed(row)
            if change is not None:
                (progress.note if progress is not None else out.print)(change.warning)
            if parse_phase(row.phase or "") is None:
                continue  # not one of ours (a controller shared with another experiment)
            o = observation(row, 0, metric, final_attempt)
            work = Work(row.candidate, row.phase or "")
            if o is None:
                search.record(work, None, evidence=False)
            else:
                search.record(work, o.value, suspect=o.suspect)
        for event in search.events[shown:]:
            out.print(f"  {event}")
        shown = len(search.events)
        if progress is not None:
            progress.on_verdict(*_progress_state(search), None)


def _finish(cfg: RunSettings, ctl: Controller, search: SweepSearch, metric: str,
            out) -> tuple[SweepResult, dict]:
    """The result, its findings document with the answer, printed."""
    result = search.result()
    importances = importance.of_search(search, experiment_params.of(cfg).importance)
    rows = ctl.store.trials()
    doc = report.sweep_findings(run_id=ctl.store.run_id, metric=metric, search=search,
                                result=result, importances=importances, rows=rows)
    system = system_changes(rows)
    doc["system_changes"] = [c.to_json() for c in system]
    doc["answer"] = answer.for_sweep(doc)
    if system:  # one system per comparison: the confirmation may mix two
        refresh(mark_system_change(doc["answer"], doc["system_changes"]))
    out.print(report.leaders_table(search, metric))
    if importances.values:
        out.print(report.importance_table(importances))
    elif importances.note:
        out.print(f"parameter importance ({importances.evaluator}): {importances.note}")
    out.print(render.findings_table(doc))
    out.print(result.message)
    for change in system:
        out.print(change.warning)
    return result, doc


def stopped_findings(ctl: Controller, search: SweepSearch, metric: str, why: str,
                     confidence: float) -> dict:
    """The findings of a sweep stopped before its end, with its answer so far: the confirmed
    best when the confirmation had begun, else the search's leading configuration against
    the baseline's search restarts, said as not confirmed (a better setting, never a
    cause). No parameter importance: that is the finished search's."""
    rows = ctl.store.trials()
    result = search.result()
    doc = report.sweep_findings(run_id=ctl.store.run_id, metric=metric, search=search,
                                result=result, rows=rows,
                                importances=importance.Importances("none", {}, why))
    doc["system_changes"] = [c.to_json() for c in system_changes(rows)]
    doc["answer"] = answer.for_sweep(doc)
    leaders, base = search.ranking()[:1], search.baseline
    if not doc["answer"]["settings"] and leaders and base.mean():
        lead = leaders[0]
        doc["answer"]["sentence"] = (
            f"leading configuration of the search: {lead.label}: {metric}"
            f" {100.0 * (lead.mean() / base.mean() - 1.0):+.1f}% against the baseline"
            f" ({len(lead.search)} and {len(base.search)} search restarts, not confirmed)")
    elif not doc["answer"]["settings"]:
        doc["answer"]["sentence"] = ""
    doc["answer"] = so_far(doc["answer"], why=why, searching=False, confidence=confidence,
                           keep_sentence=True)
    doc["provisional"] = doc["answer"]["provisional"]
    return doc


def _execute(cfg: RunSettings, req: SweepRequest, run_dir: Path, store: RunStore,
             base: Candidate) -> int:
    out = render.console()
    with running(store, run_dir, out) as run:
        with Progress(out, done=store.trials()) as progress, \
                Controller(parts.control(cfg, space=req.space),
                           store, run_dir, on_event=progress.on_event) as ctl:
            result, doc = execute(cfg, req, ctl, run_dir, base, out, progress=progress)
        out.print(f"findings: {findings.write(run_dir, doc)}")
        print_answer(out, doc.get("answer"))
        if result.status == "no_data":
            return FAILURE  # the run stays "failed"
        code = answer_exit(doc.get("answer"))
        run.status = "done" if code == 0 else "inconclusive"
        return code
