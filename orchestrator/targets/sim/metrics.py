"""SGLang's Prometheus metrics, rendered in the text exposition format without prometheus_client.

Names, label names, help strings and histogram buckets follow SGLang's
`python/sglang/srt/observability/metrics_collector.py` (0.5.23; `metrics/collector.py` in
0.5.9): SchedulerMetricsCollector and TokenizerMetricsCollector. Counters print like
prometheus_client: the family (`# TYPE`) name drops `_total`, the sample keeps it, and a
labelled series exists only once it was incremented (neither release pre-seeds the forward
seconds or the graph passes). SGLang exports no per-category forward-call counter; pass counts
are in `sglang:cuda_graph_passes_total{mode=decode_cuda_graph|decode_none|...}` (one per decode
batch, i.e. one per EAGLE cycle) and, from 0.5.13, verify calls in
`sglang:spec_verify_calls_total` (each finished request adds its own verify count). Device time
is `sglang:forward_execution_seconds_total` per forward pass in 0.5.23 and
`sglang:gpu_execution_seconds_total` per scheduler batch in 0.5.9 (see `dialect`).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence

from orchestrator.targets.sim.dialect import Dialect, dialect

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
E2E_BUCKETS = (
    0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800,
    2400,
)  # fmt: skip
ITL_BUCKETS = (
    0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060, 0.080,
    0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000,
)  # fmt: skip
FORWARD_DOC = {
    "sglang:forward_execution_seconds_total": "Total time that GPU is busy executing model "
    "forward passes. Refer to ForwardMode for category labels.",
    "sglang:gpu_execution_seconds_total": "Total time that GPU is busy executing a workload. "
    "Refer to ForwardMode for category labels.",
}


def fmt_value(value: float) -> str:
    """prometheus_client's float formatting (Go style): 5.0, 1e+06, +Inf, NaN."""
    if value == math.inf:
        return "+Inf"
    if value == -math.inf:
        return "-Inf"
    if math.isnan(value):
        return "NaN"
    s = repr(float(value))
    if "e" in s:
        mantissa, exp = s.split("e")
        sign = "-" if exp.startswith("-") else "+"
        return f"{mantissa}e{sign}{exp.lstrip('+-').zfill(2)}"
    return s


def _labels(names: Sequence[str], values: Sequence[str]) -> str:
    if not names:
        return ""
    inner = ",".join(
        f'{n}="{str(v).replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
        for n, v in zip(names, values, strict=True)
    )
    return "{" + inner + "}"


