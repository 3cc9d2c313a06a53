"""`sleuth investigate`: "it was 19 ms, now it is 29 ms: why?" in one command, one answer.

    sleuth investigate repo=PATH reference=RUN [bad=REF] [metric=verify_ms] [nodes=K]
                       [recover=true] [max_trials=N]
    sleuth investigate repo=PATH good=REF bad=REF [metric=verify_ms] [nodes=K]

With a reference (a run that measured the good state, e.g. `sleuth trial commit=GOOD
restarts=3`, or a fingerprint JSON), sleuth re-measures the reference's whole candidate now
(`compare`). If it no longer reproduces, part of the cause is at the system level: the
fingerprint diff is ranked by mechanism and its controllable differences are tested
(`isolate`). When `bad` is another commit than the reference's, the range between them is
bisected too, under today's system (`bisect`). `recover=true` ends with a short sweep of
`space` (default `nccl_quick`) on the bad commit as the node is now. Then one answer: the total
change from the reference (then) to the bad commit (now) on the log scale, each named cause with
its interval, and what they leave unexplained (:mod:`orchestrator.answer`), after a final check
that measures the endpoints interleaved until the remainder's interval decides
(:func:`final_check`). Exit 0 when the remainder lies within the run's min effect (explained)
or nothing is reproducibly slower ("no change larger than x%"); 3 when a remainder larger than
the min effect is shown, or the final check's budget ran out undecided (the sentence says so).

Without a reference, `good=REF bad=REF` bisects; when the range does not reproduce today, the
cause is not in the code, and the answer names earlier runs in `runs_dir` that measured the
good commit, with the `reference=` command that continues from there.

One run directory; `sleuth resume RUN` continues an interrupted investigation, reusing every
finished trial (a finished compare is not repeated; the isolate and the bisect replay theirs).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator.answer.combine import LogChange
from orchestrator.answer.compose import for_investigation
from orchestrator.answer.phases import log_change, mechanism
from orchestrator.answer.provisional import so_far
from orchestrator.answer.text import commit_label
from orchestrator.commands import bisect, common, compare, isolate, sweep
from orchestrator.commands.final_check import FINAL_PHASE, final_check, refreshed
from orchestrator.config import params as experiment_params
from orchestrator.config.bisect import bisect_strategy
from orchestrator.control.controller import Controller
from orchestrator.errors import RunInterrupted, UserError
from orchestrator.metrics import check_metric
from orchestrator.records import Candidate
from orchestrator.run import findings
from orchestrator.run.rundir import create_run, running
from orchestrator.store import RunStore
from orchestrator.ui import render
from orchestrator.ui.progress import Progress
from orchestrator.ui.report.terminal import print_answer
from orchestrator.workspace import CommitInfo

EXIT_INCONCLUSIVE = 3


@dataclass
class Plan:
    """What an investigation measures, worked out before anything is written."""

    reference: dict | None  # compare.load_reference's record, or None (good=REF bad=REF)
    base: Candidate  # the good state's candidate (the reference's own, or good= as given)
    bad: str  # the bad commit's SHA
    commits: list[CommitInfo]  # the range good..bad (empty when bad is the same commit)
    points: list[Candidate]
    weights: list[float] | None
    sweep: tuple | None  # (space, settings) with recover=true

    @property
    def bad_candidate(self) -> Candidate:
        return self.points[-1] if self.points else self.base


def plan(cfg: DictConfig, reference: dict | None = None) -> tuple[Plan, object]:
    """Check the request and plan it; returns (plan, workspace). `reference` is given by the
    demo (its reference trials live in the same run); otherwise `cfg.reference` names one."""
    common.check_common(cfg)
    check_metric(str(cfg.metric), custom=cfg.target.name == "command", target=cfg.target)
    if not 0.5 < float(cfg.confidence) < 1.0:
        raise UserError(f"confidence must be between 0.5 and 1 (exclusive), got {cfg.confidence}")
    if cfg.max_trials is not None and int(cfg.max_trials) < 4:
        raise UserError(f"max_trials must be at least 4 (got {cfg.max_trials})")
    for side in ("good", "bad"):
        if cfg.get(side) is not None and not isinstance(cfg[side], str | int):
            raise UserError(f"investigate takes refs ({side}=REF); candidate specs such as"
                            f" {side}.commit=... are for sleuth isolate")
    if reference is None and cfg.reference:
        reference = compare.load_reference(cfg, str(cfg.reference))
        cfg.repo = cfg.repo or reference.get("repo")
    if reference is None and not (cfg.good and cfg.bad):
        raise UserError("investigate needs reference=RUN (an earlier run that measured the good"
                        " state) or good=REF bad=REF")
    ws = common.workspace(cfg)
    if reference is not None:
        base = reference["candidate"]
        ws.resolve(base.commit)
        if reference.get("run", True) and "adopted" not in reference:
            reference["adopted"] = compare.adopt_reference_config(cfg, reference, ws.resolve)
        if cfg.good and ws.resolve(str(cfg.good)) != base.commit:
            raise UserError(f"the reference measured commit {base.commit[:12]}: the range starts"
                            f" there, so leave good= out (or give good={base.commit[:12]})")
    else:
        base = common.candidate(OmegaConf.merge(cfg, {"commit": str(cfg.good)}), ws)
    bad = ws.resolve(str(cfg.bad)) if cfg.bad else base.commit
    commits, points, weights = [], [], None
    if bad != base.commit:
        commits = ws.commits_between(base.commit, bad, first_parent=bool(cfg.first_parent))
        points = [dataclasses.replace(base, commit=c.sha) for c in commits]
        untouched = experiment_params.of(cfg).untouched_weight
        weights = bisect.prior_weights(commits, list(cfg.paths), ws, untouched)
        bisect_strategy(cfg, len(points), weights)  # its own checks, before anything is written
    sweep_plan = sweep.validate_inside(cfg) if cfg.recover else None
    return Plan(reference, base, bad, commits, points, weights, sweep_plan), ws


def _step_cfg(cfg: DictConfig, **changes) -> DictConfig:
    """The settings one step runs with: `max_trials` is the bisect's and the isolate's budget,
    the compare keeps its own."""
    return OmegaConf.merge(cfg, changes)


def _label(cand: Candidate, commits: list[CommitInfo], ws) -> str:
    subject = next((c.subject for c in commits if c.sha == cand.commit), None)
    if subject is None:
        try:
            subject = ws.commit_info(cand.commit).subject
        except UserError:  # a label without a subject is still a label
            subject = None
    return commit_label(cand.commit, subject)


def _whole(cfg: DictConfig, rows, p: Plan) -> tuple[LogChange | None, dict]:
    """The change to explain: the bad commit now against the reference then (or, without a
    reference, the good and the bad commit now), pooling the run's restart noise.

    Without a reference both endpoints are measured now, and the change is read from the final
    check's restarts alone once it has two of each (:func:`final_check`): they ran interleaved,
    in one time window, so a host that got busier while the bisect ran (the good endpoint
    measured in the first minutes, the bad one an hour later) cannot invent a change."""
    metric = str(cfg.metric)
    bad_key = p.bad_candidate.key
    after = findings.trial_values(rows, bad_key, metric)
    window = ""
    if p.reference is not None:
        before = list(p.reference["values"].get(metric, []))
    else:
        before = findings.trial_values(rows, p.base.key, metric)
        last = [r for r in rows if r.phase == FINAL_PHASE]
        a, b = (findings.trial_values(last, key, metric) for key in (p.base.key, bad_key))
        if min(len(a), len(b)) >= 2:
            before, after, window = a, b, "final check"
    ss, df = findings.pooled_log_ss(rows, metric, (p.base.key, bad_key))
    change = log_change(before, after, ss, df) if before and after else None
    extra = {"before": sum(before) / len(before) if before else None,
             "after": sum(after) / len(after) if after else None,
             "n": [len(before), len(after)]}
    if window:
        extra["window"] = window
    return change, extra


def _mechanism(rows, p: Plan) -> dict:
    bad_key = p.bad_candidate.key
    after = findings.side_values(rows, bad_key)
    if p.reference is not None:
        before = p.reference["values"]
        before_tel = p.reference.get("telemetry") or []
        label = "reference"
    else:
        before = findings.side_values(rows, p.base.key)
        before_tel = findings.side_telemetry(rows, p.base.key)
        label = "good"
    return mechanism(before, after, before_tel, findings.side_telemetry(rows, bad_key),
                     before_label=label, after_label="now")


def execute(cfg: DictConfig, ctl: Controller, run_dir: Path, p: Plan, ws, out,
            progress: Progress | None = None) -> tuple[dict, dict[str, dict]]:
    """Every step on a running controller; returns the investigation's document (with its
    answer) and the steps' findings documents by experiment."""
    docs: dict[str, dict] = {}
    ref = p.reference
    step = ["start"]
    try:
        if ref is not None:
            step[0] = "compare"
            out.print("\n== the reference, re-measured now ==")
            done = run_dir / "findings-compare.json"
            if done.exists():  # a resumed run: the compare finished before
                docs["compare"] = json.loads(done.read_text())
                out.print(f"the compare finished before: {docs['compare']['message']}")
            else:
                docs["compare"] = compare.execute(_step_cfg(cfg, max_trials=None), ctl, run_dir,
                                                  ref, out, findings_name="compare",
                                                  progress=progress)
            if docs["compare"]["verdict"] == "not_reproduced":
                step[0] = "isolate"
                out.print("\n== the system: which differences cause it ==")
                isolated = isolate.isolate_system(cfg, ctl, run_dir, ref, docs["compare"],
                                                  ws.resolve, out, progress)
                if isolated is not None:
                    docs["isolate"] = isolated[1]
        if p.commits:
            step[0] = "bisect"
            out.print("\n== the code: bisect the range under today's system ==")
            _, docs["bisect"] = bisect.execute(cfg, ctl, run_dir, p.commits, p.points,
                                               p.weights, out, findings_name="bisect",
                                               progress=progress)
        if p.sweep is not None:
            step[0] = "sweep"
            out.print("\n== recover: a short sweep on the bad commit as the node is now ==")
            space, settings = p.sweep
            _, docs["sweep"] = sweep.execute(cfg, ctl, run_dir, space, settings,
                                             p.bad_candidate, out, progress=progress)
            findings.write(run_dir, docs["sweep"], "sweep")
        step[0] = "final check"
        both = p.reference is None and p.bad_candidate.key != p.base.key
        result = final_check(
            ctl, [p.base, p.bad_candidate] if both else [p.bad_candidate],
            lambda rows, check: answer(cfg, rows, p, docs, ws, check),
            experiment_params.of(cfg).final_trials, out, progress, metric=str(cfg.metric))
    except (KeyboardInterrupt, RunInterrupted):
        try:  # best effort: nothing here may turn a clean stop into a crash
            done = sum(1 for r in ctl.store.trials() if r.finished)
            stopped(cfg, ctl, run_dir, p, docs, ws, out,
                    f"interrupted during the {step[0]} after {done} restarts")
        except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
            out.print(f"(the answer so far could not be stored: {exc})")
        raise
    why = incomplete(docs)
    if why:
        result = so_far(result, why=why, confidence=float(cfg.confidence))
    rows = ctl.store.trials()
    doc = {"run": ctl.store.run_id, "experiment": "investigate", "metric": str(cfg.metric),
           "verdict": result["status"], "message": result["sentence"], "findings": [],
           "steps": list(docs), "n_trials": len(rows), "answer": result}
    findings.write(run_dir, doc, "investigate")
    return doc, docs


