"""`sleuth isolate`: which of the differences between two configurations cause the slowdown.

    sleuth isolate good.commit=REF good.env.NCCL_PROTO=LL128 good.clock=default \\
                   bad.patches=[a.patch,b.patch] bad.clock=power:300 [metric=verify_ms]
    sleuth isolate reference=RUN [metric=verify_ms]

With explicit specs, each part (commit, clock, server) left out on one side is the same as on
the other; patches, env variables and package pins are what each side lists (`packages=[...]`
pins both sides, each side's own pins win). With `reference=RUN`, the reference's whole
configuration is re-measured now (`compare`); unless it reproduces (an undecided compare,
often a reference of one restart, is tested too: the isolate measures both sides now), the
controllable differences of the fingerprint diff (each clock setting on its own, environment
variables of the server process, package versions when a package source is given) become the
differences to test, the reference side set per trial and the "now" side being the node as it
is. A difference the record cannot restore (a redacted value) is listed,
never tested; a patch that does not apply is bad input before anything is written. Each test is a
set of repeated, interleaved restarts with a statistical decision (noisy delta debugging, see
`orchestrator/strategies/isolate/`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator.answer.epochs import mark_system_change
from orchestrator.commands import common, compare, parts
from orchestrator.commands.isolate_findings import document
from orchestrator.commands.isolate_points import IsolatePoints, LiveIsolatePoints
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import CompareRequest, IsolateRequest
from orchestrator.config.settings import RunSettings, as_dict, evolve
from orchestrator.control import packages
from orchestrator.control.controller import Controller
from orchestrator.control.drive import drive, replay, unreported
from orchestrator.errors import RunInterrupted, UserError, answer_exit
from orchestrator.metrics import regression_direction
from orchestrator.run import findings
from orchestrator.run.rundir import running
from orchestrator.store import RunStore
from orchestrator.strategies.base import Verdict, probability_relation
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.system.differences import (
    KINDS,
    Change,
    changes_between,
    changes_from_system,
    check_distinct,
    reference_good,
)
from orchestrator.system.fingerprint_diff import NOT_FROM_RECORD, Difference
from orchestrator.system.runtime_settable import live_indices
from orchestrator.system.watch import latest_epoch, system_changes
from orchestrator.ui import render
from orchestrator.ui.progress import Progress
from orchestrator.util.pins import pins_of


def _check_changes(cfg: RunSettings, ws, good: dict, bad: dict, changes: list[Change]) -> None:
    """Refuse what cannot be launched before anything is written: levels (a clock part, an
    env value, a secret, a redacted record), refs, and patches that do not apply to their
    side's commit (each side as a whole: a patch that needs another one is a subset the
    strategy will find untestable, but a side that cannot be built is bad input)."""
    for c in changes:
        kind = KINDS[c.factor]
        for level in (c.good, c.bad):
            if c.factor == "patch":
                kind.check(c.key, True)
            elif c.factor != "commit":
                kind.check(c.key, level)
    for side in (good, bad):
        sha = ws.resolve(str(side.get("commit", "HEAD")))
        if side.get("patches"):
            ws.check_patches(sha, list(side["patches"]))
    packages.require(parts.package_plan(cfg), good["packages"], bad["packages"])


def _best(verdict: Verdict) -> tuple[str | None, float | None]:
    """The most probable cause named so far, for the progress line."""
    top = verdict.top
    if top is None:
        return None, None
    return " + ".join(getattr(top, "labels", ())) or None, float(top.probability)


def _reporter(out, progress: Progress | None) -> Callable[[Verdict, int], None]:
    """Verdicts as the live progress state, or (without one) a line whenever the phase or the
    leading cause changes: one line per trial buried the run's story in repeats."""
    if progress is not None:
        progress.set_total(None)  # no forecast: an earlier experiment's would mislead

        def live(v: Verdict, _n: int) -> None:
            progress.on_verdict(v.status, *_best(v))
        return live
    last: list[tuple[str, str | None]] = []

    def plain(v: Verdict, n: int) -> None:
        label, probability = _best(v)
        if last and last[-1] == (v.status, label):
            return
        last.append((v.status, label))
        best = (f"; best {label} p{probability_relation(probability, '')}"
                if label is not None and probability is not None else "")
        out.print(f"  [{v.status}] {n} trials{best}")
    return plain


