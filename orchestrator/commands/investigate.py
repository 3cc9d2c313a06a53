"""`sleuth investigate`: "it was 19 ms, now it is 29 ms: why?" in one command, one answer.

    sleuth investigate repo=PATH reference=RUN [bad=REF] [metric=verify_ms] [nodes=K]
                       [recover=true] [max_trials=N]
    sleuth investigate repo=PATH good=REF bad=REF [metric=verify_ms] [nodes=K]

With a reference (a run that measured the good state, e.g. `sleuth trial commit=GOOD
restarts=3`, or a fingerprint JSON), sleuth re-measures the reference's whole candidate now
(`compare`). If it no longer reproduces, part of the cause is at the system level: the
fingerprint diff is ranked by mechanism and its controllable differences are tested
(`isolate`). When `bad` is another commit than the reference's, the range between them is
bisected too, under today's system (`bisect`); when the system changed, the range is judged
against the change left once the system's part is taken out (:func:`code_yardstick`), so a
commit smaller than the system causes beside it is still found. `recover=true` ends with a short sweep of
`space` (default `nccl_quick`) on the bad commit as the node is now. Then one answer: the total
change from the reference (then) to the bad commit (now) on the log scale, each named cause with
its interval, and what they leave unexplained (:mod:`orchestrator.answer`). Exit 0 when the
named causes explain the change within its interval, 3 otherwise (the answer says what is left).

Without a reference, `good=REF bad=REF` bisects; when the range does not reproduce today, the
cause is not in the code, and the answer names earlier runs in `runs_dir` that measured the
good commit, with the `reference=` command that continues from there.

One run directory; `sleuth resume RUN` continues an interrupted investigation, reusing every
finished trial (a finished compare is not repeated; the isolate and the bisect replay theirs).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator.answer.combine import LogChange
from orchestrator.answer.compose import for_investigation
from orchestrator.answer.epochs import mark_system_change
from orchestrator.answer.phases import log_change, mechanism
from orchestrator.answer.text import commit_label
from orchestrator.commands import (
    bisect,
    common,
    compare,
    investigate_release,
    isolate,
    next_step,
    sweep,
)
from orchestrator.config import params as experiment_params
from orchestrator.config.bisect import bisect_strategy
from orchestrator.control.controller import Controller
from orchestrator.errors import UserError
from orchestrator.evidence import collect as evidence
from orchestrator.evidence import plan as evidence_plan
from orchestrator.metrics import check_metric
from orchestrator.records import Candidate
from orchestrator.run import findings
from orchestrator.run.rundir import create_run, running, runs_root
from orchestrator.store import RunStore
from orchestrator.system.watch import latest_epoch, system_changes
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
    reference, the bisect's endpoints now), pooling the run's restart noise."""
    metric = str(cfg.metric)
    bad_key = p.bad_candidate.key
    after = findings.trial_values(rows, bad_key, metric)
    if p.reference is not None:
        before = list(p.reference["values"].get(metric, []))
    else:
        before = findings.trial_values(rows, p.base.key, metric)
    ss, df = findings.pooled_log_ss(rows, metric, (p.base.key, bad_key))
    change = log_change(before, after, ss, df) if before and after else None
    extra = {"before": sum(before) / len(before) if before else None,
             "after": sum(after) / len(after) if after else None,
             "n": [len(before), len(after)]}
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
    marks: dict[str, int] = {}  # the first trial id of each step, for a node that changes

    def mark(step: str) -> None:
        marks[step] = max((r.id for r in ctl.store.trials()), default=0) + 1

    ref = p.reference
    if ref is not None:
        out.print("\n== the reference, re-measured now ==")
        mark("compare")
        done = run_dir / "findings-compare.json"
        if done.exists():  # a resumed run: the compare finished before
            docs["compare"] = json.loads(done.read_text())
            out.print(f"the compare finished before: {docs['compare']['message']}")
        else:
            docs["compare"] = compare.execute(_step_cfg(cfg, max_trials=None), ctl, run_dir, ref,
                                              out, findings_name="compare", progress=progress)
        if docs["compare"]["verdict"] == "not_reproduced":
            out.print("\n== the system: which differences cause it ==")
            mark("isolate")
            result = isolate.isolate_system(cfg, ctl, run_dir, ref, docs["compare"], ws.resolve,
                                            out, progress)
            if result is not None:
                docs["isolate"] = result[1]
                found = investigate_release.follow(cfg, ctl, run_dir, docs["isolate"], out,
                                                   progress)
                if found is not None:  # the isolate's package cause now names the release
                    docs["release"] = found
    yardstick = None
    if p.commits:
        out.print("\n== the code: bisect the range under today's system ==")
        mark("bisect")
        yardstick = code_yardstick(cfg, ctl.store.trials(), p, docs.get("compare"))
        if yardstick is not None:
            out.print(yardstick["line"])
        _, docs["bisect"] = bisect.execute(
            cfg, ctl, run_dir, p.commits, p.points, p.weights, out, findings_name="bisect",
            progress=progress, reference=yardstick["level"] if yardstick else None)
    if p.sweep is not None:
        out.print("\n== recover: a short sweep on the bad commit as the node is now ==")
        mark("sweep")
        space, settings = p.sweep
        _, docs["sweep"] = sweep.execute(cfg, ctl, run_dir, space, settings, p.bad_candidate,
                                         out, progress=progress)
        findings.write(run_dir, docs["sweep"], "sweep")
    rows = ctl.store.trials()
    now_rows = latest_epoch(rows)  # one system: the latest, where the bad state was measured
    if not findings.trial_values(now_rows, p.bad_candidate.key, str(cfg.metric)):
        now_rows = rows
    whole, extra = _whole(cfg, now_rows, p)
    bad_label = _label(p.bad_candidate, p.commits, ws) + " now"
    if ref is not None:
        start = f"the reference ({_label(p.base, p.commits, ws)}, then)"
    else:
        start = _label(p.base, p.commits, ws) + " now"
    hint, next_command = _next_step(cfg, p, docs)
    result = for_investigation(
        str(cfg.metric), whole, whole_extra=extra, reference=start, bad=bad_label,
        compare_doc=docs.get("compare"), isolate_doc=docs.get("isolate"),
        bisect_doc=docs.get("bisect"), sweep_doc=docs.get("sweep"),
        mechanism=_mechanism(now_rows, p), next_step=next_command)
    if hint:
        result["hint"] = hint
    changed = [c.to_json() for c in system_changes(rows)]
    if changed:
        mark_system_change(result, changed, **_epoch_parts(rows, changed[-1], marks))
    if yardstick is not None:
        result["code_yardstick"] = {k: v for k, v in yardstick.items() if k != "level"}
        result["sentence"] += f"; {yardstick['said']}"
    if evidence_plan.kernels_enabled(cfg) and result.get("causes"):
        out.print("\n== kernel evidence: each named cause's two sides, profiled ==")
        result["evidence"] = evidence.for_causes(
            ctl, result["causes"], p.bad_candidate, p.base, [docs.get("bisect"), docs.get("isolate")],
            ws.resolve, restarts=int(cfg.evidence.restarts),
            max_causes=int(cfg.evidence.max_causes), say=out.print)
    doc = {"run": ctl.store.run_id, "experiment": "investigate", "metric": str(cfg.metric),
           "verdict": result["status"], "message": result["sentence"], "findings": [],
           "steps": list(docs), "n_trials": len(rows), "answer": result}
    findings.write(run_dir, doc, "investigate")
    return doc, docs


