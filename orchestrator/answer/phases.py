"""The mechanism part of an answer: which server phase moved, and what the GPUs did meanwhile.

"verify +53%, draft +1%; CUDA graphs on 100% of passes both times; SM clock under load
2100 -> 1650 MHz, power 590 -> 450 W" tells an engineer where to look before any cause is
named: a compute-bound phase that moved with the SM clock points at clocks and power, one that
moved with the clock steady points at the code or at all-reduce. Everything here is measured:
per-phase effects are log-scale t-intervals over trial-level values (restarts), telemetry is
the mean over each side's trials of the SM clock and board power sampled while they ran.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from orchestrator.answer.combine import LogChange
from orchestrator.answer.text import interval_text, number, pct_text
from orchestrator.stats.effect import log_difference

PHASE_METRICS = ("verify_ms", "draft_ms", "decode_ms")
_PHASE_NAMES = {"verify_ms": "verify", "draft_ms": "draft", "decode_ms": "decode"}
SIDE_METRICS = (*PHASE_METRICS, "accept_len", "cuda_graph_share")


def log_change(before: Sequence[float], after: Sequence[float], extra_ss: float = 0.0,
               extra_df: int = 0) -> LogChange | None:
    """The log-scale change between two sets of trial-level values (positive ones only)."""
    a = [math.log(v) for v in before if v > 0 and math.isfinite(v)]
    b = [math.log(v) for v in after if v > 0 and math.isfinite(v)]
    if not a or not b:
        return None
    d = log_difference(a, b, 0.95, extra_ss, extra_df)
    return LogChange(d.diff, d.se, d.df)


def _mean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and math.isfinite(v)]
    return statistics.fmean(vals) if vals else None


def _telemetry_mean(telemetry: Sequence[Mapping | None], field: str) -> float | None:
    return _mean([t[field]["mean"] for t in telemetry
                  if t and t.get("n_samples") and isinstance(t.get(field), Mapping)
                  and isinstance(t[field].get("mean"), int | float)])


def mechanism(before: Mapping[str, Sequence[float]], after: Mapping[str, Sequence[float]],
              before_telemetry: Sequence[Mapping | None] = (),
              after_telemetry: Sequence[Mapping | None] = (), *,
              before_label: str = "before", after_label: str = "after") -> dict:
    """`{"phases": {metric: effect}, "phase": moved, "cuda_graph_share", "accept_len",
    "sm_clock_mhz", "power_w", "text"}` between two sides' trial-level values."""
    phases: dict[str, dict] = {}
    for metric in PHASE_METRICS:
        change = log_change(before.get(metric, ()), after.get(metric, ()))
        if change is not None:
            phases[metric] = {**change.to_json(), "before": _mean(before[metric]),
                              "after": _mean(after[metric])}
    moved = [(abs(e["pct"]), m) for m, e in phases.items()
             if e["ci"][0] > 0 or e["ci"][1] < 0]
    doc: dict = {"phases": phases, "phase": _PHASE_NAMES[max(moved)[1]] if moved else None,
                 "before_label": before_label, "after_label": after_label}
    accept = log_change(before.get("accept_len", ()), after.get("accept_len", ()))
    if accept is not None:
        doc["accept_len"] = {**accept.to_json(), "before": _mean(before["accept_len"]),
                             "after": _mean(after["accept_len"])}
    share = (_mean(before.get("cuda_graph_share", ())), _mean(after.get("cuda_graph_share", ())))
    if share[0] is not None or share[1] is not None:
        doc["cuda_graph_share"] = {"before": share[0], "after": share[1]}
    for field in ("sm_clock_mhz", "power_w"):
        pair = (_telemetry_mean(before_telemetry, field), _telemetry_mean(after_telemetry, field))
        if pair[0] is not None or pair[1] is not None:
            doc[field] = {"before": pair[0], "after": pair[1]}
    doc["text"] = describe(doc)
    return doc


def _pair(pair: Mapping | None, unit: str, fmt=number) -> str | None:
    if not pair or (pair.get("before") is None and pair.get("after") is None):
        return None
    before = "?" if pair.get("before") is None else fmt(pair["before"])
    after = "?" if pair.get("after") is None else fmt(pair["after"])
    return f"{before}{unit} -> {after}{unit}"


def describe(doc: Mapping) -> str:
    """One line: the phases with their changes, then CUDA graphs, SM clock and power."""
    parts = [f"{_PHASE_NAMES[m]} {pct_text(e['pct'])} {interval_text(e['ci'], e['pct'])}"
             for m, e in doc.get("phases", {}).items()]
    if doc.get("accept_len"):
        e = doc["accept_len"]
        parts.append(f"accept length {number(e['before'])} -> {number(e['after'])}")
    graphs = _pair(doc.get("cuda_graph_share"), "%", lambda v: f"{100 * v:.0f}")
    if graphs:
        parts.append(f"CUDA-graph share {graphs}")
    gpu = [f"SM clock under load {c}" for c in [_pair(doc.get("sm_clock_mhz"), " MHz")] if c]
    gpu += [f"power {p}" for p in [_pair(doc.get("power_w"), " W")] if p]
    if gpu:
        parts.append(", ".join(gpu) + f" ({doc.get('before_label', 'before')} -> "
                     f"{doc.get('after_label', 'after')})")
    return "; ".join(parts)