def execute(cfg: RunSettings, req: IsolateRequest, ctl: Controller, run_dir: Path, good: dict,
            changes: list[Change], resolve, out, findings_name: str | None = None,
            progress: Progress | None = None):
    """Test `changes` from `good` on a running controller (`req`: metric, direction,
    confidence, budget); writes the findings and returns the verdict and them."""
    metric = req.metric
    labels = [c.label for c in changes]
    live = live_indices(changes) if experiment_params.of(cfg).within_lifetime else frozenset()
    strategy = IsolateStrategy(
        len(changes), direction=regression_direction(metric, req.direction),
        confidence=req.confidence, max_trials=req.max_trials, labels=labels,
        min_effect_pct=experiment_params.of(cfg).min_effect_pct, live=live)
    check_distinct(good, changes, resolve)
    points = (LiveIsolatePoints if live else IsolatePoints)(strategy, good, changes, resolve)
    out.print(f"isolating {len(changes)} difference(s) on {metric}: "
              + "; ".join(labels[:6]) + (" ..." if len(labels) > 6 else ""))
    if live:
        out.print(f"within one server lifetime (set on the running server, interleaved blocks:"
                  f" the restart's own noise cancels): {', '.join(labels[i] for i in sorted(live))}")
    say = progress.note if progress is not None else out.print
    try:
        verdict = drive(ctl, strategy, points, metric=metric, on_verdict=_reporter(out, progress),
                        on_system_change=lambda c: say(c.warning))
    except (KeyboardInterrupt, RunInterrupted):
        # What is known so far, stored before the run stops (`sleuth report` shows it; the
        # command says it). Best effort: nothing here may turn a clean stop into a crash.
        try:
            last = strategy.verdict(replay(ctl.store.trials(), points, metric, ctl.retries))
            findings.write(run_dir, document(cfg, req, ctl, strategy, points, changes, last,
                                             stopped=f"interrupted after {last.n_trials}"
                                             " restarts"), findings_name)
        except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
            out.print(f"(the answer so far could not be stored: {exc})")
        raise
    doc = document(cfg, req, ctl, strategy, points, changes, verdict)
    all_rows = ctl.store.trials()
    rows, system = latest_epoch(all_rows), system_changes(all_rows)
    path = findings.write(run_dir, doc, findings_name)
    out.print(render.findings_table(doc))
    out.print(verdict.message)
    for line in [c.warning for c in system] + ([doc["epoch_note"]] if system else []):
        out.print(line)
    silent = unreported(rows, metric, points)
    if silent:
        out.print(f"warning: {silent}")
    if verdict.cleared:
        rest = doc.get("remainder")
        out.print(f"cleared ({len(verdict.cleared)}): "
                  + ", ".join(changes[i].label for i in verdict.cleared[:12])
                  + (" ..." if len(verdict.cleared) > 12 else "")
                  + (f"; but a remainder of {rest['pct']:+.1f}% [{rest['ci'][0]:+.1f}%,"
                     f" {rest['ci'][1]:+.1f}%] stands unexplained" if rest else ""))
    out.print(f"findings: {path}")
    return verdict, doc


def isolate_system(cfg: RunSettings, req: IsolateRequest, ctl: Controller, run_dir: Path,
                   ref: dict, cdoc: dict, resolve, out, progress: Progress | None = None
                   ) -> tuple[object, dict] | None:
    """Isolate the controllable differences a `compare` found; returns (verdict, findings doc),
    or None when there is nothing to test. The compare document keeps only the differences
    that were not tested (not settable per trial, or shell/session variables set aside), so
    the run's one ranking does not list a tested difference twice."""
    diffs = differences_from_compare(cdoc)
    all_env = experiment_params.of(cfg).all_env
    found = changes_from_system(diffs, all_env=all_env)
    pinned = [c.key for c in found if c.factor == "package"]
    if pinned and parts.package_plan(cfg).overlays.configured:
        out.print(f"installing the reference versions of {len(pinned)} package(s) into overlays:"
                  f" {', '.join(pinned[:8])}{' ...' if len(pinned) > 8 else ''}")
    changes, no_package = packages.testable(parts.package_plan(cfg), found)
    untested = [d for d in diffs if not any(c.matches(d) for c in changes)]
    if no_package:
        out.print(f"package changes not tested ({len(no_package)}): "
                  + "; ".join(f"{k}: {why.removeprefix('not tested: ')}"
                              for k, why in list(no_package.items())[:6]))
    aside = [d for d in untested if d.controllable and d.key not in no_package]
    if aside:
        out.print(f"set aside {len(aside)} shell/session variable(s), not tested"
                  f" (experiment.params.all_env=true tests them): "
                  + ", ".join(d.key for d in aside[:10]) + (" ..." if len(aside) > 10 else ""))
    secret = [d for d in untested if NOT_FROM_RECORD in d.detail]
    if secret:
        out.print(f"{NOT_FROM_RECORD}, not tested: " + ", ".join(d.key for d in secret[:10]))
    fixed = [d for d in untested if not d.controllable and d not in secret]
    if fixed:
        out.print("not settable per trial (kept in the compare findings): "
                  + ", ".join(d.label for d in fixed[:8]))
    keep = {d.key for d in untested}
    cdoc["findings"] = [dict(f, rank=i) for i, f in enumerate(
        (f for f in cdoc["findings"] if f["id"] in keep), 1)]
    for f in cdoc["findings"]:
        detail = f["difference"].get("detail", "")
        f["untested"] = (NOT_FROM_RECORD if NOT_FROM_RECORD in detail
                         else no_package[f["id"]] if f["id"] in no_package
                         else "set aside: shell/session variable" if f["difference"]["controllable"]
                         else UNKNOWN_THEN if f["difference"].get("category") == "unknown"
                         else "not settable per trial")
    findings.write(run_dir, cdoc, "compare")
    if not changes:
        out.print("no controllable difference to isolate")
        return None
    good = reference_good(ref["candidate"], changes)
    return execute(cfg, req, ctl, run_dir, good, changes, resolve, out, "isolate", progress)


