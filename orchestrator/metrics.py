"""The metrics sleuth measures, with their units and which direction is worse.

`direction=auto` uses this table: a regression raises a latency and lowers a throughput.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.errors import UserError


@dataclass(frozen=True)
class MetricInfo:
    name: str
    unit: str
    higher_is_better: bool
    phase: str  # which part of the server it describes


METRICS = {m.name: m for m in (
    MetricInfo("output_throughput", "tok/s", True, "client"),
    MetricInfo("ttft_ms_p50", "ms", False, "client"),
    MetricInfo("ttft_ms_p90", "ms", False, "client"),
    MetricInfo("itl_ms_p50", "ms", False, "client"),
    MetricInfo("itl_ms_p90", "ms", False, "client"),
    MetricInfo("tpot_ms_p50", "ms", False, "client"),
    MetricInfo("tpot_ms_p90", "ms", False, "client"),
    MetricInfo("verify_ms", "ms", False, "verify"),
    MetricInfo("draft_ms", "ms", False, "draft"),
    MetricInfo("decode_ms", "ms", False, "decode"),
    MetricInfo("accept_len", "tokens", True, "draft"),
    MetricInfo("cuda_graph_share", "share", True, "verify"),
    MetricInfo("value", "", False, "client"),
)}

# Metrics a finding reports an effect for, when the trials measured them.
EFFECT_METRICS = ("verify_ms", "draft_ms", "decode_ms", "accept_len", "output_throughput",
                  "tpot_ms_p50", "ttft_ms_p50", "cuda_graph_share")


def check_metric(name: str) -> MetricInfo:
    info = METRICS.get(name)
    if info is None:
        raise UserError(f"unknown metric {name!r} (known: {', '.join(METRICS)})")
    return info


def regression_direction(metric: str, direction: str) -> str:
    """'increase' or 'decrease': which way the metric moved from good to bad."""
    if direction == "auto":
        return "decrease" if check_metric(metric).higher_is_better else "increase"
    if direction not in ("increase", "decrease"):
        raise UserError(f"direction must be auto, increase or decrease (got {direction!r})")
    return direction
