"""Parse Prometheus text exposition and derive SGLang's per-phase times from counter deltas.

SGLang (0.5.11+; checked against 0.5.23) exports `sglang:forward_execution_seconds_total
{category=...}` (with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1), `sglang:cuda_graph_passes_total
{mode=...}` and (0.5.13+) `sglang:spec_verify_calls_total`. Verify time per pass is
delta(target_verify seconds) / delta(decode passes) between two scrapes that bracket a
benchmark repetition. Counters are cumulative since start, so only deltas mean anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

Sample = tuple[str, tuple[tuple[str, str], ...]]


def parse(text: str) -> dict[Sample, float]:
    """`{(name, sorted label pairs): value}` for every sample line; comments skipped.

    prometheus_client's parser reads the exposition format as Prometheus does (escaped quotes,
    backslashes and newlines in label values, `}` or `,` inside a quoted value): a hand-written
    pattern got those wrong. A page it refuses as a whole (one garbled line, a scrape cut off
    mid-line) is read line by line, keeping every line it accepts, so one bad line costs that
    line only, not the repetition's phase metrics."""
    try:
        return _samples(text)
    except ValueError:
        out: dict[Sample, float] = {}
        for line in text.splitlines():
            try:
                out.update(_samples(line))
            except ValueError:
                continue
        return out


