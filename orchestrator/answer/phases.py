"""The mechanism part of an answer: which server phases moved and which did not, how each ran
(CUDA graph or eager), and what the GPUs did meanwhile.

"moved: verify +38% [..]; did not move: draft +0.3% [..], prefill -0.4% [..]; decode: not
measured (speculative decoding on); CUDA graphs: verify graph -> eager, draft graph,
unchanged; SM clock under load 2100 -> 2100 MHz" tells an engineer where to look before any
cause is named: the seed's engineer reasoned from "verify +53% while decode +8%", and one
graph share over every pass ("100% -> 0%") read as if every phase had gone eager when only the
verify had. A compute-bound phase that moved with the SM clock points at clocks and power, one
that moved with the clock steady at the code or at all-reduce, one that left its graph at a
graph-breaking setting. Everything here is measured: per-phase effects are log-scale
t-intervals over trial-level values (restarts); graph use is each side's mean share
(`cuda_graph_share`: with speculative decoding each decode pass is an EAGLE cycle and its
graph is the verify's, without it a plain decode step's; `draft_graph_share`: the draft steps'
time in the graph runner); telemetry is the mean over each side's trials of the SM clock and
board power sampled while they ran. A phase the target cannot time in this configuration
(plain decode while speculative decoding is on) is said to be not measured, never left out
silently.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from orchestrator.answer.combine import LogChange
from orchestrator.answer.text import interval_text, number, pct_text
from orchestrator.stats.effect import log_difference

PHASE_METRICS = ("verify_ms", "draft_ms", "decode_ms", "prefill_ms_per_ktok")
_PHASE_NAMES = {"verify_ms": "verify", "draft_ms": "draft", "decode_ms": "decode",
                "prefill_ms_per_ktok": "prefill"}
SIDE_METRICS = (*PHASE_METRICS, "accept_len", "cuda_graph_share", "draft_graph_share")
# Why plain decode has no number next to an EAGLE cycle's phases.
_NO_DECODE = "speculative decoding on: the server runs no plain decode step"


def log_change(before: Sequence[float], after: Sequence[float], extra_ss: float = 0.0,
               extra_df: int = 0) -> LogChange | None:
    """The log-scale change between two sets of trial-level values (positive ones only)."""
    a = [math.log(v) for v in before if v > 0 and math.isfinite(v)]
    b = [math.log(v) for v in after if v > 0 and math.isfinite(v)]
    if not a or not b:
        return None
    d = log_difference(a, b, 0.95, extra_ss, extra_df)
    return LogChange(d.diff, d.se, d.df)


def _moved(effect: Mapping) -> bool:
    return effect["ci"][0] > 0 or effect["ci"][1] < 0


def _not_measured(phases: Mapping[str, Mapping], speculative: bool) -> dict[str, str]:
    """The phases with no number that the configuration explains: plain decode, where every
    decode pass is an EAGLE cycle (measure it in a run without speculative decoding)."""
    if speculative and phases and "decode_ms" not in phases:
        return {"decode": _NO_DECODE}
    return {}


def _graphs(before: Mapping[str, Sequence[float]], after: Mapping[str, Sequence[float]],
            speculative: bool) -> dict[str, dict]:
    """CUDA-graph use per phase, each side's mean share: the decode pass's graph is the
    verify's with speculative decoding, a plain decode step's without it."""
    out = {}
    for metric, phase in (("cuda_graph_share", "verify" if speculative else "decode"),
                          ("draft_graph_share", "draft")):
        pair = (_mean(before.get(metric, ())), _mean(after.get(metric, ())))
        if pair[0] is not None or pair[1] is not None:
            out[phase] = {"before": pair[0], "after": pair[1]}
    return out


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
    """`{"phases": {metric: effect}, "phase": the one that moved most, "moved" / "unmoved":
    phase names whose interval excludes zero / does not, "not_measured": {phase: why},
    "graphs": {phase: {"before", "after"} share}, "cuda_graph_share", "accept_len",
    "sm_clock_mhz", "power_w", "text"}` between two sides' trial-level values."""
    phases: dict[str, dict] = {}
    for metric in PHASE_METRICS:
        change = log_change(before.get(metric, ()), after.get(metric, ()))
        if change is not None:
            phases[metric] = {**change.to_json(), "before": _mean(before[metric]),
                              "after": _mean(after[metric])}
    moved = [(abs(e["pct"]), m) for m, e in phases.items()
             if e["ci"][0] > 0 or e["ci"][1] < 0]
    speculative = bool(before.get("verify_ms") or after.get("verify_ms"))
    doc: dict = {"phases": phases, "phase": _PHASE_NAMES[max(moved)[1]] if moved else None,
                 "moved": [_PHASE_NAMES[m] for m in phases if _moved(phases[m])],
                 "unmoved": [_PHASE_NAMES[m] for m in phases if not _moved(phases[m])],
                 "not_measured": _not_measured(phases, speculative),
                 "graphs": _graphs(before, after, speculative),
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


def graph_text(share: float | None) -> str:
    """`graph`, `eager`, or the share in between (`graph 63%`); `?` when not measured."""
    if share is None:
        return "?"
    if share >= 0.995:
        return "graph"
    if share <= 0.005:
        return "eager"
    return f"graph {100 * share:.0f}%"


def _graph_clause(phase: str, pair: Mapping) -> str:
    before, after = graph_text(pair.get("before")), graph_text(pair.get("after"))
    return f"{phase} {before}, unchanged" if before == after else f"{phase} {before} -> {after}"


def _phase_text(metric: str, e: Mapping) -> str:
    return f"{_PHASE_NAMES[metric]} {pct_text(e['pct'])} {interval_text(e['ci'], e['pct'])}"


def describe(doc: Mapping) -> str:
    """One line: the phases that moved and those that did not, with intervals; the ones not
    measured and why; CUDA-graph use per phase; accept length; SM clock and power."""
    phases = doc.get("phases", {})
    moved = [_phase_text(m, e) for m, e in phases.items() if _moved(e)]
    still = [_phase_text(m, e) for m, e in phases.items() if not _moved(e)]
    parts = []
    if moved:
        parts.append("moved: " + ", ".join(moved))
    if still:
        parts.append("did not move: " + ", ".join(still))
    for phase, why in (doc.get("not_measured") or {}).items():
        parts.append(f"{phase}: not measured ({why})")
    graphs = doc.get("graphs") or {}
    if graphs:
        parts.append("CUDA graphs: " + ", ".join(_graph_clause(ph, pair)
                                                  for ph, pair in graphs.items()))
    elif doc.get("cuda_graph_share"):
        parts.append(f"CUDA-graph share {_pair(doc['cuda_graph_share'], '%', _percent)}")
    if doc.get("accept_len"):
        e = doc["accept_len"]
        parts.append(f"accept length {number(e['before'])} -> {number(e['after'])}")
    gpu = [f"SM clock under load {c}" for c in [_pair(doc.get("sm_clock_mhz"), " MHz")] if c]
    gpu += [f"power {p}" for p in [_pair(doc.get("power_w"), " W")] if p]
    if gpu:
        parts.append(", ".join(gpu) + f" ({doc.get('before_label', 'before')} -> "
                     f"{doc.get('after_label', 'after')})")
    return "; ".join(parts)


def _percent(value: float) -> str:
    return f"{100 * value:.0f}"
