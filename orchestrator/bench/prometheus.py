"""Parse Prometheus text exposition and derive SGLang's per-phase times from counter deltas.

SGLang (0.5.23+) exports `sglang:forward_execution_seconds_total{category=...}` and
`sglang:spec_verify_calls_total`; verify time per call is delta(target_verify seconds) /
delta(verify calls) between two scrapes that bracket a benchmark repetition. Counters are
cumulative since start, so only deltas mean anything.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

Sample = tuple[str, tuple[tuple[str, str], ...]]

_LINE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)(?:\s+\d+)?$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> dict[Sample, float]:
    """`{(name, sorted label pairs): value}` for every sample line; comments skipped."""
    out: dict[Sample, float] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group("labels") or "")))
        try:
            value = float(m.group("value"))
        except ValueError:
            continue
        out[(m.group("name"), labels)] = value
    return out


def total(samples: Mapping[Sample, float], name: str, **labels: str) -> float | None:
    """Sum of the samples called `name` whose labels include `labels` (None if none match)."""
    want = set(labels.items())
    vals = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    return sum(vals) if vals else None


def _delta(before: Mapping[Sample, float], after: Mapping[Sample, float], name: str, **labels: str) -> float | None:
    a, b = total(after, name, **labels), total(before, name, **labels)
    if a is None:
        return None
    return a - (b or 0.0)


FORWARD = "sglang:forward_execution_seconds_total"
VERIFY_CALLS = "sglang:spec_verify_calls_total"
GEN_TOKENS = "sglang:generation_tokens_total"
GRAPH_PASSES = "sglang:cuda_graph_passes_total"


def phase_metrics(before: Mapping[Sample, float], after: Mapping[Sample, float]) -> dict[str, float]:
    """Per-phase milliseconds from two scrapes: verify_ms and draft_ms per speculative cycle,
    decode_ms per plain decode step (where the server exports the counters needed)."""
    out: dict[str, float] = {}
    calls = _delta(before, after, VERIFY_CALLS)
    if calls and calls > 0:
        verify_s = _delta(before, after, FORWARD, category="target_verify")
        if verify_s is not None:
            out["verify_ms"] = 1000.0 * verify_s / calls
        draft_s = sum(
            d for d in (
                _delta(before, after, FORWARD, category="eagle_draft"),
                _delta(before, after, FORWARD, category="eagle_draft_extend"),
            ) if d is not None
        )
        if draft_s:
            out["draft_ms"] = 1000.0 * draft_s / calls
    # SGLang has no per-category call counter; it counts one pass per decode batch in
    # `sglang:cuda_graph_passes_total{mode="decode_cuda_graph"|"decode_none"}`.
    decode_calls = sum(
        d for mode in ("decode_cuda_graph", "decode_none")
        if (d := _delta(before, after, GRAPH_PASSES, mode=mode)) is not None
    )
    decode_s = _delta(before, after, FORWARD, category="decode")
    if decode_calls and decode_calls > 0 and decode_s:  # no decode time: speculative mode
        out["decode_ms"] = 1000.0 * decode_s / decode_calls
    return {k: v for k, v in out.items() if math.isfinite(v)}