def differences_from_compare(doc: Mapping) -> list[Difference]:
    """The fingerprint differences a compare findings document lists."""
    return [Difference.from_json(d) for d in doc.get("differences", [])]


def _plan(cfg: RunSettings) -> tuple[RunSettings, IsolateRequest, dict | None, object,
                                     dict | None, list[Change] | None]:
    """Check the request and work out what to test: ``(settings to run with, request,
    reference, workspace, good, changes)``; with a reference, the differences come later,
    from the compare."""
    cfg = common.check_common(cfg)
    req = IsolateRequest.of(cfg)
    if req.reference:
        ref = compare.load_reference(cfg, req.reference)
        cfg = evolve(cfg, repo=cfg.repo or ref.get("repo"))
        ws = common.workspace(cfg)
        ws.resolve(ref["candidate"].commit)
        cfg, ref["adopted"] = compare.adopt_reference_config(cfg, ref, ws.resolve)
        packages.require(parts.package_plan(cfg), ref["candidate"].package_dict)
        return cfg, req, ref, ws, None, None
    for side, spec in (("good", req.good), ("bad", req.bad)):
        if "patches" in spec:  # saved absolute, so that a resume finds them from anywhere
            cfg = evolve(cfg, {f"{side}.patches": list(spec["patches"])})
    good, changes = changes_between(*_with_fixed_pins(cfg, as_dict(req.good), as_dict(req.bad)))
    if not changes:
        raise UserError("good and bad are the same configuration: nothing to isolate")
    ws = common.workspace(cfg)
    bad = changes_between(*reversed(_with_fixed_pins(cfg, as_dict(req.good),
                                                     as_dict(req.bad))))[0]
    _check_changes(cfg, ws, good, bad, changes)
    return cfg, req, None, ws, good, changes


def _with_fixed_pins(cfg: RunSettings, good: dict, bad: dict) -> tuple[dict, dict]:
    """`packages=[...]` pins both sides; a side's own pin of the same package wins."""
    fixed = packages.fixed_pins(cfg.packages)
    if not fixed:
        return good, bad
    return tuple({**side, "packages": {**fixed, **pins_of(side.get("packages"))}}
                 for side in (good, bad))


def refuse_redacted(cfg: RunSettings, name: str) -> None:
    """A stored configuration with a redacted value cannot be run again as it is: the
    secret was never written down, and launching the placeholder would measure something
    else."""
    from orchestrator.system.redact import redacted_paths

    parts = {k: as_dict(getattr(cfg, k)) for k in ("target", "bench", "env", "good", "bad")
             if getattr(cfg, k) is not None}
    where = redacted_paths(parts)
    if where:
        raise UserError(f"{name}'s configuration held secrets that were not stored"
                        f" ({', '.join(where)}): start a new run with them on the command line")


def run(cfg: RunSettings) -> int:
    cfg, req, ref, ws, good, changes = _plan(cfg)
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    return _execute(cfg, req, run_dir, store, ref, ws, good, changes)


