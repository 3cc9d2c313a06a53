"""`sleuth isolate`: which of the differences between two configurations cause the slowdown.

    sleuth isolate good.commit=REF good.env.NCCL_PROTO=LL128 good.clock=default \\
                   bad.patches=[a.patch,b.patch] bad.clock=power:300 [metric=verify_ms]
    sleuth isolate reference=RUN [metric=verify_ms]

With explicit specs, each part (commit, clock, server) left out on one side is the same as on
the other; patches, env variables and package pins are what each side lists (`packages=[...]`
pins both sides, each side's own pins win). With `reference=RUN`, the reference's whole
configuration is re-measured now (`compare`); if the result no longer reproduces, the
controllable differences of the fingerprint diff (each clock setting on its own, environment
variables of the server process, package versions when a package source is given) become the
differences to test, the reference side set per trial and the "now" side being the node as it
is. A difference the record cannot restore (a redacted value) is listed,
never tested; a patch that does not apply is bad input before anything is written. Each test is a
set of repeated, interleaved restarts with a statistical decision (noisy delta debugging, see
`orchestrator/strategies/isolate.py`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

from orchestrator import answer
from orchestrator.answer.epochs import mark_system_change
from orchestrator.answer.provisional import so_far
from orchestrator.commands import common, compare
from orchestrator.commands.isolate_points import IsolatePoints
from orchestrator.config import params as experiment_params
from orchestrator.config.settings import RunSettings, as_dict, evolve, load_saved
from orchestrator.control.controller import Controller
from orchestrator.control.drive import drive, unreported
from orchestrator.errors import UserError
from orchestrator.metrics import EFFECT_METRICS, check_metric, regression_direction
from orchestrator.packages import plan as packages
from orchestrator.packages.pins import pins_of
from orchestrator.run import findings
from orchestrator.run.attribution import isolate_attribution
from orchestrator.run.rundir import create_run, pin_run, running
from orchestrator.stats import caveats
from orchestrator.store import RunStore
from orchestrator.strategies.base import Verdict, probability_relation
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.strategies.isolate_report import remainder_stands
from orchestrator.system.differences import (
    KINDS,
    Change,
    changes_between,
    changes_from_system,
    check_distinct,
    reference_good,
)
from orchestrator.system.fingerprint_diff import NOT_FROM_RECORD, Difference
from orchestrator.system.watch import latest_epoch, system_changes
from orchestrator.ui import render
from orchestrator.ui.progress import Progress


def _spec(node) -> dict:
    if node is None:
        return {}
    if not isinstance(node, Mapping):
        raise UserError("isolate takes candidate specs: good.commit=REF good.env.X=V bad.clock=..."
                        " (or reference=RUN)")
    spec = as_dict(node)
    if "patches" in spec:
        spec["patches"] = [str(Path(str(p)).expanduser().resolve()) for p in spec["patches"]]
    return spec


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
    packages.require(cfg, good["packages"], bad["packages"])


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


def _qualified(effects: dict, metric: str, rows, keys: tuple[str, str]) -> dict:
    """Effects with the caveats that make some of them not evidence (too few restarts,
    client-side timings that follow the host's load; :mod:`orchestrator.stats.caveats`)."""
    fps = {k: [r.result.fingerprint for r in rows if r.candidate.key == k and r.result
               and r.result.fingerprint] for k in keys}
    cpus = next(((fp.get("host") or {}).get("cpus") for k in keys for fp in fps[k]), None)
    return caveats.qualify(effects, headline=metric, cpus=cpus,
                           loads=(caveats.mean_load(fps[keys[0]]), caveats.mean_load(fps[keys[1]])))


def execute(cfg: RunSettings, ctl: Controller, run_dir: Path, good: dict, changes: list[Change],
            resolve, out, findings_name: str | None = None, progress: Progress | None = None):
    metric = cfg.metric
    labels = [c.label for c in changes]
    strategy = IsolateStrategy(
        len(changes), direction=regression_direction(metric, cfg.direction),
        confidence=cfg.confidence, max_trials=cfg.max_trials, labels=labels,
        min_effect_pct=experiment_params.of(cfg).min_effect_pct)
    check_distinct(good, changes, resolve)
    points = IsolatePoints(strategy, good, changes, resolve)
    out.print(f"isolating {len(changes)} difference(s) on {metric}: "
              + "; ".join(labels[:6]) + (" ..." if len(labels) > 6 else ""))
    say = progress.note if progress is not None else out.print
    verdict = drive(ctl, strategy, points, metric=metric, on_verdict=_reporter(out, progress),
                    on_system_change=lambda c: say(c.warning))
    all_rows = ctl.store.trials()
    rows = latest_epoch(all_rows)  # every effect, total and share on one system
    good_key = points.candidate(0).key
    # The run's own metric too (a command target's `value` is none of the SGLang metrics).
    measured = (*EFFECT_METRICS, *([metric] if metric not in EFFECT_METRICS else []))
    items = []
    for culprit in sorted(verdict.culprits, key=lambda c: -c.probability):
        subset = frozenset(culprit.differences)
        with_key = points.candidate(strategy.point_of(subset)).key
        effects = _qualified(findings.effects_between(rows, good_key, with_key, measured),
                             metric, rows, (good_key, with_key))
        first = changes[culprit.differences[0]]
        pair = len(culprit.differences) > 1
        items.append({
            "kind": first.kind,
            "id": " + ".join(changes[i].name for i in culprit.differences),
            "summary": (" together with ".join(culprit.labels)
                        + (" (only together)" if culprit.kind == "interaction" else "")),
            "probability": round(float(culprit.probability), 4),
            "effect": caveats.evidence_only(effects),
            "not_evidence": caveats.not_evidence(effects),
            "phase": findings.phase_moved(caveats.evidence_only(effects)),
            "interaction": pair and culprit.kind == "interaction",
            "differences": [changes[i].to_json() for i in culprit.differences],
            "verified": culprit.verified,
            "evidence": [r.id for r in rows if r.candidate.key in (good_key, with_key)],
            "effect_detail": effects,
            "before_key": good_key, "after_key": with_key,
        })
    for rank, item in enumerate(items, 1):
        item["rank"] = rank
    doc = {"run": ctl.store.run_id, "experiment": "isolate", "metric": metric,
           "verdict": verdict.status, "message": verdict.message,
           "confidence": float(verdict.probability), "n_trials": verdict.n_trials,
           "cleared": [changes[i].to_json() for i in verdict.cleared],
           **_remainder(verdict),
           "differences": [c.to_json() for c in changes],
           "findings": [{"rank": i.pop("rank"), **i} for i in items],
           "min_effect_pct": experiment_params.of(cfg).min_effect_pct}
    system = system_changes(all_rows)
    doc["system_changes"] = [c.to_json() for c in system]
    if system:
        doc["epoch_note"] = (f"the node's system changed during the run ({system[-1].summary}):"
                             f" every effect here is from the {len(rows)} trials on the new"
                             " system, measured again there")
    attribution = isolate_attribution(rows, points.point, strategy.subset, changes,
                                      verdict.culprits, items, metric)
    if attribution is not None:
        doc["attribution"] = attribution
    bad_key = points.candidate(strategy.point_of(frozenset(range(len(changes))))).key
    total = findings.effects_between(rows, good_key, bad_key)
    if total:
        doc["total_effect"] = total
    doc["answer"] = answer.for_isolate(
        doc, mechanism=findings.mechanism_between(rows, good_key, bad_key, "good", "bad"))
    if verdict.status in ("budget_exhausted", "inconclusive"):  # at its budget or its cap
        doc["answer"] = so_far(doc["answer"], confidence=cfg.confidence, why=(
            f"budget spent after {verdict.n_trials} restarts" if verdict.status ==
            "budget_exhausted" else f"inconclusive after {verdict.n_trials} restarts"))
        doc["provisional"] = doc["answer"]["provisional"]
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


def _remainder(verdict) -> dict:
    """`{"remainder": ...}` when bad without the named causes still measures apart from good:
    differences listed as cleared do not then explain the rest, and the findings say how
    large the unexplained part is."""
    ci = getattr(verdict, "residual_ci", None)
    if verdict.status != "found" or not remainder_stands(ci):
        return {}
    return {"remainder": {"pct": round(float(verdict.residual_pct), 3),
                          "ci": [round(float(x), 3) for x in ci], "unexplained": True}}


def isolate_system(cfg: RunSettings, ctl: Controller, run_dir: Path, ref: dict, cdoc: dict,
                   resolve, out, progress: Progress | None = None
                   ) -> tuple[object, dict] | None:
    """Isolate the controllable differences a `compare` found; returns (verdict, findings doc),
    or None when there is nothing to test. The compare document keeps only the differences
    that were not tested (not settable per trial, or shell/session variables set aside), so
    the run's one ranking does not list a tested difference twice."""
    diffs = differences_from_compare(cdoc)
    all_env = experiment_params.of(cfg).all_env
    found = changes_from_system(diffs, all_env=all_env)
    pinned = [c.key for c in found if c.factor == "package"]
    if pinned and packages.settings(cfg).configured:
        out.print(f"installing the reference versions of {len(pinned)} package(s) into overlays:"
                  f" {', '.join(pinned[:8])}{' ...' if len(pinned) > 8 else ''}")
    changes, no_package = packages.testable(cfg, found)
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
                         else "not settable per trial")
    findings.write(run_dir, cdoc, "compare")
    if not changes:
        out.print("no controllable difference to isolate")
        return None
    good = reference_good(ref["candidate"], changes)
    return execute(cfg, ctl, run_dir, good, changes, resolve, out, "isolate", progress)


