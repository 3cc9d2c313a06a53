"""The metrics sleuth measures, with their units and which direction is worse.

`direction=auto` uses this table: a regression raises a latency and lowers a throughput.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.errors import UserError, did_you_mean
from orchestrator.util.versions import parse_version

# The SGLang release whose servers time each forward pass (`forward_seconds` became per-pass
# device timers in 0.5.11; older ones time whole scheduler batches): the phase metrics of a
# speculative server need it (targets/sglang_versions.py keeps the other release facts).
PER_PASS_TIMERS = (0, 5, 11)


@dataclass(frozen=True)
class MetricInfo:
    name: str
    unit: str
    higher_is_better: bool
    phase: str  # which part of the server it describes
    meaning: str = ""  # what exactly the number is (server metrics: how it is derived)


METRICS = {m.name: m for m in (
    MetricInfo("output_throughput", "tok/s", True, "client",
               "output tokens / repetition duration (modeled time on the sim)"),
    MetricInfo("ttft_ms_p50", "ms", False, "client"),
    MetricInfo("ttft_ms_p90", "ms", False, "client"),
    MetricInfo("itl_ms_p50", "ms", False, "client"),
    MetricInfo("itl_ms_p90", "ms", False, "client"),
    MetricInfo("tpot_ms_p50", "ms", False, "client"),
    MetricInfo("tpot_ms_p90", "ms", False, "client"),
    MetricInfo("verify_ms", "ms", False, "verify",
               "device ms of one verify forward pass over the whole batch (target_verify seconds"
               " / decode passes); per request it is verify_ms_per_request"),
    MetricInfo("verify_ms_per_request", "ms", False, "verify",
               "target_verify seconds / spec_verify_calls_total, which SGLang counts per request:"
               " verify_ms divided by the mean batch size (equal at concurrency 1)"),
    MetricInfo("draft_ms", "ms", False, "draft",
               "device ms of the draft model per EAGLE cycle (draft steps + draft extend), from"
               " eagle_draft*/decode/extend seconds whichever the runner filed them under"),
    MetricInfo("decode_ms", "ms", False, "decode",
               "device ms per plain decode step (only without speculative decoding)"),
    MetricInfo("accept_len", "tokens", True, "draft",
               "tokens per verify pass: the requests' meta_info, else the Prometheus counters"
               " that sum it, else /server_info's windowed value"),
    MetricInfo("cuda_graph_share", "share", True, "verify",
               "decode passes replayed from a CUDA graph / all decode passes (with speculative"
               " decoding: EAGLE cycles whose verify ran in a graph)"),
    MetricInfo("draft_graph_share", "share", True, "draft",
               "share of the draft steps' device time run from CUDA graphs (eagle_draft seconds"
               " / eagle_draft + decode seconds)"),
    MetricInfo("prefill_ms_per_ktok", "ms", False, "prefill",
               "device ms of prefill per 1000 computed prompt tokens (extend seconds where they"
               " hold prefill alone, else a prefill-only probe)"),
    MetricInfo("value", "", False, "client"),
)}

# Metrics a finding reports an effect for, when the trials measured them.
EFFECT_METRICS = ("verify_ms", "draft_ms", "decode_ms", "accept_len", "output_throughput",
                  "tpot_ms_p50", "ttft_ms_p50", "cuda_graph_share")


# Server-phase metrics that exist only with speculative decoding (the EAGLE cycle's draft and
# verify) and only without it (a plain decode step).
SPECULATIVE_ONLY = ("verify_ms", "verify_ms_per_request", "draft_ms", "draft_graph_share")
PLAIN_ONLY = ("decode_ms",)
# Targets whose metrics come from an SGLang server (real or simulated); others report their own.
SERVER_TARGETS = ("sim", "sglang")


def check_metric(name: str, *, custom: bool = False, target: Mapping | None = None) -> MetricInfo:
    """The metric's description. `custom`: the target reports metrics of its own (the
    `command` target's JSON line), so any name is accepted, lower taken as better.

    `target` (its configuration): refuse a phase metric its servers never report, before a
    single restart is spent. Without this, every trial "succeeds" with no value and the run
    ends saying an endpoint could not be measured, which sends the user to the wrong place."""
    info = METRICS.get(name)
    if info is None:
        if custom and name.replace("_", "").replace(".", "").isalnum():
            return MetricInfo(name, "", False, "client")
        raise UserError(f"unknown metric {name!r}{did_you_mean(name, METRICS)} (known:"
                        f" {', '.join(METRICS)})")
    if target is not None and not custom and target.get("name") in SERVER_TARGETS:
        speculative = target.get("speculative_algorithm")
        if speculative and name in PLAIN_ONLY:
            raise UserError(f"{name} is measured only without speculative decoding, and "
                            f"target.speculative_algorithm is {speculative}: use verify_ms or "
                            "draft_ms (the phases of its cycle) or a client metric such as "
                            "tpot_ms_p50")
        if not speculative and name in SPECULATIVE_ONLY:
            raise UserError(f"{name} is measured only with speculative decoding, and "
                            "target.speculative_algorithm is not set: use decode_ms or a "
                            "client metric such as tpot_ms_p50")
        version = parse_version(str(target.get("sglang_version") or ""))
        if speculative and name in SPECULATIVE_ONLY and version and version < PER_PASS_TIMERS:
            raise UserError(f"{name} needs per-pass device timers, and SGLang "
                            f"{'.'.join(map(str, version))} (target.sglang_version) times whole "
                            "scheduler batches (gpu_execution_seconds_total): use a client "
                            "metric such as tpot_ms_p50 or output_throughput")
    return info


def effect_metrics(metric: str) -> tuple[str, ...]:
    """The metrics a finding reports: the standard set plus the run's own metric."""
    return EFFECT_METRICS if metric in EFFECT_METRICS else (metric, *EFFECT_METRICS)


def regression_direction(metric: str, direction: str) -> str:
    """'increase' or 'decrease': which way the metric moved from good to bad."""
    if direction == "auto":
        info = METRICS.get(metric)
        return "decrease" if info is not None and info.higher_is_better else "increase"
    if direction not in ("increase", "decrease"):
        raise UserError(f"direction must be auto, increase or decrease (got {direction!r})")
    return direction
