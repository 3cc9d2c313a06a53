"""`sleuth bisect`: find the commit(s) between good and bad that moved a metric.

    sleuth bisect repo=PATH good=REF bad=REF metric=verify_ms [direction=auto] [confidence=0.99]
                  [nodes=K] [max_trials=N] [first_parent=true] [paths=[python/sglang/srt]]
                  [reference=RUN | was=VALUE] [experiment.params.min_effect_pct=P]

Exit 0 when it names the culprit(s), or when the range holds no change larger than the min
effect (`experiment.params.min_effect_pct`, else 4% or a tenth of the change: the answer says
"no change larger than x%"), or, given the change being chased (`reference=RUN` or
`was=VALUE`), when the range's change is confidently under half of it (the regression is not
in this range); 3 when it stops at its budget (with its answer so far) or cannot tell.

Resuming: `sleuth bisect run_id=RUN` (or `sleuth resume RUN`) reopens the run's store and
continues; every finished trial is reused. `sleuth bisect run_id=RUN max_trials=N` continues a
run that stopped at its budget with a larger one.

With `first_parent=false` the whole commit graph between the endpoints is searched: a commit is
bad when it descends from the culprit (as `git bisect` treats history), and a culprit is
verified against its real git parent(s), listed as points even when they lie outside the range.

`sleuth bisect package=NAME good=V1 bad=V2 [package.pre=true] packages.find_links=DIR ...`
searches the releases of a package instead, at the run's commit (`bisect_release`).

Size: the command (plan, refusals, run, resume); its stop and findings helpers are
`bisect_stop.py`, the release search's `bisect_release.py`.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.answer.provisional import so_far
from orchestrator.commands import bisect_release, common, next_step, parts
from orchestrator.commands.bisect_notes import Display, Terminal, min_effect_hint, opening_lines
from orchestrator.commands.bisect_stop import (
    exit_code,
    provisional_findings,
    settle,
    stop_reason,
)
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config import params as experiment_params
from orchestrator.config.bisect import bisect_strategy
from orchestrator.config.requests import BisectRequest, check_budget
from orchestrator.config.settings import RunSettings, as_dict, evolve
from orchestrator.control.drive import FixedPoints, drive, replay, unreported
from orchestrator.control.repetitions import RepetitionDesign, RepetitionSettings
from orchestrator.errors import RunInterrupted, UserError
from orchestrator.records import Candidate
from orchestrator.run import findings
from orchestrator.run.noise_prior import load_noise_prior
from orchestrator.run.posterior_steps import Recorder
from orchestrator.run.rundir import run_argument, running
from orchestrator.store import RunStore
from orchestrator.strategies.base import Verdict
from orchestrator.strategies.bisect.verdict import chased_change_pct, chased_ruled_out
from orchestrator.system.watch import system_changes
from orchestrator.ui import render
from orchestrator.ui.progress import Progress
from orchestrator.ui.report.terminal import print_answer
from orchestrator.workspace import CommitInfo
from orchestrator.workspace.commits import boundary_parents, graph_order

if TYPE_CHECKING:  # `execute` runs on any controller; only `_execute` starts the Ray one
    from orchestrator.control.controller import Controller
    from orchestrator.strategies.bisect import BisectStrategy


def validate(cfg: RunSettings) -> tuple[RunSettings, BisectRequest]:
    """The settings checked, with their paths absolute (`common.check_common`), and the
    bisect's own request (`BisectRequest.of`: endpoints, metric, confidence, budget)."""
    cfg = common.check_common(cfg)
    req = BisectRequest.of(cfg)
    if req.package:
        cfg = evolve(cfg, first_parent=True)  # releases are a line; the stored config says so
    return cfg, req


def prior_weights(commits: list[CommitInfo], paths: list[str], ws, untouched: float) -> list[float] | None:
    """Commits touching nothing under `paths` get a lower prior weight, never zero."""
    if not paths:
        return None
    return [1.0 if ws.touches(c, paths) else untouched for c in commits]


def plan(cfg: RunSettings, req: BisectRequest
         ) -> tuple[list[CommitInfo], list[Candidate], list[float] | None]:
    ws = common.workspace(cfg)
    good, bad = ws.resolve(req.good), ws.resolve(req.bad)
    commits = ws.commits_between(good, bad, first_parent=req.first_parent)
    if not req.first_parent:
        commits = graph_order(commits, ws.commit_infos(boundary_parents(commits)))
    base = common.candidate(evolve(cfg, commit=good), ws)
    points = [dataclasses.replace(base, commit=c.sha) for c in commits]
    untouched = experiment_params.of(cfg).untouched_weight
    weights = prior_weights(commits, list(req.paths), ws, untouched)
    return commits, points, weights


