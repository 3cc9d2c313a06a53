"""The investigation's answer from its trials and its steps' documents.

`investigate.execute` runs the steps; this module reads what they measured into one answer:
the total change (:func:`whole`), within the latest system epoch, the causes the steps named,
the mechanism, what a changed node leaves not comparable (:func:`epoch_parts`), the yardstick
the code range is judged against when the system changed (:func:`code_yardstick`), and the next
command when the cause is not in the code. The final check and an interrupted run's "so far"
build their answers here too, from whatever trials exist at that moment.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from orchestrator.answer.combine import LogChange
from orchestrator.answer.epochs import mark_system_change
from orchestrator.answer.headline import refresh
from orchestrator.answer.phases import log_change, mechanism
from orchestrator.answer.text import commit_label
from orchestrator.answer.triage import for_investigation
from orchestrator.commands import next_step
from orchestrator.commands.final_check import FINAL_PHASE, refreshed, total_rows
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import InvestigateRequest, SweepRequest
from orchestrator.config.settings import RunSettings
from orchestrator.errors import UserError
from orchestrator.records import Candidate
from orchestrator.run import findings
from orchestrator.store import RunStore
from orchestrator.system.watch import system_changes
from orchestrator.workspace import CommitInfo


@dataclass
class Plan:
    """What an investigation measures, worked out before anything is written."""

    reference: dict | None  # compare.load_reference's record, or None (good=REF bad=REF)
    base: Candidate  # the good state's candidate (the reference's own, or good= as given)
    bad: str  # the bad commit's SHA
    commits: list[CommitInfo]  # the range good..bad (empty when bad is the same commit)
    points: list[Candidate]
    weights: list[float] | None
    sweep: SweepRequest | None  # recover=true: the sweep on the bad commit
    request: InvestigateRequest  # what was asked: metric, ends, budget (`config/requests.py`)
    # A reference without a level of the metric (an old log that never printed it): the
    # isolate's recreation of its configuration, measured now, stands in for "then".
    recreated: Candidate | None = None

    @property
    def bad_candidate(self) -> Candidate:
        return self.points[-1] if self.points else self.base


def incomplete(docs: dict[str, dict]) -> str | None:
    """Why the answer is only as far as known: a step that stopped at its budget or cap."""
    b, i = docs.get("bisect") or {}, docs.get("isolate") or {}
    if b.get("verdict") == "budget_exhausted":
        return f"the bisect stopped: {b['answer']['provisional']['why']}" if (
            b.get("answer") or {}).get("provisional") else "the bisect's budget was spent"
    if i.get("verdict") in ("budget_exhausted", "inconclusive"):
        limit = "budget" if i["verdict"] == "budget_exhausted" else "cap"
        return f"the isolate stopped at its {limit}"
    return None


def label(cand: Candidate, commits: list[CommitInfo], ws) -> str:
    subject = next((c.subject for c in commits if c.sha == cand.commit), None)
    if subject is None:
        try:
            subject = ws.commit_info(cand.commit).subject
        except UserError:  # a label without a subject is still a label
            subject = None
    return commit_label(cand.commit, subject)


def whole(cfg: RunSettings, rows, p: Plan) -> tuple[LogChange | None, dict]:
    """The change to explain: the bad commit now against the reference then (or, without a
    reference, the good and the bad commit now), pooling the run's restart noise.

    Without a reference both endpoints are measured now, and the change is read from the final
    check's restarts alone once it has two of each
    (:func:`orchestrator.commands.final_check.final_check`): they ran interleaved,
    in one time window, so a host that got busier while the bisect ran (the good endpoint
    measured in the first minutes, the bad one an hour later) cannot invent a change."""
    metric = p.request.metric
    bad_key = p.bad_candidate.key
    after = findings.trial_values(rows, bad_key, metric)
    window = ""
    start = p.recreated or (p.base if p.reference is None else None)
    if start is None:
        before = list(p.reference["values"].get(metric, []))
    else:
        before = findings.trial_values(rows, start.key, metric)
        last = [r for r in rows if r.phase == FINAL_PHASE]
        a, b = (findings.trial_values(last, key, metric) for key in (start.key, bad_key))
        if min(len(a), len(b)) >= 2:
            before, after, window = a, b, "final check"
    ss, df = findings.pooled_log_ss(rows, metric, ((start or p.base).key, bad_key))
    change = log_change(before, after, ss, df) if before and after else None
    extra = {"before": sum(before) / len(before) if before else None,
             "after": sum(after) / len(after) if after else None,
             "n": [len(before), len(after)]}
    if window:
        extra["window"] = window
    return change, extra


def phase_mechanism(rows, p: Plan) -> dict:
    bad_key = p.bad_candidate.key
    after = findings.side_values(rows, bad_key)
    if p.recreated is not None:
        before = findings.side_values(rows, p.recreated.key)
        before_tel = findings.side_telemetry(rows, p.recreated.key)
        label = "recreated"
    elif p.reference is not None:
        before = p.reference["values"]
        before_tel = p.reference.get("telemetry") or []
        label = "reference"
    else:
        before = findings.side_values(rows, p.base.key)
        before_tel = findings.side_telemetry(rows, p.base.key)
        label = "good"
    return mechanism(before, after, before_tel, findings.side_telemetry(rows, bad_key),
                     before_label=label, after_label="now")


def answer(cfg: RunSettings, rows, p: Plan, docs: dict[str, dict], ws,
           check: dict | None = None, *, marks: dict[str, int] | None = None,
           yardstick: dict | None = None) -> dict:
    """The investigation's answer from the trials so far and the steps' documents, within one
    system: the latest epoch, where the bad state was measured (a node that changed during
    the run is said in the answer, with what was measured again and what is not comparable)."""
    metric = p.request.metric
    ends = [p.bad_candidate.key] if p.reference is not None else [p.base.key,
                                                                   p.bad_candidate.key]
    if p.recreated is not None:
        ends = [p.recreated.key, p.bad_candidate.key]
    now_rows, total_now = total_rows(rows, ends, metric)  # never two systems pooled
    change, extra = whole(cfg, now_rows, p)
    bad_label = label(p.bad_candidate, p.commits, ws) + " now"
    if p.recreated is not None:  # the reference holds no level: its configuration, now
        start = (f"the reference's configuration recreated now ({label(p.base, p.commits, ws)};"
                 f" {p.reference['name']} holds no {metric})")
    elif p.reference is not None:
        start = f"the reference ({label(p.base, p.commits, ws)}, then)"
    else:
        start = label(p.base, p.commits, ws) + " now"
    hint, next_command = next_step_of(cfg, p, docs)
    changed = [c.to_json() for c in system_changes(rows)]
    result = for_investigation(
        metric, change, whole_extra=extra, reference=start, bad=bad_label,
        compare_doc=docs.get("compare"), isolate_doc=refreshed(docs.get("isolate"), rows, metric),
        bisect_doc=refreshed(docs.get("bisect"), rows, metric), sweep_doc=docs.get("sweep"),
        mechanism=phase_mechanism(now_rows, p), next_step=next_command,
        min_effect_pct=experiment_params.of(cfg).min_effect_pct, check=check,
        compare_stale=bool(changed))
    if hint:
        result["hint"] = hint
    if changed:
        mark_system_change(result, changed, **epoch_parts(
            rows, changed[-1], marks or {}, total_now=total_now,
            set_aside=int((check or {}).get("set_aside") or 0)))
    merges = ((docs.get("bisect") or {}).get("answer") or {}).get("merges")
    if merges:  # a first-parent culprit that is a merge: the command that searches its branch
        result["merges"] = merges
        result["next"] = result.get("next") or merges[0]["command"]
    if yardstick is not None:
        result["code_yardstick"] = {k: v for k, v in yardstick.items() if k != "level"}
        result["sentence"] += f"; {yardstick['said']}"
    return refresh(result)


def epoch_parts(rows, change: dict, marks: dict[str, int], *, total_now: bool = True,
                set_aside: int = 0) -> dict[str, list[str]]:
    """Which steps ran on the new state after a node changed (the isolate and the bisect take
    their decisions again on the new system's trials) and which ran only before it, from the
    first trial id of each step (`marks`, in the order the steps ran).

    The total is re-measured when the final check measured its endpoints on the new state
    (`total_now`), else it is from before the change and not comparable; `set_aside` final-check
    restarts from before the change were not pooled with the new ones. The remainder (the total
    less the causes) is comparable only when the total and every cause-naming step are from
    the new state."""
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
    if set_aside:
        remeasured.append(f"the final check ({set_aside} restart{'s' if set_aside > 1 else ''}"
                          " from before the change set aside)")
    if total_now:
        remeasured.append("the total (the bad state now)")
    else:
        stale.append("the total (the final check's budget ran out before it measured the"
                     " endpoints on the new state)")
    if not total_now or {"isolate", "bisect"} & set(stale):
        stale.append("the remainder (the total less causes measured on another system)")
    return {"remeasured": remeasured, "not_comparable": stale}


def code_yardstick(cfg: RunSettings, rows, p: Plan, compare_doc: dict | None) -> dict | None:
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
    metric = p.request.metric
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


def next_step_of(cfg: RunSettings, p: Plan, docs: dict[str, dict]) -> tuple[str, str]:
    """Without a reference, a range that does not reproduce sends the user to the system:
    (a hint naming earlier runs that measured the good commit, the complete command that
    continues from the first of them). Without such a run there is no command to give yet."""
    if p.reference is not None or (docs.get("bisect") or {}).get("verdict") != "not_reproducible":
        return "", ""
    bad = str(p.request.bad)
    found = reference_runs(cfg.runs_root, p.base.commit, exclude=str(cfg.run_id))
    if found:
        return (f"runs that measured {p.base.commit[:12]} earlier: {', '.join(found)}; the next"
                " step tests the system against the first",
                next_step.command(cfg, "investigate", f"reference={found[0]}", f"bad={bad}"))
    return (f"no earlier run in {cfg.runs_root} measured {p.base.commit[:12]}: with one (or a"
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
