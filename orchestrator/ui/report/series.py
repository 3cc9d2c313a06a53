"""The numbers behind each plot and table, computed from stored trials (no drawing here).

Kept apart from `plots.py` so that what a figure shows can be tested as data: every trial of a
candidate is one point, the bisect posterior is the strategy's own, replayed trial by trial.
All values are trial-level (the mean over a trial's repetitions): the restart is the unit.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.records import NOT_EVIDENCE_PHASES, Candidate
from orchestrator.run import posterior_steps
from orchestrator.stats.dist import t_ppf
from orchestrator.store import TrialRow
from orchestrator.ui.render import finding_id
from orchestrator.ui.report import labels
from orchestrator.ui.report.collect import RunData

PHASE_MS_METRICS = ("verify_ms", "draft_ms", "decode_ms")
PHASE_OTHER_METRICS = ("accept_len", "cuda_graph_share")


def _value(row: TrialRow, metric: str) -> float | None:
    if row.outcome is None or not row.outcome.measured or row.result is None:
        return None
    v = row.result.value(metric)
    return v if v is not None and math.isfinite(v) else None


# -- per-candidate distributions ----------------------------------------------------------------

@dataclass(frozen=True)
class TrialPoint:
    trial_id: int
    value: float
    repetitions: tuple[float, ...]
    suspect: bool


@dataclass(frozen=True)
class CandidateSeries:
    key: str
    label: str  # short and wrapped, for a plot axis (labels.short)
    points: tuple[TrialPoint, ...]
    failed: tuple[int, ...]  # trial ids that produced no measurement
    interrupted: tuple[int, ...] = ()  # stopped (and run again): neither failed nor measured
    full: str = ""  # the exact label, for tables


REFERENCE_SUFFIX = ":reference"
# Trials kept apart from the strategies' evidence that are not the reference: the running
# server and fresh starts of its command (`orchestrator/live`).
_APART = {"live": ("live:", "the running server, no restart"),
          "fresh": ("fresh:", "a fresh start of its command")}


def series_key(row: TrialRow) -> str:
    """The series a trial belongs to: its candidate, with reference trials (the node as it
    was, an earlier state) apart from the same candidate measured now."""
    return row.candidate.key + (REFERENCE_SUFFIX if row.phase in NOT_EVIDENCE_PHASES else "")


def _ordered(data: RunData) -> list[tuple[str, str, str]]:
    subject_of = labels.subjects(data)
    seen: dict[str, tuple[str, str]] = {}
    for row in data.rows:  # the reference (then) first: what everything is compared with
        if row.phase in NOT_EVIDENCE_PHASES:
            what = _APART.get(row.phase, ("then:", "reference, then"))
            seen.setdefault(series_key(row), (
                labels.short(row.candidate, subject_of, prefix=what[0]),
                f"{row.candidate.label} ({what[1]})"))
    if data.plan:
        tested = {r.candidate.key for r in data.rows if r.phase not in NOT_EVIDENCE_PHASES}
        for i, cand in enumerate(data.plan.candidates):
            if cand.key in tested:
                seen[cand.key] = (labels.short(cand, subject_of, prefix=f"#{i}"), cand.label)
    for row in data.rows:
        seen.setdefault(series_key(row), (labels.short(row.candidate, subject_of),
                                          row.candidate.label))
    return [(key, short, full) for key, (short, full) in seen.items()]


def distributions(data: RunData, metric: str) -> list[CandidateSeries]:
    """One series per candidate with every trial of it: measured points, failed trial ids and
    interrupted ones (a trial cut short by the user or a lost node is not a failure)."""
    out = []
    by_key: dict[str, list[TrialRow]] = {}  # one pass: a 500-trial run has ~300 candidates
    for r in data.rows:
        if r.finished:
            by_key.setdefault(series_key(r), []).append(r)
    for key, label, full in _ordered(data):
        rows = by_key.get(key, [])
        points = []
        for r in rows:
            v = _value(r, metric)
            if v is not None:
                points.append(TrialPoint(r.id, v, tuple(r.result.values(metric)), r.suspect))
        stopped = tuple(r.id for r in rows if r.outcome.value == "interrupted")
        failed = tuple(r.id for r in rows if not r.outcome.measured and r.id not in stopped)
        if points or failed or stopped:
            out.append(CandidateSeries(key, label, tuple(points), failed, stopped, full))
    return out


# -- bisect posterior, as recorded --------------------------------------------------------------

@dataclass(frozen=True)
class PosteriorStep:
    trial_id: int
    status: str
    posterior: tuple[float, ...]
    best_point: int | None
    best_probability: float


@dataclass(frozen=True)
class PosteriorHistory:
    labels: tuple[str, ...]  # short SHA per point
    steps: tuple[PosteriorStep, ...]
    confidence: float
    culprits: tuple[int, ...]  # points of the final verdict's culprits
    culprit_label: str = ""  # the first culprit as SHA + subject


def posterior_history(data: RunData) -> PosteriorHistory | None:
    """The bisect's posterior after each step of the run, as the run recorded it
    (`run/posterior_steps.py`); None for a run that is no bisect or kept no record."""
    if data.plan is None:
        return None
    recorded = posterior_steps.read(data.run_dir)
    try:
        steps = [PosteriorStep(int(s["trials"][-1]), str(s["status"]),
                               tuple(float(p) for p in s["posterior"]), s["best_point"],
                               float(s["best_probability"])) for s in recorded]
        culprits = [int(c) for c in recorded[-1].get("culprits") or ()] if recorded else []
    except (KeyError, TypeError, ValueError):
        return None
    if not steps:
        return None
    first = data.plan.commits[culprits[0]] if culprits else None
    return PosteriorHistory(
        labels=tuple(c.sha[:labels.SHA] for c in data.plan.commits),
        steps=tuple(steps),
        confidence=float(data.config.confidence),
        culprits=tuple(culprits),
        culprit_label=(f"{first.sha[:labels.SHA]} {labels.printable(first.subject)[:48]}"
                       if first else ""),
    )


# -- before / after phase breakdown -------------------------------------------------------------

@dataclass(frozen=True)
class Interval:
    mean: float
    lo: float
    hi: float
    n: int
    values: tuple[float, ...] = ()  # the trial-level values behind it


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval | None:
    """Mean with a t-interval over trial-level values (the bounds equal the mean when n = 1)."""
    if not values:
        return None
    mean = statistics.fmean(values)
    if len(values) < 2:
        return Interval(mean, mean, mean, 1, tuple(values))
    half = t_ppf(0.5 + confidence / 2, len(values) - 1) * statistics.stdev(
        values) / math.sqrt(len(values))
    return Interval(mean, mean - half, mean + half, len(values), tuple(values))


@dataclass(frozen=True)
class PhasePair:
    title: str
    before_label: str
    after_label: str
    metrics: tuple[tuple[str, Interval | None, Interval | None], ...]


def _measured(rows: Sequence[TrialRow], key: str, metric: str) -> list[float]:
    return [v for r in rows if r.candidate.key == key and not r.suspect
            and (v := _value(r, metric)) is not None]


def phase_pair(rows: Sequence[TrialRow], before: Candidate, after: Candidate, title: str,
               metrics: Sequence[str] = PHASE_MS_METRICS + PHASE_OTHER_METRICS,
               names: tuple[str, str] | None = None) -> PhasePair:
    found = []
    for m in metrics:
        a = mean_interval(_measured(rows, before.key, m))
        b = mean_interval(_measured(rows, after.key, m))
        if a or b:
            found.append((m, a, b))
    before_label, after_label = names or (labels.one_line(before), labels.one_line(after))
    return PhasePair(title, before_label, after_label, tuple(found))


def _sides(label: str) -> tuple[str, str] | None:
    """`power limit: 600 W -> 450 W` -> (`power limit 600 W`, `power limit 450 W`)."""
    name, _, levels = label.partition(": ")
    before, sep, after = levels.partition(" -> ")
    return (f"{name} {before}", f"{name} {after}") if sep else None


def pair_names(data: RunData, finding: Mapping, cands: tuple[Candidate, Candidate]
               ) -> tuple[str, str]:
    """What a finding's before and after are, in words: a culprit's parent and itself with
    their subjects, a tested difference's two levels, else the candidates' short labels."""
    subject_of = labels.subjects(data)
    if finding.get("kind") == "commit":
        return (f"parent {labels.one_line(cands[0], subject_of)}",
                f"commit {labels.one_line(cands[1], subject_of)}")
    sides = [_sides(str(d.get("label", ""))) for d in finding.get("differences") or []]
    if sides and all(sides):
        return (", ".join(s[0] for s in sides), ", ".join(s[1] for s in sides))
    return labels.one_line(cands[0], subject_of), labels.one_line(cands[1], subject_of)


def finding_candidates(data: RunData, finding: Mapping) -> tuple[Candidate, Candidate] | None:
    """The (before, after) candidates a finding compares, from its evidence trials."""
    by_key: dict[str, Candidate] = {}
    evidence = set(finding.get("evidence") or ())
    for r in data.rows:
        if r.id in evidence:
            by_key.setdefault(r.candidate.key, r.candidate)
    for r in data.rows:  # explicit keys, when an experiment names them
        if r.candidate.key in (finding.get("before_key"), finding.get("after_key")):
            by_key.setdefault(r.candidate.key, r.candidate)
    if finding.get("before_key") in by_key and finding.get("after_key") in by_key:
        return by_key[finding["before_key"]], by_key[finding["after_key"]]
    cands = list(by_key.values())
    if finding.get("kind") == "commit" and finding.get("parent"):
        before = [c for c in cands if c.commit == finding["parent"]]
        after = [c for c in cands if c.commit == finding.get("id")]
        if before and after:
            return before[0], after[0]
    if len(cands) == 2:
        return cands[0], cands[1]
    return None


def phase_pairs(data: RunData, max_findings: int = 3) -> list[PhasePair]:
    """Before/after phase timings for the top findings and, for a bisect, its endpoints."""
    pairs = []
    causes = [f for f in data.ranked.get("findings", []) if f.get("experiment") != "sweep"
              and not (f.get("probability") is None and f.get("difference"))]
    for f in causes[:max_findings]:
        cands = finding_candidates(data, f)
        if cands:
            pairs.append(phase_pair(data.rows, *cands, f"#{f['rank']} {f['kind']} {finding_id(f)}",
                                    names=pair_names(data, f, cands)))
    if data.plan:
        good, bad = data.plan.candidates[0], data.plan.candidates[-1]
        subject_of = labels.subjects(data)
        pairs.append(phase_pair(data.rows, good, bad, "bisect endpoints (good vs bad)",
                                names=(f"good {labels.one_line(good, subject_of)}",
                                       f"bad {labels.one_line(bad, subject_of)}")))
    return [p for p in pairs if p.metrics]


# -- per-node timeline --------------------------------------------------------------------------

@dataclass(frozen=True)
class Span:
    node: str
    trial_id: int
    start: float  # seconds since the run's first trial started
    end: float
    outcome: str
    suspect: bool
    phase: str


def timeline(rows: Sequence[TrialRow]) -> list[Span]:
    timed = [r for r in rows if r.started_at and r.ended_at and r.ended_at >= r.started_at]
    if not timed:
        return []
    t0 = min(r.started_at for r in timed)
    return [Span(r.node or "?", r.id, r.started_at - t0, r.ended_at - t0,
                 r.outcome.value if r.outcome else "running", r.suspect, r.phase)
            for r in timed]