def differences_from_compare(doc: Mapping) -> list[Difference]:
    """The fingerprint differences a compare findings document lists."""
    return [Difference.from_json(d) for d in doc.get("differences", [])]


def _plan(cfg: RunSettings) -> tuple[RunSettings, dict | None, object, dict | None,
                                     list[Change] | None]:
    """Check the request and work out what to test: ``(settings to run with, reference,
    workspace, good, changes)``; with a reference, the differences come later, from the
    compare."""
    cfg = common.check_common(cfg)
    check_metric(cfg.metric, target=as_dict(cfg.target))
    if not 0.5 < cfg.confidence < 1.0:
        raise UserError(f"confidence must be between 0.5 and 1 (exclusive), got {cfg.confidence}")
    if cfg.max_trials is not None and cfg.max_trials < 4:
        raise UserError(f"max_trials must be at least 4 (got {cfg.max_trials})")
    if cfg.reference:
        ref = compare.load_reference(cfg, str(cfg.reference))
        cfg = evolve(cfg, repo=cfg.repo or ref.get("repo"))
        ws = common.workspace(cfg)
        ws.resolve(ref["candidate"].commit)
        cfg, ref["adopted"] = compare.adopt_reference_config(cfg, ref, ws.resolve)
        packages.require(cfg, ref["candidate"].package_dict)
        return cfg, ref, ws, None, None
    for side in ("good", "bad"):  # saved absolute, so that a resume finds them from anywhere
        spec = _spec(getattr(cfg, side))
        if "patches" in spec:
            cfg = evolve(cfg, {f"{side}.patches": spec["patches"]})
    good, changes = changes_between(*_with_fixed_pins(cfg, _spec(cfg.good), _spec(cfg.bad)))
    if not changes:
        raise UserError("good and bad are the same configuration: nothing to isolate")
    ws = common.workspace(cfg)
    bad = changes_between(*reversed(_with_fixed_pins(cfg, _spec(cfg.good), _spec(cfg.bad))))[0]
    _check_changes(cfg, ws, good, bad, changes)
    return cfg, None, ws, good, changes