def incomplete(docs: dict[str, dict]) -> str | None:
    """Why the answer is only as far as known: a step that stopped at its budget or cap."""
    b, i = docs.get("bisect") or {}, docs.get("isolate") or {}
    if b.get("verdict") == "budget_exhausted":
        return f"the bisect stopped: {b['answer']['provisional']['why']}" if (
            b.get("answer") or {}).get("provisional") else "the bisect's budget was spent"
    if i.get("verdict") in ("budget_exhausted", "inconclusive"):
        return f"the isolate stopped at its {'budget' if i['verdict'] == 'budget_exhausted' else 'cap'}"
    return None


def stopped(cfg: DictConfig, ctl: Controller, run_dir: Path, p: Plan, docs: dict[str, dict],
            ws, out, why: str) -> None:
    """An interrupted investigation stores and says its answer as far as it is known: the
    steps that finished, a bisect's provisional findings, the trials so far."""
    from orchestrator.ui.report.ranking import rank

    for name in ("compare", "isolate", "bisect", "sweep"):
        path = run_dir / f"findings-{name}.json"
        if name not in docs and path.exists():
            docs[name] = json.loads(path.read_text())
    rows = ctl.store.trials()
    pointing = ((docs.get("bisect") or {}).get("provisional") or {}).get("leading") or ""
    result = so_far(answer(cfg, rows, p, docs, ws), why=why, confidence=float(cfg.confidence),
                    leading=pointing)
    doc = {"run": ctl.store.run_id, "experiment": "investigate", "metric": str(cfg.metric),
           "verdict": result["status"], "message": result["sentence"], "findings": [],
           "steps": list(docs), "n_trials": len(rows), "answer": result,
           "provisional": result["provisional"]}
    findings.write(run_dir, doc, "investigate")
    findings.write(run_dir, rank(step_docs(run_dir), rows))
    out.print("")
    print_answer(out, result)


