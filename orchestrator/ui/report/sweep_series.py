"""The numbers behind the sweep plot: every sweep restart, the best configuration so far, the
confirmed winner and the baseline (no drawing here, so what the figure shows is tested as data).

"Best so far" is the best *configuration mean* among configurations measured at least
:data:`MIN_RESTARTS_FOR_BEST` times, not the best single restart: one lucky restart of a
middling configuration is exactly what the sweep's confirmation exists to see through, and a
line that jumps to it tells the reader the opposite of the sweep's answer. Each restart is
marked by what it measured (the confirmed winner, the baseline, another configuration), and
the winner's and the baseline's confirmation means are given, so the figure ends where the
answer does.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.metrics import METRICS
from orchestrator.records import Candidate
from orchestrator.ui.report.collect import RunData
from orchestrator.ui.report.series import _value

MIN_RESTARTS_FOR_BEST = 2  # a configuration's mean counts for "best so far" from 2 restarts
WINNER, BASELINE, OTHER = "winner", "baseline", "other"


@dataclass(frozen=True)
class SweepSeries:
    metric: str
    higher_is_better: bool
    # (trial id, value, best configuration mean so far or None, WINNER | BASELINE | OTHER)
    history: tuple[tuple[int, float, float | None, str], ...]
    importance: tuple[tuple[str, float], ...]  # (parameter, share of variance), largest first
    importance_source: str
    winner: str | None = None  # the confirmed configuration's label
    winner_mean: float | None = None  # its confirmation restarts' mean
    baseline_mean: float | None = None  # the baseline's confirmation restarts' mean


def candidate_params(cand: Candidate) -> dict[str, str]:
    """A candidate's factor levels other than the commit, as flat parameter names."""
    params = {f"env.{k}": v for k, v in cand.env}
    params.update({f"server.{k}": v for k, v in cand.server})
    params["clock"] = cand.clock
    params["patches"] = ",".join(p.rsplit("/", 1)[-1] for p in cand.patches) or "(none)"
    return params


def eta_squared(groups: Mapping[str, Sequence[float]]) -> float:
    """Share of the variance of all values explained by the grouping (one-way ANOVA's eta^2)."""
    values = [v for vs in groups.values() for v in vs]
    if len(values) < 3:
        return 0.0
    grand = statistics.fmean(values)
    total = sum((v - grand) ** 2 for v in values)
    if total <= 0:
        return 0.0
    between = sum(len(vs) * (statistics.fmean(vs) - grand) ** 2 for vs in groups.values() if vs)
    return between / total


def _mean(values: object) -> float | None:
    """The mean of a findings document's list of values; None when it holds none."""
    nums = [float(v) for v in values if isinstance(v, int | float)] \
        if isinstance(values, list) else []
    return statistics.fmean(nums) if nums else None


def sweep_series(data: RunData) -> SweepSeries | None:
    """Trial history and parameter importance of the sweep trials of a run, if any ran."""
    doc = next((d for d in data.docs if d.get("experiment") == "sweep"), None) or {}
    rows = [r for r in data.rows if "sweep" in (r.phase or "") or data.command == "sweep"]
    if not rows:
        return None
    metric = str(doc.get("metric")) if doc.get("metric") else data.metric
    info = METRICS.get(metric)
    direction = data.config.direction
    higher = info.higher_is_better if info and direction == "auto" else direction == "decrease"
    confirmed = (doc.get("confirmed") or [{}])[0]
    baseline = doc.get("baseline") or {}
    kind_of = {confirmed.get("key"): WINNER, baseline.get("key"): BASELINE}
    pick = max if higher else min
    history, by_config = [], {}
    for r in rows:
        v = _value(r, metric)
        if v is None or r.suspect:
            continue
        by_config.setdefault(r.candidate.key, []).append(v)
        means = [statistics.fmean(vs) for vs in by_config.values()
                 if len(vs) >= MIN_RESTARTS_FOR_BEST]
        history.append((r.id, v, pick(means) if means else None,
                        kind_of.get(r.candidate.key, OTHER)))
    if isinstance(doc.get("importance"), Mapping):
        importance = {str(k): float(v) for k, v in doc["importance"].items()}
        source = "reported by the sweep"
    else:
        params: dict[str, dict[str, list[float]]] = {}
        for r in rows:
            v = _value(r, metric)
            if v is None or r.suspect:
                continue
            for name, level in candidate_params(r.candidate).items():
                params.setdefault(name, {}).setdefault(level, []).append(v)
        importance = {k: eta_squared(g) for k, g in params.items() if len(g) > 1}
        source = "share of trial-to-trial variance explained by each parameter alone (eta squared)"
    ranked = tuple(sorted(importance.items(), key=lambda kv: -kv[1]))
    if not history and not ranked:
        return None
    return SweepSeries(metric, higher, tuple(history), ranked, source,
                       winner=confirmed.get("label") or None,
                       winner_mean=_mean(confirmed.get("confirm")),
                       baseline_mean=_mean(baseline.get("confirm")))