def _with_fixed_pins(cfg: RunSettings, good: dict, bad: dict) -> tuple[dict, dict]:
    """`packages=[...]` pins both sides; a side's own pin of the same package wins."""
    fixed = packages.fixed_pins(cfg)
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
    cfg, ref, ws, good, changes = _plan(cfg)
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    return _execute(cfg, run_dir, store, ref, ws, good, changes)


def resume(run_dir: Path) -> int:
    """Finish an interrupted isolate: every finished trial is evidence again (the points are
    found back from the trials' candidates), interrupted ones are run again. With a reference,
    a compare that had finished is not repeated."""
    store = RunStore.open(run_dir / "trials.db")
    try:
        if store.command != "isolate":
            raise UserError(f"{run_dir.name} is not an isolate run")
        cfg = load_saved(store.config_yaml())
        refuse_redacted(cfg, run_dir.name)
        cfg, ref, ws, good, changes = _plan(cfg)
    except BaseException:
        store.close()
        raise
    store.interrupt_unfinished()
    render.console().print(common.resume_notice(run_dir, store))
    store.set_status("running")
    return _execute(cfg, run_dir, store, ref, ws, good, changes)


def _execute(cfg: RunSettings, run_dir: Path, store: RunStore, ref: dict | None, ws,
             good: dict | None, changes: list[Change] | None) -> int:
    out = render.console()
    with running(store, run_dir, out) as run:
        if ref is not None and ref.get("adopted"):
            out.print("measuring with the reference's settings: " + ", ".join(ref["adopted"]))
        with Progress(out) as progress, \
                Controller(cfg, store, run_dir, on_event=progress.on_event) as ctl:
            if ref is not None:
                done = run_dir / "findings-compare.json"
                if done.exists():  # a resumed run: the compare finished before
                    cdoc = json.loads(done.read_text())
                    out.print(f"the compare finished before: {cdoc['message']}")
                else:
                    cdoc = compare.execute(cfg, ctl, run_dir, ref, out, findings_name="compare",
                                           progress=progress)
                if cdoc["verdict"] != "not_reproduced":
                    run.status = "done" if cdoc["verdict"] == "reproduced" else "inconclusive"
                    out.print("nothing to isolate: the reference "
                              + ("reproduces" if cdoc["verdict"] == "reproduced" else
                                 "could not be decided"))
                    return 0 if cdoc["verdict"] == "reproduced" else 3
                result = isolate_system(cfg, ctl, run_dir, ref, cdoc, ws.resolve, out, progress)
                if result is None:
                    run.status = "inconclusive"
                    return 3
                verdict, _ = result
            else:
                assert good is not None and changes is not None
                verdict, _ = execute(cfg, ctl, run_dir, good, changes, ws.resolve, out,
                                     progress=progress)
        from orchestrator.ui.report.ranking import load_docs, rank
        from orchestrator.ui.report.terminal import print_answer

        ranked = rank(load_docs(run_dir), store.trials())
        changed = [c.to_json() for c in system_changes(store.trials())]
        if changed and ranked.get("answer"):  # one system per comparison (answer/epochs.py)
            mark_system_change(ranked["answer"], changed, remeasured=["isolate"],
                               not_comparable=["the reference re-measured now"] if ref else ())
        if ref is not None:
            findings.write(run_dir, ranked)
        print_answer(out, ranked.get("answer"))
        ok = verdict.status == "found" and not changed
        run.status = "done" if ok else "inconclusive"
        return 0 if ok else 3