def _samples(text: str) -> dict[Sample, float]:
    """Every sample of `text` keyed by its own name (a counter's `_total` included); ValueError
    on a line the parser refuses."""
    out: dict[Sample, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = float(sample.value)
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


FORWARD = "sglang:forward_execution_seconds_total"  # 0.5.11+: per forward pass (0.5.23 checked)
FORWARD_0_5_9 = "sglang:gpu_execution_seconds_total"  # 0.5.9 / 0.5.10: per scheduler batch
VERIFY_CALLS = "sglang:spec_verify_calls_total"
GEN_TOKENS = "sglang:generation_tokens_total"
PROMPT_TOKENS = "sglang:prompt_tokens_total"
CACHED_TOKENS = "sglang:cached_tokens_total"
GRAPH_PASSES = "sglang:cuda_graph_passes_total"
DECODE_PASS_MODES = ("decode_cuda_graph", "decode_none")


@dataclass(frozen=True)
class PhaseDeltas:
    """What changed between two scrapes that bracket one repetition (None: no such series).

    `decode_passes` counts decode batches (`cuda_graph_passes_total{mode=decode_*}`, one per
    batch in SGLang's batch result processor): with speculative decoding each is one EAGLE
    cycle, i.e. one verify forward pass over the whole batch. `verify_calls` is what
    `spec_verify_calls_total` adds: each finished request's own verify count, so it is the
    sum of the batch sizes over those passes, not the number of passes."""

    seconds: Mapping[str, float]  # per category, per-pass timer (0.5.11+)
    batch_seconds: Mapping[str, float]  # per category, 0.5.9's scheduler-batch timer
    decode_passes: float | None
    graph_passes: float | None  # decode passes replayed from a CUDA graph
    verify_calls: float | None
    generation_tokens: float | None
    prompt_tokens: float | None
    cached_tokens: float | None

    @property
    def speculative(self) -> bool:
        return bool(self.verify_calls) or bool(self.seconds.get("target_verify"))

    def needs_prefill_probe(self, speculative: bool | None = None) -> bool:
        """The draft model's extend ran outside its CUDA graph, so its time is in `extend`,
        mixed with prefill (0.5.23's eager runner names passes by forward mode): draft_ms
        needs the prefill part measured on its own."""
        spec = self.speculative if speculative is None else speculative
        return (spec and bool(self.decode_passes) and bool(self.seconds.get("extend"))
                and not self.seconds.get("eagle_draft_extend"))


def _categories(before: Mapping[Sample, float], after: Mapping[Sample, float], name: str) -> dict[str, float]:
    cats = {dict(ls).get("category") for (n, ls), _ in after.items() if n == name}
    out = {}
    for cat in sorted(c for c in cats if c):
        d = _delta(before, after, name, category=cat)
        if d is not None:
            out[cat] = d
    return out


def deltas(before: Mapping[Sample, float], after: Mapping[Sample, float]) -> PhaseDeltas:
    passes = [_delta(before, after, GRAPH_PASSES, mode=m) for m in DECODE_PASS_MODES]
    known = [p for p in passes if p is not None]
    return PhaseDeltas(
        seconds=_categories(before, after, FORWARD),
        batch_seconds=_categories(before, after, FORWARD_0_5_9),
        decode_passes=sum(known) if known else None,
        graph_passes=passes[0] if known else None,
        verify_calls=_delta(before, after, VERIFY_CALLS),
        generation_tokens=_delta(before, after, GEN_TOKENS),
        prompt_tokens=_delta(before, after, PROMPT_TOKENS),
        cached_tokens=_delta(before, after, CACHED_TOKENS),
    )


def prefill_seconds_per_token(probe: PhaseDeltas) -> float | None:
    """`extend` seconds per computed prompt token, from a scrape pair around prefill-only
    requests (max_new_tokens=1): no decode pass may have run in between."""
    extend = probe.seconds.get("extend")
    if not extend or probe.decode_passes or probe.seconds.get("target_verify"):
        return None
    computed = (probe.prompt_tokens or 0.0) - (probe.cached_tokens or 0.0)
    return extend / computed if computed > 0 else None


def phase_metrics(before: Mapping[Sample, float], after: Mapping[Sample, float], *,
                  speculative: bool | None = None,
                  prefill_s_per_token: float | None = None) -> dict[str, float]:
    """Per-phase milliseconds from two scrapes (see `phases` for what each one means)."""
    return phases(deltas(before, after), speculative=speculative,
                  prefill_s_per_token=prefill_s_per_token)


def phases(d: PhaseDeltas, *, speculative: bool | None = None,
           prefill_s_per_token: float | None = None) -> dict[str, float]:
    """verify_ms, draft_ms per EAGLE cycle and decode_ms per plain decode step (device ms per
    forward pass of the whole batch), where the server exports what each needs:

    - verify_ms = delta(target_verify s) / decode passes; verify_ms_per_request divides by the
      verify calls instead (= verify_ms / mean batch size; equal at concurrency 1).
    - draft_ms = the draft model's time per cycle: `eagle_draft` + `eagle_draft_extend` from
      the CUDA-graph runners; without graphs the eager runner files the draft's steps under
      `decode` and its extend under `extend`, which also holds every prefill: that part is
      subtracted with `prefill_s_per_token` (measured by a prefill-only probe), and without
      it draft_ms is left out rather than reported with prefill in it.
    - decode_ms only without speculative decoding (with it, `decode` is draft time).
    - cuda_graph_share: decode passes replayed from a graph / all decode passes (with
      speculative decoding each such pass is an EAGLE cycle, and its graph is the verify's).
    - draft_graph_share: the share of the draft steps' time the CUDA-graph runner filed
      (`eagle_draft`) rather than the eager one (`decode`): the draft's own graph use.
    - prefill_ms_per_ktok: device ms of prefill per 1000 computed prompt tokens, where `extend`
      holds prefill alone (no speculation, or the draft's extend in its graph) or the probe
      measured it (`prefill_s_per_token`).
    0.5.9's scheduler-batch timer (`gpu_execution_seconds_total`) gives decode_ms only: a
    speculative batch's one number holds draft, verify and draft extend together.
    `speculative`: what the server was launched with (None: judged from the counters, which
    cannot tell for 0.5.9)."""
    spec = d.speculative if speculative is None else speculative
    out: dict[str, float] = {}
    passes = d.decode_passes
    if passes and passes > 0:
        out["cuda_graph_share"] = (d.graph_passes or 0.0) / passes
    sec = d.seconds
    if spec and passes and passes > 0:
        if "target_verify" in sec:
            out["verify_ms"] = 1000.0 * sec["target_verify"] / passes
            if d.verify_calls and d.verify_calls > 0:
                out["verify_ms_per_request"] = 1000.0 * sec["target_verify"] / d.verify_calls
        draft_s = sec.get("eagle_draft", 0.0) + sec.get("eagle_draft_extend", 0.0) + sec.get("decode", 0.0)
        if not sec.get("eagle_draft_extend") and sec.get("extend"):  # see needs_prefill_probe
            computed = (d.prompt_tokens or 0.0) - (d.cached_tokens or 0.0)
            if prefill_s_per_token is None or d.prompt_tokens is None:
                draft_s = None
            else:
                draft_s += max(0.0, sec.get("extend", 0.0) - prefill_s_per_token * computed)
        if draft_s:
            out["draft_ms"] = 1000.0 * draft_s / passes
        graph_s, eager_s = sec.get("eagle_draft", 0.0), sec.get("decode", 0.0)
        if graph_s + eager_s > 0:
            out["draft_graph_share"] = graph_s / (graph_s + eager_s)
    prefill = _prefill_s_per_token(d, spec, prefill_s_per_token)
    if prefill is not None:
        out["prefill_ms_per_ktok"] = 1e6 * prefill
    if not spec and passes and passes > 0:
        decode_s = sec.get("decode")
        if decode_s is None and not sec:
            decode_s = d.batch_seconds.get("forward_decode")  # 0.5.9: the whole decode batch
        if decode_s:
            out["decode_ms"] = 1000.0 * decode_s / passes
    return {k: v for k, v in out.items() if math.isfinite(v)}


def _prefill_s_per_token(d: PhaseDeltas, spec: bool, probed: float | None) -> float | None:
    """Prefill seconds per computed prompt token: the probe's, else `extend` / computed tokens
    where `extend` holds nothing but prefill."""
    if probed is not None:
        return probed
    extend = d.seconds.get("extend")
    computed = (d.prompt_tokens or 0.0) - (d.cached_tokens or 0.0)
    if not extend or computed <= 0:
        return None
    if spec and not d.seconds.get("eagle_draft_extend"):
        return None  # the eager draft extend is in `extend` too
    return extend / computed