def answer(cfg: DictConfig, rows, p: Plan, docs: dict[str, dict], ws,
           check: dict | None = None) -> dict:
    """The investigation's answer from the trials so far and the steps' documents."""
    whole, extra = _whole(cfg, rows, p)
    bad_label = _label(p.bad_candidate, p.commits, ws) + " now"
    if p.reference is not None:
        start = f"the reference ({_label(p.base, p.commits, ws)}, then)"
    else:
        start = _label(p.base, p.commits, ws) + " now"
    metric = str(cfg.metric)
    return for_investigation(
        metric, whole, whole_extra=extra, reference=start, bad=bad_label,
        compare_doc=docs.get("compare"), isolate_doc=refreshed(docs.get("isolate"), rows, metric),
        bisect_doc=refreshed(docs.get("bisect"), rows, metric), sweep_doc=docs.get("sweep"),
        mechanism=_mechanism(rows, p), next_step=_next_step(cfg, p, docs),
        min_effect_pct=experiment_params.of(cfg).min_effect_pct, check=check)


def _next_step(cfg: DictConfig, p: Plan, docs: dict[str, dict]) -> str:
    """Without a reference, a range that does not reproduce sends the user to the system:
    name earlier runs that measured the good commit, and the command that continues."""
    if p.reference is not None or (docs.get("bisect") or {}).get("verdict") != "not_reproducible":
        return ""
    repo, bad = cfg.repo, str(cfg.bad)
    found = reference_runs(Path(str(cfg.runs_dir)), p.base.commit, exclude=str(cfg.run_id))
    if found:
        return (f"runs that measured {p.base.commit[:12]} earlier: {', '.join(found)}; to test"
                f" the system: sleuth investigate repo={repo} reference={found[0]} bad={bad}")
    return (f"no earlier run in {cfg.runs_dir} measured {p.base.commit[:12]}; with one (or a"
            f" fingerprint JSON of the good state): sleuth investigate repo={repo}"
            f" reference=RUN bad={bad}")