def _epoch_parts(rows, change: dict, marks: dict[str, int]) -> dict[str, list[str]]:
    """Which steps ran on the new state after a node changed (the isolate and the bisect take
    their decisions again on the new system's trials) and which ran only before it, from the
    first trial id of each step (`marks`, in the order the steps ran)."""
    after = int(change.get("after_trial") or 0)
    names = {"compare": "the reference re-measured now (the system's part)"}
    steps = list(marks.items())
    remeasured, stale = [], []
    for n, (step, first) in enumerate(steps):
        end = steps[n + 1][1] if n + 1 < len(steps) else None
        ran_after = any(r.finished and r.id >= max(first, after) and (end is None or r.id < end)
                        for r in rows)
        if step == "compare" or not ran_after:
            stale.append(names.get(step, step))
        else:
            remeasured.append(step)
    return {"remeasured": [*remeasured, "the total (the bad state now)"],
            "not_comparable": stale}


def code_yardstick(cfg: DictConfig, rows, p: Plan, compare_doc: dict | None) -> dict | None:
    """The level the commit range is judged against when the system changed since the
    reference: the reference's own candidate measured now, not the reference's level then.

    The bisect rules a range out when its change is confidently under half of the change it
    hunts. Hunting the whole change since the reference (system causes included) ruled out
    every code regression smaller than the system's part: a +15% commit under a +28% power
    cap and stripped variable read as "code not the cause". Taking the reference's commit as
    it measures today removes the system's part, named or not (an untestable driver too), and
    leaves the code's: the yardstick reduced by the system effects, measured at one commit
    rather than summed from causes that may overlap. None when the system did not change or
    `experiment.params.min_effect_pct` states the yardstick."""
    if (p.reference is None or compare_doc is None
            or compare_doc.get("verdict") != "not_reproduced"
            or experiment_params.of(cfg).min_effect_pct is not None):
        return None
    metric = str(cfg.metric)
    now = [v for v in findings.trial_values(rows, p.base.key, metric) if v > 0]
    then = [v for v in p.reference["values"].get(metric, []) if v and v > 0]
    if not now or not then:
        return None
    level_now = math.exp(math.fsum(math.log(v) for v in now) / len(now))
    level_then = math.exp(math.fsum(math.log(v) for v in then) / len(then))
    system_pct = 100.0 * (level_now / level_then - 1.0)
    name = str(p.reference.get("name", "the reference"))
    what = (f"the reference's commit measured now (the system's part since reference run"
            f" {name}, {system_pct:+.1f}%, taken out)")
    return {"level": (level_now, name, what), "system_pct": round(system_pct, 3),
            "how": "yardstick_reduced",
            "line": (f"the range is judged against the change left once the system's part is"
                     f" taken out: the reference's commit measures {metric} {system_pct:+.1f}%"
                     " now against then"),
            "said": (f"the code range was judged without the system's part (yardstick reduced"
                     f" by the {system_pct:+.1f}% the reference's commit measures now against"
                     " then)")}


