"""`sleuth compare reference=RUN_DIR_OR_FINGERPRINT`: does an earlier result still reproduce?

Re-measures the reference's whole configuration now (its candidate: code, patches, env, clock,
server settings; and the target and bench settings its trials ran with) over fresh restarts,
and decides with an interval whether the reference numbers reproduce. A setting on the compare's
command line that would change that configuration is refused: it would make "different result"
mean "different experiment". If the numbers do not reproduce, the code is not the cause ("same
code, different result -> system level"): the fingerprint diff between then and now (the
server's own environment both times) lists what changed, ranked by the mechanism the trials show
(:mod:`orchestrator.system.mechanism`), with the differences sleuth can set per trial marked, ready for
`sleuth isolate`.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from orchestrator import answer
from orchestrator.answer import phases
from orchestrator.answer.epochs import mark_system_change
from orchestrator.answer.headline import refresh
from orchestrator.answer.provisional import so_far
from orchestrator.commands import common, next_step, parts
from orchestrator.commands.compare_findings import CHANGE_CONFIDENCE, findings_doc, print_findings
from orchestrator.commands.compare_reference import adopt_reference_config, load_reference
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import CompareRequest, compare_reference
from orchestrator.config.settings import RunSettings, evolve
from orchestrator.control import packages
from orchestrator.control.controller import Controller
from orchestrator.errors import RunInterrupted, UserError, answer_exit
from orchestrator.metrics import effect_metrics
from orchestrator.records import Candidate, Outcome
from orchestrator.reference import record as log_record
from orchestrator.reference.diff import differences
from orchestrator.run import findings
from orchestrator.run.rundir import running
from orchestrator.stats import caveats
from orchestrator.stats.effect import log_difference, log_effect
from orchestrator.system import mechanism
from orchestrator.system.fingerprint import relevant_env
from orchestrator.system.fingerprint_diff import Difference
from orchestrator.system.watch import system_changes
from orchestrator.ui import render
from orchestrator.ui.progress import Progress
from orchestrator.ui.report.terminal import print_answer

MIN_DF = 4


def decide(ref: list[float], now: list[float], min_effect_pct: float, confidence: float,
           final: bool = False, bound_pct: float = 10.0) -> tuple[str, dict]:
    """reproduced | not_reproduced | unresolved, from a log-scale interval of now vs then.

    The restart-to-restart variance is pooled over both sides, so a reference of a single
    restart (the common case: one number from an earlier session) still gets an honest
    interval, under the stated assumption that restart noise on the node is what it was then.

    "not_reproduced" needs the :data:`CHANGE_CONFIDENCE` interval to exclude no change, an
    estimate of at least `min_effect_pct`, and :data:`MIN_DF` degrees of freedom. "reproduced"
    means the `confidence` interval lies within +-`min_effect_pct`. A few reference restarts
    cannot pin a value that closely (the old restart's own noise stays in the estimate), so
    once the budget is spent (`final`) an interval within +-`bound_pct` is "reproduced" with
    `bounded` set: no change of the size being chased was confirmed, and one beyond the
    interval's ends is ruled out, which is what the answer then says (with the small change
    that may remain, when the interval excludes zero). A wider interval stays "unresolved":
    it would rule out too little to be called a reproduction."""
    logs = ([math.log(v) for v in ref], [math.log(v) for v in now])
    d = log_difference(*logs, confidence=confidence)
    e = d.to_effect(len(ref), len(now), confidence)
    strict = log_effect(ref, now, confidence=max(confidence, CHANGE_CONFIDENCE))
    lo, hi = e.ci
    bounded = False
    enough = len(ref) + len(now) - 2 >= MIN_DF
    if enough and (strict.ci[0] > 0 or strict.ci[1] < 0) and abs(e.pct) >= min_effect_pct:
        verdict = "not_reproduced"
    elif enough and -min_effect_pct < lo and hi < min_effect_pct:
        verdict = "reproduced"
    elif final and -bound_pct < lo and hi < bound_pct:
        verdict, bounded = "reproduced", True
    else:
        verdict = "unresolved"
    return verdict, {"pct": e.pct, "ci": [lo, hi], "p_value": e.p_value, "n": [len(ref), len(now)],
                     "bounded": bounded, "log": [d.diff, d.se, d.df],
                     "before": statistics.fmean(ref), "after": statistics.fmean(now)}


def run(cfg: RunSettings) -> int:
    compare_reference(cfg)  # the one argument it cannot do without, refused before the rest
    cfg = common.check_common(cfg)
    req = CompareRequest.of(cfg)
    metric = req.metric
    ref = load_reference(cfg, req.reference)
    if not cfg.repo:
        if not ref.get("repo"):
            raise UserError("the reference does not say which repository: add repo=PATH")
        cfg = evolve(cfg, repo=ref["repo"])
    ws = common.workspace(cfg)
    cfg, adopted = adopt_reference_config(cfg, ref, ws.resolve)
    cand: Candidate = ref["candidate"]
    ws.resolve(cand.commit)
    ref_values = ref["values"].get(metric, [])
    if not ref_values and log_record.no_level(ref, metric) is None:
        raise UserError(f"the reference has no measured {metric} value")
    packages.require(parts.package_plan(cfg), cand.package_dict)  # the reference's own pins, built again if need be
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    out = render.console()
    with running(store, run_dir, out) as run:
        if adopted:
            out.print("measuring with the reference's settings: " + ", ".join(adopted))
        with Progress(out, done=store.trials()) as progress, \
                Controller(parts.control(cfg), store, run_dir, on_event=progress.on_event) as ctl:
            doc = execute(cfg, req, ctl, run_dir, ref, out, progress=progress)
        changed = [c.to_json() for c in system_changes(store.trials())]
        if changed and doc.get("answer"):  # one system per comparison: not this one
            mark_system_change(doc["answer"], changed,
                               not_comparable=["the reference re-measured now"])
            refresh(doc["answer"])
            findings.write(run_dir, doc)
        print_answer(out, doc.get("answer"))
        code = answer_exit(doc.get("answer"))
        run.status = "done" if code == 0 else "inconclusive"
        return code


def execute(cfg: RunSettings, req: CompareRequest, ctl: Controller, run_dir: Path, ref: dict,
            out, findings_name: str | None = None, progress: Progress | None = None) -> dict:
    """Re-measure `ref["candidate"]` in batches until the decision is made; write findings.
    `req` is what is compared (a step of a longer run passes its own budget: an isolate's
    `max_trials`, none for an investigation's)."""
    cand: Candidate = ref["candidate"]
    rule = _Rule.of(cfg, req, ref, run_dir, out)
    out.print(f"re-measuring the reference candidate of {ref['name']}: {cand.label}")
    if progress is not None:  # an earlier experiment's state would mislead
        progress.set_total(None)
        progress.on_verdict("comparing", None, None)
    now_rows = _finished(ctl, cand)  # a resumed run's (an interrupted one is run again)
    verdict, eff = rule.decide(now_rows) if now_rows else ("unresolved", {})
    try:
        while verdict == "unresolved" and len(now_rows) < rule.max_trials:
            for _ in range(min(rule.batch, rule.max_trials - len(now_rows))):
                while not ctl.idle_nodes():
                    now_rows += ctl.wait()
                ctl.submit(cand, phase="compare")
            while ctl.in_flight():
                now_rows += ctl.wait()
            verdict, eff = rule.decide(now_rows)
    except (KeyboardInterrupt, RunInterrupted):
        _stopped(cfg, req, ctl, run_dir, ref, rule, findings_name, out)
        raise
    doc, ranked = _document(cfg, req, ctl, ref, now_rows, verdict, eff, rule.min_effect)
    if progress is not None:
        progress.on_verdict(verdict.replace("_", " "), None, None)
    path = findings.write(run_dir, doc, findings_name)
    print_findings(out, doc, ranked)
    out.print(f"findings: {path}")
    return doc


@dataclass(frozen=True)
class _Rule:
    """When the compare decides: its batches, its budget, the min effect, against the
    reference's values of the metric."""

    metric: str
    ref_values: tuple[float, ...]
    batch: int
    max_trials: int
    min_effect: float
    bound_pct: float | None

    @classmethod
    def of(cls, cfg: RunSettings, req: CompareRequest, ref: dict, run_dir: Path,
           out) -> _Rule:
        """The rule, and what the reference's record tells (an old log: what it cannot)."""
        params = experiment_params.of(cfg)
        batch = params.batch or 3
        max_trials = int(req.max_trials or params.max_trials or 9)
        log_record.keep(run_dir, ref)  # a resumed run reads the log as it was read now
        for line in log_record.describe(ref):
            out.print(line)
        missing = log_record.no_level(ref, req.metric)
        if missing:  # measured once, for the fingerprint now: no level to decide against
            out.print(f"{missing}: the compare measures the configuration now for its"
                      " fingerprint only")
            max_trials = min(max_trials, batch)
        return cls(req.metric, tuple(ref["values"].get(req.metric, [])), batch, max_trials,
                   params.min_effect_pct if params.min_effect_pct is not None else 3.0,
                   params.bound_pct)

    def decide(self, now_rows: list) -> tuple[str, dict]:
        now_vals = [v for r in now_rows if r.outcome.measured and not r.suspect
                    and (v := r.result.value(self.metric)) is not None]
        if len(now_vals) < 2 or not self.ref_values:
            return "unresolved", {}
        return decide(list(self.ref_values), now_vals, self.min_effect, 0.95,
                      final=len(now_rows) >= self.max_trials, bound_pct=self.bound_pct)


def _finished(ctl: Controller, cand: Candidate) -> list:
    """The compare's finished restarts of `cand` (an interrupted one does not count)."""
    return [r for r in ctl.store.trials() if r.phase == "compare" and r.finished
            and r.candidate.key == cand.key and r.outcome is not Outcome.INTERRUPTED]


def _stopped(cfg: RunSettings, req: CompareRequest, ctl: Controller, run_dir: Path, ref: dict,
             rule: _Rule, findings_name: str | None, out) -> None:
    """Interrupted: what is known so far, stored before the run stops (`sleuth report` shows
    it). Best effort: nothing here may turn a clean stop into a crash."""
    try:
        now_rows = _finished(ctl, ref["candidate"])
        doc, _ = _document(cfg, req, ctl, ref, now_rows, *rule.decide(now_rows),
                           rule.min_effect)
        doc["answer"] = so_far(doc["answer"], why=f"interrupted after {len(now_rows)}"
                               " restarts", searching=False, keep_sentence=True)
        doc["provisional"] = doc["answer"]["provisional"]
        findings.write(run_dir, doc, findings_name)
        if findings_name is None:  # its own run (a longer one says the whole answer)
            out.print("")
            print_answer(out, doc["answer"])
    except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
        out.print(f"(the answer so far could not be stored: {exc})")


def _document(cfg: RunSettings, req: CompareRequest, ctl: Controller, ref: dict,
              now_rows: list, verdict: str, eff: dict, min_effect: float
              ) -> tuple[dict, list[tuple[Difference, str]]]:
    """The compare's findings document (with its answer) from the restarts measured now, and
    the fingerprint differences ranked by mechanism; the same for a finished compare and for
    one interrupted before it decided."""
    metric = req.metric
    measured = [r for r in now_rows if r.outcome and r.outcome.measured and not r.suspect]
    effects = {}
    for m in effect_metrics(metric):
        a = ref["values"].get(m, [])
        b = [v for r in measured if (v := r.result.value(m)) is not None]
        if a and len(b) >= 2 and min(a + b) > 0:
            effects[m] = decide(a, b, min_effect, 0.95)[1]
    now_fps = [r.result.fingerprint for r in measured]
    ref_fps = ref.get("fingerprints") or [ref["fingerprint"]]
    effects = caveats.qualify(effects, headline=metric,
                              loads=(caveats.mean_load(ref_fps), caveats.mean_load(now_fps)),
                              cpus=((now_fps[-1].get("host") or {}).get("cpus") if now_fps else None))
    ranked: list[tuple[Difference, str]] = []
    if measured:
        diffs = differences(ref["fingerprint"], now_fps[-1]) + _not_reaching(now_fps[-1])
        ref_telemetry = ref.get("telemetry") or [fp.get("telemetry") for fp in ref_fps]
        s = mechanism.signals(effects, ref_telemetry, [fp.get("telemetry") for fp in now_fps])
        ranked = mechanism.rank(diffs, s)
    doc = findings_doc(ctl.store.run_id, metric, verdict, eff, effects, ranked, ref,
                       [r.id for r in now_rows])
    doc["differences"] = [d.to_json() for d, _ in ranked]
    doc["min_effect_pct"] = min_effect  # what "reproduces" was judged against
    missing = log_record.no_level(ref, metric)
    if missing:
        doc["message"] = f"no level to compare against: {missing}"
        doc["no_level"] = missing
    if ref.get("log"):
        doc["reference"]["log"] = {k: ref["log"][k] for k in ("knows", "unknown", "files",
                                                              "commit") if k in ref["log"]}
    doc["answer"] = answer.for_compare(
        doc, mechanism=phases.mechanism(
            ref["values"], {m: [v for r in measured if (v := r.result.value(m)) is not None]
                            for m in phases.SIDE_METRICS},
            ref.get("telemetry") or [fp.get("telemetry") for fp in ref_fps],
            [fp.get("telemetry") for fp in now_fps], before_label="reference",
            after_label="now"),
        next_step=(next_step.command(cfg, "isolate", f"reference={_reference_arg(req, ref)}")
                   if verdict == "not_reproduced" else ""))
    return doc, ranked


def finished(run_dir: Path, name: str = "compare") -> dict | None:
    """The findings of a compare that finished in an earlier part of a resumed run, or None:
    one interrupted before it decided stored its answer so far (`provisional`), and is
    measured again (its finished restarts count)."""
    path = run_dir / f"findings-{name}.json"
    if not path.exists():
        return None
    doc = json.loads(path.read_text())
    return None if doc.get("provisional") else doc


def _reference_arg(req: CompareRequest, ref: dict) -> str:
    """How a next command names this reference: a fingerprint file by its absolute path (the
    next command may run elsewhere), a run by its id in this runs_dir."""
    if log_record.is_log(req.reference):  # the files it read, absolute: the next step may
        return log_record.PREFIX + ",".join(ref["log"]["files"])  # run from elsewhere
    given = Path(req.reference or "")
    given = given.expanduser()
    if given.is_file():
        return str(given.resolve())
    return str(ref["name"])


def _not_reaching(now_fp: dict) -> list[Difference]:
    """Variables set where sleuth runs (this controller) that the server does not have: on a
    cluster the controller's environment does not travel to the nodes, and a user who
    exported NCCL_ALGO in the shell that starts sleuth expects it in the server. Only the
    variables that steer the GPU libraries count; the node's own drops are in the diff."""
    env = now_fp.get("env") or {}
    if env.get("source") != "process":
        return []
    server = env.get("server") or {}
    dropped = env.get("not_received") or {}
    return [Difference("env_dropped", var, value, server.get(var),
                       "set where sleuth runs (the controller) but not in the server's"
                       " environment: the node does not inherit it")
            for var, value in sorted(relevant_env(dict(os.environ)).items())
            if var not in server and var not in dropped]