def reference_runs(root: Path, sha: str, *, exclude: str = "", limit: int = 3,
                   scan: int = 200) -> list[str]:
    """The most recent runs under `root` with a measured trial of commit `sha`."""
    found: list[str] = []
    try:
        dirs = sorted((d for d in root.iterdir() if (d / "trials.db").is_file()
                       and d.name != exclude), key=lambda d: d.stat().st_mtime, reverse=True)
    except OSError:
        return found
    for d in dirs[:scan]:
        try:
            store = RunStore.open(d / "trials.db", readonly=True)
        except Exception:  # noqa: BLE001 - a damaged or foreign store is simply not a match
            continue
        try:
            if any(r.candidate.commit == sha and r.outcome is not None and r.outcome.measured
                   for r in store.trials()):
                found.append(d.name)
        except Exception:  # noqa: BLE001
            pass
        finally:
            store.close()
        if len(found) >= limit:
            break
    return found


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


def finish(cfg: DictConfig, run_dir: Path, store: RunStore, doc: dict, out) -> int:
    """Rank every step's findings into `findings.json`, write the report, print the answer."""
    from orchestrator.ui.report import write_report
    from orchestrator.ui.report.ranking import rank

    code = 0 if doc["answer"].get("explains") else EXIT_INCONCLUSIVE
    findings.write(run_dir, rank(step_docs(run_dir), store.trials()))
    store.set_status("done" if code == 0 else "inconclusive")  # what the report shows
    _, files = write_report(run_dir)
    out.print("")
    print_answer(out, doc["answer"])
    out.print(f"report: {files.markdown}\nreport: {files.html}")
    return code


def run(cfg: DictConfig) -> int:
    p, ws = plan(cfg)
    run_dir, store = create_run(cfg)
    return _execute(cfg, run_dir, store, p, ws)


def resume(run_dir: Path) -> int:
    store = RunStore.open(run_dir / "trials.db")
    try:
        if store.command != "investigate":
            raise UserError(f"{run_dir.name} is not an investigate run")
        cfg = OmegaConf.create(store.config_yaml())
        isolate.refuse_redacted(cfg, run_dir.name)
        p, ws = plan(cfg)
    except BaseException:
        store.close()
        raise
    store.interrupt_unfinished()
    render.console().print(common.resume_notice(run_dir, store))
    store.set_status("running")
    return _execute(cfg, run_dir, store, p, ws)


def _execute(cfg: DictConfig, run_dir: Path, store: RunStore, p: Plan, ws) -> int:
    out = render.console()
    with running(store, run_dir, out) as run:
        if p.reference is not None and p.reference.get("adopted"):
            out.print("measuring with the reference's settings: "
                      + ", ".join(p.reference["adopted"]))
        with Progress(out) as progress, \
                Controller(cfg, store, run_dir, on_event=progress.on_event) as ctl:
            doc, _ = execute(cfg, ctl, run_dir, p, ws, out, progress=progress)
        code = finish(cfg, run_dir, store, doc, out)
        run.status = "done" if code == 0 else "inconclusive"
        return code