def reference_level(cfg: RunSettings, req: BisectRequest
                    ) -> tuple[float, str] | tuple[float, str, str] | None:
    """The level the range's change is judged against: the metric's geometric mean in
    `reference=RUN` and the run's name, or the value the user states with `was=VALUE` (with
    what it is); None without either."""
    if req.was is not None:
        return req.was, "was", f"{req.metric} was {req.was:g} (was=)"
    if not req.reference:
        return None
    from orchestrator.commands.compare import load_reference

    ref = load_reference(cfg, req.reference)
    values = [v for v in ref["values"].get(req.metric, []) if v and v > 0]
    if not values and "log" in ref:  # an old log without the metric: no level to chase
        return None
    if not values:
        raise UserError(f"reference {req.reference} has no measured {req.metric} value")
    return math.exp(sum(math.log(v) for v in values) / len(values)), str(ref["name"])


def _save_plan(run_dir: Path, commits: list[CommitInfo], points: list[Candidate],
               weights: list[float] | None, release: dict | None = None) -> None:
    doc = {"commits": [dataclasses.asdict(c) for c in commits],
           "candidates": [p.to_json() for p in points], "prior_weights": weights}
    if release is not None:  # a search of a package's releases: the versions stand as commits
        doc["release"] = release
    (run_dir / "commits.json").write_text(json.dumps(doc, indent=1) + "\n")


def _load_plan(run_dir: Path) -> tuple[list[CommitInfo], list[Candidate], list[float] | None]:
    doc = json.loads((run_dir / "commits.json").read_text())
    commits = [CommitInfo(**{**c, "parents": tuple(c["parents"]), "files": tuple(c["files"])})
               for c in doc["commits"]]
    return commits, [Candidate.from_json(c) for c in doc["candidates"]], doc["prior_weights"]


def _load_release(run_dir: Path) -> dict | None:
    return json.loads((run_dir / "commits.json").read_text()).get("release")


def run(cfg: RunSettings) -> int:
    if cfg.run_id and (cfg.runs_root / str(cfg.run_id)).exists():
        budget = check_budget(cfg.max_trials)
        return resume(cfg.runs_root / str(cfg.run_id), max_trials=budget)
    cfg, req = validate(cfg)
    reference_level(cfg, req)  # a bad reference is bad input: refused before anything is written
    release = None
    if req.package:
        commits, points, release = bisect_release.plan(cfg, req)
        weights = None
    else:
        commits, points, weights = plan(cfg, req)
    # the strategy's constructor checks, before anything runs
    bisect_strategy(req, experiment_params.of(cfg), len(points), weights, commits)
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    _save_plan(run_dir, commits, points, weights, release)
    return _execute(cfg, req, run_dir, store, commits, points, weights, release)


def resume(run_dir: Path, max_trials: int | None = None) -> int:
    """Continue a bisect; ``max_trials`` replaces the budget it was started with."""
    def prepare(cfg: RunSettings) -> tuple[RunSettings, tuple]:
        if max_trials is not None:
            cfg = evolve(cfg, max_trials=max_trials)
        return cfg, _load_plan(run_dir)

    store, cfg, (commits, points, weights) = common.reopen_run(run_dir, "bisect", prepare)
    return _execute(cfg, BisectRequest.stored(cfg), run_dir, store, commits, points, weights,
                    _load_release(run_dir))


def mark_merges(cfg: RunSettings, doc: dict, commits: list[CommitInfo]) -> None:
    """A culprit a first-parent bisect names that is a merge brought a whole branch in: the
    answer says so and gives the command that searches the branch's own commits (good = the
    merge's first parent, bad = the merge, `first_parent=false`). On a merged pull request
    that found the real commit in 11 restarts, and the answer had never suggested it."""
    by_sha = {c.sha: c for c in commits}
    merges = []
    for f in doc.get("findings", []):
        commit = by_sha.get(str(f.get("id")))
        if f.get("kind") != "commit" or commit is None or len(commit.parents) < 2:
            continue
        f["merge"] = True
        run = next_step.command(cfg, "bisect", f"good={commit.parents[0][:12]}",
                                f"bad={commit.sha[:12]}", "first_parent=false")
        merges.append({"sha": commit.sha, "command": run})
    result = doc.get("answer")
    if merges and result is not None:
        result["merges"] = merges
        result["next"] = result.get("next") or merges[0]["command"]