def resume(run_dir: Path) -> int:
    """Finish an interrupted isolate: every finished trial is evidence again (the points are
    found back from the trials' candidates), interrupted ones are run again. With a reference,
    a compare that had finished is not repeated."""
    def prepare(cfg: RunSettings) -> tuple[RunSettings, tuple]:
        refuse_redacted(cfg, run_dir.name)
        cfg, req, ref, ws, good, changes = _plan(cfg)
        return cfg, (req, ref, ws, good, changes)

    store, cfg, (req, ref, ws, good, changes) = common.reopen_run(run_dir, "isolate", prepare)
    return _execute(cfg, req, run_dir, store, ref, ws, good, changes)


def _execute(cfg: RunSettings, req: IsolateRequest, run_dir: Path, store: RunStore,
             ref: dict | None, ws, good: dict | None, changes: list[Change] | None) -> int:
    out = render.console()
    with running(store, run_dir, out) as run:
        if ref is not None and ref.get("adopted"):
            out.print("measuring with the reference's settings: " + ", ".join(ref["adopted"]))
        try:
            with Progress(out, done=store.trials()) as progress, \
                    Controller(parts.control(cfg, sides=(req.good, req.bad)),
                               store, run_dir, on_event=progress.on_event) as ctl:
                if ref is not None:
                    cdoc = _compare(cfg, req, ctl, run_dir, ref, out, progress)
                    if cdoc["verdict"] == "reproduced":
                        out.print("nothing to isolate: the reference reproduces")
                    else:
                        if cdoc["verdict"] == "unresolved":
                            out.print(undecided_compare(cdoc))
                        isolate_system(cfg, req, ctl, run_dir, ref, cdoc, ws.resolve, out,
                                       progress)
                else:
                    assert good is not None and changes is not None
                    execute(cfg, req, ctl, run_dir, good, changes, ws.resolve, out,
                            progress=progress)
        except (KeyboardInterrupt, RunInterrupted):
            try:  # the answer so far (stored by `execute`), said before the resume line
                _answer(run_dir, store, ref, out)
            except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
                out.print(f"(the answer so far could not be shown: {exc})")
            raise
        code = answer_exit(_answer(run_dir, store, ref, out))
        run.status = "done" if code == 0 else "inconclusive"
        return code


# What an old log (`reference=log:PATH`) cannot tell: listed apart from what no trial can set.
UNKNOWN_THEN = "not in the reference's record (unknown then)"


# An undecided compare is most often a reference of one restart: its own noise stays in the
# estimate however often "now" is measured. The isolate does not rest on it: it sets the
# reference's configuration per trial and measures both sides now, as often as it needs.
UNDECIDED_COMPARE = ("the compare could not decide against the reference's own restarts; the"
                     " controllable differences it found are tested anyway, against the"
                     " reference's configuration recreated now")


def undecided_compare(cdoc: Mapping) -> str:
    """Why the isolate goes on after an undecided compare (an old log without the metric's
    level has nothing to decide against: its configuration, recreated, is "then")."""
    if cdoc.get("no_level"):
        return ("the reference holds no level of the metric: the controllable differences are"
                " tested against its configuration recreated now, which stands for \"then\"")
    return UNDECIDED_COMPARE


def _compare(cfg: RunSettings, req: IsolateRequest, ctl: Controller, run_dir: Path, ref: dict,
             out, progress: Progress) -> dict:
    """The reference re-measured now; a resumed run's finished compare is read back."""
    cdoc = compare.finished(run_dir)
    if cdoc is not None:  # a resumed run: the compare finished before
        out.print(f"the compare finished before: {cdoc['message']}")
        return cdoc
    return compare.execute(cfg, CompareRequest.step(cfg, req.max_trials), ctl, run_dir, ref,
                           out, findings_name="compare", progress=progress)


def _answer(run_dir: Path, store: RunStore, ref: dict | None, out) -> dict | None:
    """Rank the run's documents, store the ranking beside a compare's, and print the answer
    (a run stopped before its end: the answer so far); returns the answer (marked when the
    node's system changed during the run)."""
    from orchestrator.ui.report.ranking import load_docs, rank
    from orchestrator.ui.report.terminal import print_answer

    rows = store.trials()
    docs = load_docs(run_dir)
    ranked = rank(docs, rows)
    changed = [c.to_json() for c in system_changes(rows)]
    if changed and ranked.get("answer"):  # one system per comparison (answer/epochs.py)
        mark_system_change(ranked["answer"], changed, remeasured=["isolate"],
                           not_comparable=["the reference re-measured now"] if ref else ())
    if ref is not None and docs:
        findings.write(run_dir, ranked)
    if ranked.get("answer"):
        out.print("")
        print_answer(out, ranked["answer"])
    return ranked.get("answer")