def _next_step(cfg: DictConfig, p: Plan, docs: dict[str, dict]) -> tuple[str, str]:
    """Without a reference, a range that does not reproduce sends the user to the system:
    (a hint naming earlier runs that measured the good commit, the complete command that
    continues from the first of them). Without such a run there is no command to give yet."""
    if p.reference is not None or (docs.get("bisect") or {}).get("verdict") != "not_reproducible":
        return "", ""
    bad = str(cfg.bad)
    found = reference_runs(runs_root(cfg), p.base.commit, exclude=str(cfg.run_id))
    if found:
        return (f"runs that measured {p.base.commit[:12]} earlier: {', '.join(found)}; the next"
                " step tests the system against the first",
                next_step.command(cfg, "investigate", f"reference={found[0]}", f"bad={bad}"))
    return (f"no earlier run in {runs_root(cfg)} measured {p.base.commit[:12]}: with one (or a"
            " fingerprint JSON of the good state), investigate reference=RUN bad="
            f"{bad} tests the system", "")


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


def finish(cfg: DictConfig, run_dir: Path, store: RunStore, doc: dict, out) -> int:
    """Rank every step's findings into `findings.json`, write the report, print the answer."""
    from orchestrator.ui.report import write_report
    from orchestrator.ui.report.ranking import load_docs, rank

    code = 0 if doc["answer"].get("explains") else EXIT_INCONCLUSIVE
    findings.write(run_dir, rank(load_docs(run_dir), store.trials()))
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
        out.print(evidence_plan.cost_line(cfg))
        if p.reference is not None and p.reference.get("adopted"):
            out.print("measuring with the reference's settings: "
                      + ", ".join(p.reference["adopted"]))
        with Progress(out) as progress, \
                Controller(cfg, store, run_dir, on_event=progress.on_event) as ctl:
            doc, _ = execute(cfg, ctl, run_dir, p, ws, out, progress=progress)
        code = finish(cfg, run_dir, store, doc, out)
        run.status = "done" if code == 0 else "inconclusive"
        return code