def _flag_outliers(store: RunStore, verdict: Verdict) -> None:
    """Outlier restarts are kept in the store, flagged with why they were left out."""
    flags = {o.trial_id: f"{o.status}: {o.ratio:.2f}x its commit's level"
             for o in verdict.outliers if o.trial_id is not None}
    store.set_trial_flags("outlier", flags)


def execute(cfg: RunSettings, req: BisectRequest, ctl: Controller, run_dir: Path, commits,
            points, weights, out,
            findings_name: str | None = None, progress=None,
            release: dict | None = None,
            reference: tuple | None = None) -> tuple[Verdict, dict]:
    """Bisect on a running controller; writes findings.json and returns the verdict and it.

    ``release``: the points are a package's releases (`bisect_release`), not commits.
    `reference`: the level the range's change is judged against, `(value, run name[, what it
    is])`, where the caller knows a better one than `reference=RUN`'s own (an investigation
    whose system changed since the reference: see `orchestrator/commands/investigate.py`).
    `cfg` is the run's settings (target, bench, experiment knobs); `req` what is bisected.

    Four steps: build (the strategy, its repetition design, who reports), drive, the findings
    document, print."""
    if reference is None:
        reference = reference_level(cfg, req)
    strategy, design = _build(cfg, req, ctl, run_dir, commits, points, weights, out, release,
                              reference)
    args = (req.metric, strategy.budget, design, commits, release is not None)
    reporter = (Display(progress, len(ctl.store.trials()), *args) if progress is not None
                else Terminal(out, *args))
    design.on_change = reporter.say
    # The posterior as the run goes, for the report (a release search has no commit plan)
    recorder = Recorder(run_dir) if release is None else None
    try:
        verdict = drive(ctl, strategy, points, metric=req.metric, on_verdict=reporter.on_verdict,
                        on_system_change=reporter.system_changed, repetitions=design,
                        record=recorder.record if recorder is not None else None)
    except (KeyboardInterrupt, RunInterrupted):
        _stopped(cfg, req, ctl, run_dir, commits, points, strategy, reporter.latest,
                 findings_name, out)
        raise
    finally:
        reporter.finish()
    rows = ctl.store.trials()
    _flag_outliers(ctl.store, verdict)
    doc = document(cfg, req, ctl.store.run_id, rows, verdict, strategy, commits, points,
                   release, reference)
    design.update(rows, [o.trial_id for o in verdict.outliers if o.trial_id is not None])
    doc["repetitions"] = design.summary(rows)
    path = findings.write(run_dir, doc, findings_name)
    _print_result(cfg, out, doc, verdict, rows, points, reporter.said, design, run_dir,
                  strategy.budget)
    out.print(f"findings: {path}")
    return verdict, doc


def _build(cfg: RunSettings, req: BisectRequest, ctl: Controller, run_dir: Path, commits,
           points, weights, out, release: dict | None, reference: tuple | None
           ) -> tuple[BisectStrategy, RepetitionDesign]:
    """The strategy and its repetition design, said before anything is spent."""
    metric = req.metric
    if release is not None:
        out.print(f"{bisect_release.opening(release)} on {metric} with {len(ctl.nodes)}"
                  " node(s)")
    else:
        graph = "" if req.first_parent else " (the full commit graph)"
        out.print(f"bisecting {len(commits)} commits {commits[0].sha[:10]}.."
                  f"{commits[-1].sha[:10]}{graph} on {metric} with {len(ctl.nodes)} node(s)")
    settings = RepetitionSettings.from_conf(cfg.bench)
    prior = None
    if settings.adaptive and settings.prior:
        prior = load_noise_prior(run_dir, nodes=ctl.nodes, metric=metric)
    strategy = bisect_strategy(
        req, experiment_params.of(cfg), len(points), weights, commits,
        reference_value=reference[0] if reference else None,
        noise_prior=prior.trial_noise(settings.start) if prior is not None else None)
    for line in opening_lines(req, strategy, reference):
        out.print(line)
    out.print(settings.describe())
    if prior is not None:
        out.print(prior.describe())
    # The report replays the posterior from it (a commit range's: an investigation's release
    # search leaves it to the range's bisect)
    if release is None and not (run_dir / "commits.json").exists():
        _save_plan(run_dir, commits, points, weights)
    return strategy, RepetitionDesign(settings, as_dict(cfg.target), metric, prior=prior)


