"""`sleuth compare reference=RUN_DIR_OR_FINGERPRINT`: does an earlier result still reproduce?

Re-measures the reference's exact candidate now (same code, patches, env, clock, server
settings) over fresh restarts, and decides with an interval whether the reference numbers
reproduce. If they do not, the code is not the cause ("same code, different result -> system
level"): the fingerprint diff between then and now lists what changed, most plausible first,
with the differences sleuth can set per trial marked, ready for `sleuth isolate`.
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from orchestrator import findings, render
from orchestrator.commands import common
from orchestrator.controller import Controller
from orchestrator.errors import UserError
from orchestrator.fingerprint_diff import Difference, diff
from orchestrator.metrics import EFFECT_METRICS, check_metric
from orchestrator.progress import Progress
from orchestrator.records import Candidate
from orchestrator.rundir import create_run, find_run, running
from orchestrator.stats.effect import log_effect
from orchestrator.store import RunStore


def load_reference(cfg: DictConfig, ref: str) -> dict:
    """The reference: its candidate, trial-level values per metric, fingerprint, repo."""
    path = Path(ref).expanduser()
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"reference {ref}: not a readable fingerprint JSON ({exc})") from exc
        if "fingerprint" not in doc or "candidate" not in doc:
            raise UserError(f"reference {ref}: a fingerprint file needs 'candidate' and 'fingerprint'")
        return {"candidate": Candidate.from_json(doc["candidate"]), "values": doc.get("values", {}),
                "fingerprint": doc["fingerprint"], "repo": doc.get("repo"), "name": path.name}
    run_dir = find_run(cfg, ref)
    store = RunStore.open(run_dir / "trials.db")
    try:
        rows = [r for r in store.trials() if r.outcome and r.outcome.measured and not r.suspect]
        if not rows:
            raise UserError(f"reference run {run_dir.name} has no measured trial")
        by_key: dict[str, list] = {}
        for r in rows:
            by_key.setdefault(r.candidate.key, []).append(r)
        chosen = max(by_key.values(), key=len)  # the candidate the reference measured most
        ref_cfg = OmegaConf.create(store.config_yaml())
    finally:
        store.close()
    values = {m: [v for r in chosen if (v := r.result.value(m)) is not None]
              for m in EFFECT_METRICS}
    return {"candidate": chosen[0].candidate, "values": {m: v for m, v in values.items() if v},
            "fingerprint": chosen[-1].result.fingerprint, "repo": ref_cfg.get("repo"),
            "name": run_dir.name, "trials": [r.id for r in chosen]}


def decide(ref: list[float], now: list[float], min_effect_pct: float, confidence: float) -> tuple[str, dict]:
    """reproduced | not_reproduced | unresolved, from a log-scale interval of now vs then.

    The restart-to-restart variance is pooled over both sides, so a reference of a single
    restart (the common case: one number from an earlier session) still gets an honest
    interval, under the stated assumption that restart noise on the node is what it was then."""
    e = log_effect(ref, now, confidence=confidence)
    lo, hi = e.ci
    if (lo > 0 or hi < 0) and abs(e.pct) >= min_effect_pct:
        verdict = "not_reproduced"
    elif -min_effect_pct < lo and hi < min_effect_pct:
        verdict = "reproduced"
    else:
        verdict = "unresolved"
    return verdict, {"pct": e.pct, "ci": [lo, hi], "p_value": e.p_value, "n": [len(ref), len(now)]}


def run(cfg: DictConfig) -> int:
    params = cfg.experiment.params
    ref_arg = params.get("reference") or cfg.get("reference")
    if not ref_arg:
        raise UserError("compare needs a reference: sleuth compare reference=RUN_DIR_OR_FINGERPRINT")
    common.check_common(cfg)
    metric = str(cfg.metric)
    check_metric(metric, target=cfg.target)
    ref = load_reference(cfg, str(ref_arg))
    if not cfg.repo:
        if not ref.get("repo"):
            raise UserError("the reference does not say which repository: add repo=PATH")
        cfg.repo = ref["repo"]
    ws = common.workspace(cfg)
    cand: Candidate = ref["candidate"]
    ws.resolve(cand.commit)
    ref_values = ref["values"].get(metric, [])
    if not ref_values:
        raise UserError(f"the reference has no measured {metric} value")
    run_dir, store = create_run(cfg)
    out = render.console()
    with running(store, run_dir, out) as run:
        with Progress(out) as progress, \
                Controller(cfg, store, run_dir, on_event=progress.on_event) as ctl:
            doc = execute(cfg, ctl, run_dir, ref, out, progress=progress)
        run.status = "done" if doc["verdict"] != "unresolved" else "inconclusive"
        return 0 if doc["verdict"] != "unresolved" else 3


def execute(cfg: DictConfig, ctl: Controller, run_dir: Path, ref: dict, out,
            findings_name: str | None = None, progress: Progress | None = None) -> dict:
    """Re-measure `ref["candidate"]` in batches until the decision is made; write findings."""
    params = cfg.experiment.params
    metric = str(cfg.metric)
    cand: Candidate = ref["candidate"]
    ref_values = ref["values"].get(metric, [])
    batch = int(params.get("batch", 3))
    max_trials = int(cfg.max_trials or params.get("max_trials", 9))
    min_effect = float(params.get("min_effect_pct", 3.0))
    out.print(f"re-measuring the reference candidate of {ref['name']}: {cand.label}")
    if progress is not None:  # an earlier experiment's state would mislead
        progress.set_total(None)
        progress.on_verdict("comparing", None, None)
    now_rows: list = []
    verdict, eff = "unresolved", {}
    while verdict == "unresolved" and len(now_rows) < max_trials:
        for _ in range(min(batch, max_trials - len(now_rows))):
            while not ctl.idle_nodes():
                now_rows += ctl.wait()
            ctl.submit(cand, phase="compare")
        while ctl.in_flight():
            now_rows += ctl.wait()
        now_vals = [v for r in now_rows if r.outcome.measured and not r.suspect
                    and (v := r.result.value(metric)) is not None]
        if len(now_vals) >= 2:
            verdict, eff = decide(ref_values, now_vals, min_effect, 0.95)
    measured = [r for r in now_rows if r.outcome and r.outcome.measured and not r.suspect]
    effects = {}
    for m in EFFECT_METRICS:
        a = ref["values"].get(m, [])
        b = [v for r in measured if (v := r.result.value(m)) is not None]
        if a and len(b) >= 2 and min(a + b) > 0:
            effects[m] = decide(a, b, min_effect, 0.95)[1]
    diffs: list[Difference] = []
    if measured:
        diffs = diff(ref["fingerprint"], measured[-1].result.fingerprint)
    doc = _findings(ctl.store.run_id, metric, verdict, eff, effects, diffs, ref,
                    [r.id for r in now_rows])
    if progress is not None:
        progress.on_verdict(verdict.replace("_", " "), None, None)
    doc["differences"] = [d.to_json() for d in diffs]
    path = findings.write(run_dir, doc, findings_name)
    _print(out, doc, diffs)
    out.print(f"findings: {path}")
    return doc


def _findings(run_id, metric, verdict, eff, effects, diffs, ref, trial_ids) -> dict:
    pct = eff.get("pct")
    if verdict == "not_reproduced":
        message = (f"same code, different result -> system level: {metric} is {pct:+.1f}% "
                   f"[{eff['ci'][0]:+.1f}, {eff['ci'][1]:+.1f}] against the reference;"
                   f" {len(diffs)} difference(s) in the fingerprint, most plausible first")
    elif verdict == "reproduced":
        message = f"the reference reproduces: {metric} {pct:+.1f}% [{eff['ci'][0]:+.1f}, {eff['ci'][1]:+.1f}]"
    else:
        message = "could not decide within the trial budget whether the reference reproduces"
    items = []
    if verdict == "not_reproduced":
        for i, d in enumerate(diffs, 1):
            items.append({
                "rank": i, "kind": "system" if d.category not in ("env", "clock", "package") else d.category,
                "id": d.key, "summary": f"{d.label} ({d.category}{', ' + d.detail if d.detail else ''})"
                + ("; controllable" if d.controllable else ""),
                # A fingerprint difference is a suspect, not a measured cause: no probability
                # until `sleuth isolate` has tested it.
                "probability": None, "effect": {}, "difference": d.to_json(),
            })
    return {"run": run_id, "experiment": "compare", "metric": metric, "verdict": verdict,
            "message": message, "reference": {"name": ref["name"], "trials": ref.get("trials", []),
                          "run": ref.get("run", True)},
            "total_effect": {m: {"pct": e["pct"], "ci": e["ci"]} for m, e in effects.items()},
            "n_trials": len(trial_ids), "findings": items}


def _print(out, doc: dict, diffs: list[Difference]) -> None:
    from rich.table import Table

    t = Table(title="now vs reference (same candidate)")
    for col in ("metric", "change", "interval"):
        t.add_column(col)
    for m, e in doc["total_effect"].items():
        t.add_row(m, f"{e['pct']:+.1f}%", f"[{e['ci'][0]:+.1f}, {e['ci'][1]:+.1f}]")
    out.print(t)
    out.print(doc["message"])
    if doc["verdict"] == "not_reproduced" and diffs:
        d = Table(title="what changed since the reference (most plausible first)")
        for col in ("#", "category", "difference", "where", "controllable"):
            d.add_column(col)
        for i, x in enumerate(diffs, 1):
            d.add_row(str(i), x.category, x.label, x.detail, "yes" if x.controllable else "no")
        out.print(d)
        if doc["reference"].get("run", True):  # a reference that is a run can be named again
            out.print(f"next: sleuth isolate reference={doc['reference']['name']} to test the"
                      " controllable differences")
