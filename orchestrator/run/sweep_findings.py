"""The sweep's findings (`findings.json`, DESIGN.md's contract) and its console summary.

Findings, in order:
  1. the best configuration against the baseline: its effect on every metric from the
     interleaved confirmation only (computed by `findings.effects_between` on those restarts,
     with the run's pooled restart variance), the probability that it is better than the
     baseline, and the trials behind it;
  2. each setting of that configuration that differs from the baseline, most important
     parameter first, with its main effect over every search restart (`effects.MainEffects`).
A sweep names better settings, not causes, so `probability` (of being a cause) is null, as
the report's ranking expects; `p_better` carries the probability that the setting helps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from rich.table import Table

from orchestrator.metrics import METRICS
from orchestrator.run.findings import effects_between, phase_moved
from orchestrator.store import TrialRow
from orchestrator.strategies.sweep.importance import Importances
from orchestrator.strategies.sweep.search import SweepResult, SweepSearch, parse_phase


def _unit(metric: str) -> str:
    info = METRICS.get(metric)
    return f"{metric} ({info.unit})" if info and info.unit else metric


def _pct(e: dict | None) -> str:
    if not e:
        return "n/a"
    return f"{e['pct']:+.1f}% [{e['ci'][0]:+.1f}, {e['ci'][1]:+.1f}]"


def _p_better(effect: dict | None, maximize: bool) -> float | None:
    """One-sided probability of an improvement, from the two-sided p-value of the effect."""
    if not effect or effect.get("p_value") is None or not math.isfinite(effect["p_value"]):
        return None
    half = effect["p_value"] / 2.0
    improved = effect["pct"] > 0 if maximize else effect["pct"] < 0
    return round(1.0 - half if improved else half, 4)


def _kind(search: SweepSearch, names: Sequence[str]) -> str:
    kinds = {search.space.param(n).kind for n in names}
    return kinds.pop() if len(kinds) == 1 else "env" if "env" in kinds else sorted(kinds)[0]


def sweep_findings(*, run_id: str, metric: str, search: SweepSearch, result: SweepResult,
                   importances: Importances, rows: Sequence[TrialRow]) -> dict[str, Any]:
    maximize = search.settings.maximize
    base = search.baseline
    findings: list[dict[str, Any]] = []
    best = result.best
    if best is not None:
        cfg = best.config
        confirm_rows = [r for r in rows if (parse_phase(r.phase or "") or ("",))[0] == "confirm"]
        others = [r for r in rows if r.candidate.key not in (base.key, cfg.key)]
        detail = effects_between([*confirm_rows, *others], base.key, cfg.key)
        if metric not in detail and best.effect is not None:  # a metric outside EFFECT_METRICS
            e = best.effect
            detail[metric] = {"pct": round(e.pct, 3), "ci": [round(e.ci[0], 3), round(e.ci[1], 3)],
                              "p_value": e.p_value, "n": [e.n_before, e.n_after]}
        changed = [n for n, v in cfg.assignment.items() if base.assignment.get(n, v) != v
                   or n not in base.assignment]
        headline = detail.get(metric)
        findings.append({
            "kind": _kind(search, changed or search.space.names),
            "id": cfg.label,
            "summary": f"{cfg.label}: {_pct(headline)} {_unit(metric)} vs the baseline "
                       f"(interleaved confirmation, {len(base.confirm)} vs {len(cfg.confirm)} "
                       "restarts)",
            "probability": None,
            "p_better": _p_better(headline, maximize),
            "effect": {m: {"pct": e["pct"], "ci": e["ci"]} for m, e in detail.items()},
            "effect_detail": detail,
            "phase": phase_moved(detail),
            "config": cfg.assignment,
            "candidate": cfg.candidate.to_json(),
            "before_key": base.key,
            "after_key": cfg.key,
            "evidence": [r.id for r in confirm_rows if r.candidate.key in (base.key, cfg.key)],
        })
        model = search.model()
        order = {n: i for i, n in enumerate(importances.ranked)}
        for name in sorted(changed, key=lambda n: order.get(n, len(order))):
            level = cfg.assignment.get(name)
            le = model.level_effect(name, level)
            effect = {metric: {"pct": round(le.pct, 3),
                               "ci": [round(le.ci[0], 3), round(le.ci[1], 3)]}}
            imp = importances.values.get(name)
            shown = "unset" if level is None else level
            findings.append({
                "kind": search.space.param(name).kind,
                "id": f"{name}={shown}",
                "summary": f"{name}={shown}: {_pct(effect[metric])} {_unit(metric)} "
                           f"(main effect over {model.n} search restarts, {le.n} at this "
                           "level)" + (f"; importance {imp:.2f}" if imp is not None else ""),
                "probability": None,
                "p_better": round(le.p_better, 4),
                "effect": effect,
                "importance": imp,
                "parameter": name,
                "level": level,
                "baseline_level": base.assignment.get(name),
            })
    for rank, f in enumerate(findings, 1):
        f["rank"] = rank
    return {
        "run": run_id,
        "experiment": "sweep",
        "metric": metric,
        "direction": "maximize" if maximize else "minimize",
        "verdict": result.status,
        "message": result.message,
        "space": search.space.name,
        "space_size": search.space.size(),
        "sampler": search.settings.sampler,
        "n_trials": result.n_trials,
        "n_configurations": result.n_configurations,
        "importance": importances.values,
        "importance_evaluator": importances.evaluator,
        "importance_note": importances.note,
        "baseline": {"config": base.assignment, "key": base.key,
                     "search": base.search, "confirm": base.confirm},
        "confirmed": [{"label": c.config.label, "key": c.config.key, "config": c.config.assignment,
                       "search": c.config.search, "confirm": c.config.confirm,
                       "effect": None if c.effect is None else
                       {"pct": c.effect.pct, "ci": list(c.effect.ci)}}
                      for c in result.confirmed],
        "leaders": [{"label": c.label, "mean": c.mean(), "restarts": len(c.search)}
                    for c in search.ranking()[:10]],
        "findings": [{"rank": f.pop("rank"), **f} for f in findings],
    }


def leaders_table(search: SweepSearch, metric: str, limit: int = 8) -> Table:
    table = Table(title=f"best configurations of the search · {_unit(metric)}")
    for col in ("#", "mean", "restarts", "configuration"):
        table.add_column(col)
    base = search.baseline
    if base.search:
        table.add_row("base", f"{base.mean():.2f}", str(len(base.search)), "baseline")
    for i, c in enumerate(search.ranking()[:limit], 1):
        table.add_row(str(i), f"{c.mean():.2f}", str(len(c.search)), c.label)
    return table


def importance_table(importances: Importances) -> Table:
    table = Table(title=f"parameter importance · {importances.evaluator}")
    table.add_column("parameter")
    table.add_column("importance")
    for name, value in importances.values.items():
        table.add_row(name, f"{value:.3f}")
    return table