def _stopped(cfg: RunSettings, req: BisectRequest, ctl: Controller, run_dir: Path, commits,
             points, strategy: BisectStrategy, last: Verdict | None,
             findings_name: str | None, out) -> None:
    """Interrupted: what is known so far, stored and said before the run stops (`sleuth
    report` shows it). Best effort: nothing here may turn a clean stop into a crash."""
    try:
        if last is None:
            last = strategy.verdict(replay(ctl.store.trials(), FixedPoints(points), req.metric,
                                           ctl.retries))
        doc = provisional_findings(cfg, req, ctl, run_dir, commits, points, last,
                                   f"interrupted after {last.n_trials} restarts", findings_name)
        if findings_name is None:  # a step of an investigation: it says the whole answer
            out.print("")
            print_answer(out, doc["answer"])
    except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
        out.print(f"(the answer so far could not be stored: {exc})")


def document(cfg: RunSettings, req: BisectRequest, run_id: str, rows, verdict: Verdict,
             strategy: BisectStrategy, commits, points, release: dict | None,
             reference: tuple | None) -> dict:
    """The findings document of a finished (or budget-stopped) bisect."""
    keys = [p.key for p in points]
    doc = findings.bisect_findings(run_id=run_id, metric=req.metric, verdict=verdict,
                                   commits=commits, keys=keys, rows=rows,
                                   min_effect_pct=experiment_params.of(cfg).min_effect_pct,
                                   subjects=release is None)
    if release is not None:
        doc = bisect_release.rewrite(doc, release, rows, keys, metric=req.metric,
                                     direction=req.direction)
    if verdict.status == "budget_exhausted":
        doc["answer"] = so_far(doc["answer"], why=stop_reason(verdict),
                               confidence=req.confidence)
        doc["provisional"] = doc["answer"]["provisional"]
    chased = chased_change_pct(strategy)
    if chased is not None and reference is not None:
        # What a range that does not reproduce was measured against (the exit code's 0)
        doc["chased"] = {"pct": round(chased, 2), "level": reference[0],
                         "since": reference[2] if len(reference) > 2 else
                         f"reference run {reference[1]}",
                         "ruled_out": chased_ruled_out(strategy)}
    doc["system_changes"] = [c.to_json() for c in system_changes(rows)]
    if req.first_parent and release is None:
        mark_merges(cfg, doc, commits)
    settle(doc, verdict, rows)
    return doc


def _print_result(cfg: RunSettings, out, doc: dict, verdict: Verdict, rows, points,
                  said: set[str], design: RepetitionDesign, run_dir: Path, budget: int) -> None:
    """The findings, the notes not said while it ran, how to continue, what to mistrust."""
    out.print(render.findings_table(doc))
    out.print(doc["message"])  # commits named, not positions
    for line in bisect_release.step_lines(doc):
        out.print(line)
    out.print(f"cost: {design.line(rows)}")
    named_notes = list(doc.get("notes", verdict.notes))
    for i, named in enumerate(named_notes):
        note = verdict.notes[i] if i < len(verdict.notes) else named
        if note not in said:
            out.print(named)
    hint = min_effect_hint(verdict, experiment_params.of(cfg))
    if hint:
        out.print(hint)
    if verdict.status == "budget_exhausted":
        out.print(f"to continue (every finished trial is reused): sleuth resume"
                  f" {run_argument(run_dir)} max_trials={2 * budget}")
    for change in system_changes(rows):
        out.print(change.warning)
    silent = unreported(rows, str(doc["metric"]), points)
    if silent:
        out.print(f"warning: {silent}")


def _execute(cfg: RunSettings, req: BisectRequest, run_dir: Path, store: RunStore, commits,
             points, weights, release: dict | None = None) -> int:
    from orchestrator.control.controller import Controller

    out = render.console()
    with running(store, run_dir, out) as run:
        with Progress(out, done=store.trials()) as progress, \
                Controller(parts.control(cfg), store, run_dir, on_event=progress.on_event) as ctl:
            verdict, doc = execute(cfg, req, ctl, run_dir, commits, points, weights, out,
                                   progress=progress, release=release)
        print_answer(out, doc.get("answer"))
        code = exit_code(verdict, doc)
        run.status = "done" if code == 0 else "inconclusive"
        return code
