"""The steps of `sleuth investigate` on a running controller, one method each: the compare,
the system's isolate (and the release its package cause names), the code's bisect, the
recovery sweep, the final check; and what a stopped run keeps (at its `budget=`, or
interrupted). `investigate.execute` drives them in that order.

One object holds what the steps share, so that no step closes over another's locals: the
findings documents so far by step, the first trial of each step (a node that changes mid-run
is judged per step), the step running (what an interruption names) and the code's yardstick.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.answer.provisional import so_far
from orchestrator.commands import (
    bisect,
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
from orchestrator.config.requests import CompareRequest
from orchestrator.config.settings import RunSettings
from orchestrator.control.controller import Controller
from orchestrator.evidence import collect as evidence
from orchestrator.evidence import plan as evidence_plan
from orchestrator.records import Candidate
from orchestrator.reference import record as log_record
from orchestrator.run import findings
from orchestrator.run.plan import BudgetSpent
from orchestrator.ui.progress import Progress
from orchestrator.ui.report.terminal import print_answer


class Steps:
    """One investigation's steps over one controller and run directory."""

    def __init__(self, cfg: RunSettings, ctl: Controller, run_dir: Path, p: Plan, ws, out,
                 progress: Progress | None = None):
        self.cfg, self.ctl, self.run_dir, self.p, self.ws = cfg, ctl, run_dir, p, ws
        self.out, self.progress = out, progress
        self.req = p.request
        self.docs: dict[str, dict] = {}
        self.marks: dict[str, int] = {}  # the first trial id of each step
        self.step = "start"
        self.yardstick: dict | None = None
        self.planned = investigate_plan.start(cfg, ctl, run_dir, p, out)
        self.planned.marks = self.marks

    def begin(self, step: str, title: str) -> None:
        self.step = step
        self.out.print(f"\n== {title} ==")
        self.marks[step] = max((r.id for r in self.ctl.store.trials()), default=0) + 1

    def run(self) -> dict:
        """Every step in order; returns the answer the final check settled."""
        if self.p.reference is not None:
            self.compare()
            if self.docs["compare"]["verdict"] in ("not_reproduced", "unresolved"):
                self.system()
        if self.p.commits:
            self.code()
        if self.p.sweep is not None:
            self.recover()
        if self.p.commits:
            investigate_plan.after_step(self.planned, "bisect", self.ctl.store.trials(),
                                        self.out)
        return self.check()

    def compare(self) -> None:
        self.begin("compare", "the reference, re-measured now")
        earlier = compare.finished(self.run_dir)
        if earlier is not None:  # a resumed run: the compare finished before
            self.docs["compare"] = earlier
            self.out.print(f"the compare finished before: {earlier['message']}")
        else:  # the compare keeps its own budget: max_trials is the bisect's and the isolate's
            self.docs["compare"] = compare.execute(
                self.cfg, CompareRequest.step(self.cfg, max_trials=None), self.ctl,
                self.run_dir, self.p.reference, self.out, findings_name="compare",
                progress=self.progress)
        investigate_plan.after_compare(self.planned, self.cfg, self.docs["compare"],
                                       self.ctl.store.trials(), self.out)

    def system(self) -> None:
        self.begin("isolate", "the system: which differences cause it")
        cdoc = self.docs["compare"]
        if cdoc["verdict"] == "unresolved":
            self.out.print(isolate.undecided_compare(cdoc))
        isolated = isolate.isolate_system(self.cfg, self.req.isolate_step(), self.ctl,
                                          self.run_dir, self.p.reference, cdoc,
                                          self.ws.resolve, self.out, self.progress)
        if isolated is not None:
            self.docs["isolate"] = isolated[1]
            self.p.recreated = recreated(self.p.reference, self.req.metric, isolated[1])
            found = investigate_release.follow(self.cfg, self.req, self.ctl, self.run_dir,
                                               isolated[1], self.out, self.progress)
            if found is not None:  # the isolate's package cause now names the release
                self.docs["release"] = found
        investigate_plan.after_step(self.planned, "isolate", self.ctl.store.trials(), self.out)

    def code(self) -> None:
        self.begin("bisect", "the code: bisect the range under today's system")
        p = self.p
        self.yardstick = investigate_answer.code_yardstick(
            self.cfg, self.ctl.store.trials(), p, self.docs.get("compare"))
        if self.yardstick is not None:
            self.out.print(self.yardstick["line"])
        for line in investigate_plan.reuse_lines(self.ctl.store.trials(), [p.base.key],
                                                 self.marks, "bisect", "its good end"):
            self.out.print(line)
        _, self.docs["bisect"] = bisect.execute(
            self.cfg, self.req.bisect_step(p.base.commit, p.bad), self.ctl, self.run_dir,
            p.commits, p.points, p.weights, self.out, findings_name="bisect",
            progress=self.progress,
            reference=self.yardstick["level"] if self.yardstick else None)

    def recover(self) -> None:
        self.begin("sweep", "recover: a short sweep on the bad commit as the node is now")
        _, self.docs["sweep"] = sweep.execute(self.cfg, self.p.sweep, self.ctl, self.run_dir,
                                              self.p.bad_candidate, self.out,
                                              progress=self.progress, findings_name="sweep")
        findings.write(self.run_dir, self.docs["sweep"], "sweep")

    def answer(self, rows, check: dict | None = None) -> dict:
        return investigate_answer.answer(self.cfg, rows, self.p, self.docs, self.ws, check,
                                         marks=self.marks, yardstick=self.yardstick)

    def check(self) -> dict:
        """The final check: the endpoints interleaved until the remainder decides."""
        self.step = "final check"
        p = self.p
        both = (p.reference is None and p.bad_candidate.key != p.base.key
                or p.recreated is not None)
        first = p.recreated if p.recreated is not None else p.base
        return final_check(self.ctl, [first, p.bad_candidate] if both else [p.bad_candidate],
                           self.answer, experiment_params.of(self.cfg).final_trials,
                           self.out, self.progress, metric=self.req.metric)

    def at_budget(self, reached: BudgetSpent) -> dict:
        """The answer so far at the run's `budget=`, and what finishing would cost."""
        self.out.print(f"\n{reached.why}: the answer so far")
        read_stored(self.run_dir, self.docs)  # the interrupted step stored its findings so far
        rows = self.ctl.store.trials()
        return investigate_plan.at_budget(self.answer(rows), self.planned, rows, reached.why,
                                          self.req.confidence)

    def interrupted(self) -> None:
        """Ctrl-C or SIGTERM: the answer so far, stored and said. Best effort: nothing here
        may turn a clean stop into a crash."""
        try:
            done = sum(1 for r in self.ctl.store.trials() if r.finished)
            stopped(self.cfg, self.ctl, self.run_dir, self.p, self.docs, self.ws, self.out,
                    f"interrupted during the {self.step} after {done} restarts",
                    marks=self.marks, yardstick=self.yardstick)
        except Exception as exc:  # noqa: BLE001 - the interrupt is what the user must see
            self.out.print(f"(the answer so far could not be stored: {exc})")

    def kernels(self, result: dict) -> None:
        """Each named cause's two sides, profiled (`evidence.kernels`)."""
        if not (evidence_plan.kernels_enabled(self.cfg.evidence, self.cfg.target) and result.get("causes")):
            return
        self.out.print("\n== kernel evidence: each named cause's two sides, profiled ==")
        result["evidence"] = evidence.for_causes(
            self.ctl, result["causes"], self.p.bad_candidate, self.p.base,
            [self.docs.get("bisect"), self.docs.get("isolate")], self.ws.resolve,
            restarts=self.cfg.evidence.restarts, max_causes=self.cfg.evidence.max_causes,
            say=self.out.print, attribution=result.get("attribution"))

    def document(self, result: dict) -> dict:
        """The investigation's own findings document, written."""
        return document(self.ctl, self.run_dir, self.req.metric, self.docs, result)


def document(ctl: Controller, run_dir: Path, metric: str, docs: dict[str, dict], result: dict
             ) -> dict:
    """`findings-investigate.json`: the answer (`result`) and which steps ran."""
    doc = {"run": ctl.store.run_id, "experiment": "investigate", "metric": metric,
           "verdict": result["status"], "message": result["sentence"], "findings": [],
           "steps": list(docs), "n_trials": len(ctl.store.trials()), "answer": result}
    if "provisional" in result:
        doc["provisional"] = result["provisional"]
    findings.write(run_dir, doc, "investigate")
    return doc


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
    document(ctl, run_dir, p.request.metric, docs, result)
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