class _Metric:
    kind = ""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]):
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.values: dict[tuple[str, ...], float] = {}  # a counter's or a gauge's samples

    def _key(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        return tuple(str(labels[n]) for n in self.labelnames)

    @property
    def family(self) -> str:
        return self.name

    def header(self) -> list[str]:
        return [f"# HELP {self.family} {self.documentation}", f"# TYPE {self.family} {self.kind}"]


class Counter(_Metric):
    kind = "counter"

    @property
    def family(self) -> str:
        return self.name.removesuffix("_total")

    def inc(self, labels: Mapping[str, str], amount: float = 1.0) -> None:
        key = self._key(labels)
        self.values[key] = self.values.get(key, 0.0) + amount

    def touch(self, labels: Mapping[str, str]) -> None:
        self.values.setdefault(self._key(labels), 0.0)

    def render(self) -> list[str]:
        return [
            f"{self.family}_total{_labels(self.labelnames, k)} {fmt_value(v)}"
            for k, v in self.values.items()
        ]


class Gauge(_Metric):
    kind = "gauge"

    def set(self, labels: Mapping[str, str], value: float) -> None:
        self.values[self._key(labels)] = float(value)

    def render(self) -> list[str]:
        return [
            f"{self.name}{_labels(self.labelnames, k)} {fmt_value(v)}"
            for k, v in self.values.items()
        ]


class Histogram(_Metric):
    kind = "histogram"

    def __init__(
        self, name: str, documentation: str, labelnames: Sequence[str], buckets: Iterable[float]
    ):
        super().__init__(name, documentation, labelnames)
        self.buckets = tuple(float(b) for b in buckets) + (math.inf,)
        self.series: dict[tuple[str, ...], list] = {}  # key -> [bucket counts, sum]

    def _series(self, labels: Mapping[str, str]) -> list:
        return self.series.setdefault(self._key(labels), [[0.0] * len(self.buckets), 0.0])

    def observe(
        self, labels: Mapping[str, str], value: float, count: int = 1, total: float | None = None
    ) -> None:
        """Observe `value` `count` times; `total` overrides the sum (SGLang's ITL fast path)."""
        series = self._series(labels)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                series[0][i] += count
                break
        series[1] += value * count if total is None else total

    def render(self) -> list[str]:
        out = []
        for key, (counts, total) in self.series.items():
            cumulative = 0.0
            for bound, c in zip(self.buckets, counts, strict=True):
                cumulative += c
                labels = _labels((*self.labelnames, "le"), (*key, fmt_value(bound)))
                out.append(f"{self.name}_bucket{labels} {fmt_value(cumulative)}")
            out.append(f"{self.name}_count{_labels(self.labelnames, key)} {fmt_value(cumulative)}")
            out.append(f"{self.name}_sum{_labels(self.labelnames, key)} {fmt_value(total)}")
        return out


class SGLangMetrics:
    """The subset of SGLang's scheduler and tokenizer metrics the sim maintains."""

    def __init__(self, model_name: str, release: Dialect | None = None, device_timer: bool = True):
        self.lock = threading.Lock()
        self.dialect = release or dialect(None)
        # SGLang times forward passes only with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1.
        self.device_timer = device_timer
        self.scheduler_labels = {
            "model_name": model_name, "engine_type": "unified", "tp_rank": "0", "pp_rank": "0",
            "moe_ep_rank": "0",
        }  # fmt: skip
        self.tokenizer_labels = {"model_name": model_name}
        s = tuple(self.scheduler_labels)
        t = tuple(self.tokenizer_labels)
        g = {}
        for name, doc in (
            ("num_running_reqs", "The number of running requests."),
            ("num_queue_reqs", "The number of requests in the waiting queue."),
            ("gen_throughput", "The generation throughput (token/s)."),
            ("cache_hit_rate", "The prefix cache hit rate."),
            ("token_usage", "The token usage."),
            ("num_used_tokens", "The number of used tokens."),
            (
                "spec_accept_length",
                "Mean acceptance length of speculative decoding (accepted drafts + bonus token per forward).",
            ),
            (
                "spec_accept_rate",
                "Speculative acceptance rate (`accepted drafts / proposed drafts` in batch).",
            ),
            ("is_cuda_graph", "Whether the batch is using CUDA graph."),
            ("max_total_num_tokens", "Maximum total number of tokens in the KV cache pool."),
        ):
            g[name] = Gauge(f"sglang:{name}", doc, s)
        self.gauges = g
        name = self.dialect.forward_seconds_metric
        self.forward_seconds = Counter(name, FORWARD_DOC[name], (*s, "category"))
        self.cuda_graph_passes = Counter(
            "sglang:cuda_graph_passes_total",
            "Total number of forward passes categorized by CUDA graph.",
            (*s, "mode"),
        )
        self.realtime_tokens = Counter(
            "sglang:realtime_tokens_total",
            "Total number of tokens processed (updated on each log interval). "
            "mode: prefill_compute, prefill_cache, decode.",
            (*s, "mode"),
        )
        self.prompt_tokens = Counter(
            "sglang:prompt_tokens_total",
            "Number of prefill tokens processed.",
            (*t, "is_streaming"),
        )
        self.generation_tokens = Counter(
            "sglang:generation_tokens_total",
            "Number of generation tokens processed.",
            (*t, "is_streaming"),
        )
        self.spec_verify_calls = Counter(
            "sglang:spec_verify_calls_total",
            "Number of speculative decoding verification calls.",
            t,
        )
        self.cached_tokens = Counter(
            "sglang:cached_tokens_total",
            "Number of cached prompt tokens by source (device/host/storage).",
            (*t, "cache_source"),
        )
        self.num_requests = Counter(
            "sglang:num_requests_total", "Number of requests processed.", (*t, "is_streaming")
        )
        self.ttft = Histogram(
            "sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            (*t, "is_streaming"), TTFT_BUCKETS,
        )  # fmt: skip
        self.itl = Histogram(
            "sglang:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.",
            t, ITL_BUCKETS,
        )  # fmt: skip
        self.e2e = Histogram(
            "sglang:e2e_request_latency_seconds", "Histogram of End-to-end request latency in seconds",
            (*t, "is_streaming"), E2E_BUCKETS,
        )  # fmt: skip
        for gauge in self.gauges.values():
            gauge.set(self.scheduler_labels, 0.0)

    # -- updates (call with self.lock held or from one thread) ---------------------------------
    def set_gauge(self, name: str, value: float) -> None:
        self.gauges[name].set(self.scheduler_labels, value)

    def forward(self, category: str, seconds: float) -> None:
        if not self.device_timer:
            return
        self.forward_seconds.inc({**self.scheduler_labels, "category": category}, seconds)

    def graph_pass(self, mode: str) -> None:
        self.cuda_graph_passes.inc({**self.scheduler_labels, "mode": mode})

    def realtime(self, mode: str, tokens: int) -> None:
        if tokens:
            self.realtime_tokens.inc({**self.scheduler_labels, "mode": mode}, tokens)

    def render(self) -> str:
        lines: list[str] = []
        with self.lock:
            metrics = [
                *self.gauges.values(), self.forward_seconds, self.cuda_graph_passes,
                self.realtime_tokens, self.prompt_tokens, self.generation_tokens,
                *([self.spec_verify_calls] if self.dialect.verify_calls_counter else []),
                self.cached_tokens, self.num_requests, self.ttft,
                self.itl, self.e2e,
            ]  # fmt: skip
            for metric in metrics:
                body = metric.render()
                if body:
                    lines.extend(metric.header())
                    lines.extend(body)
        return "\n".join(lines) + "\n"
