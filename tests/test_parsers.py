"""Server-side parsers against verbatim SGLang output formats."""

from __future__ import annotations

import pytest

from orchestrator.bench import prometheus
from orchestrator.bench.sglang_log import log_metrics, parse_decode

# Decode log line as built by the decode-stats log statement of SGLang 0.5.x's scheduler
DECODE_059 = ("[2026-02-27 10:00:00 TP0] Decode batch, #running-req: 1, #token: 310, token usage: 0.00, "
              "accept len: 2.10, accept rate: 0.70, cuda graph: True, gen throughput (token/s): 94.12, "
              "#queue-req: 0")
# Older releases (the early scheduler) wrote "Decode batch." without speculative fields.
DECODE_OLD = ("[2025-06-01 10:00:00 TP0] Decode batch. #running-req: 4, #token: 1200, token usage: 0.01, "
              "cuda graph: False, gen throughput (token/s): 310.55, #queue-req: 0")


def test_decode_lines_both_forms():
    new = parse_decode(DECODE_059)
    assert (new.running_req, new.accept_len, new.cuda_graph, new.gen_throughput) == (1, 2.10, True, 94.12)
    old = parse_decode(DECODE_OLD)
    assert (old.running_req, old.accept_len, old.cuda_graph) == (4, None, False)
    assert parse_decode("[x TP0] Prefill batch, #new-seq: 1") is None


def test_log_metrics_share_of_graph_batches():
    text = "\n".join([DECODE_059, DECODE_059.replace("cuda graph: True", "cuda graph: False"), "noise"])
    m = log_metrics(text)
    assert m["cuda_graph_share"] == pytest.approx(0.5)
    assert m["log_accept_len"] == pytest.approx(2.10)


BEFORE = """# HELP sglang:spec_verify_calls_total Total verify calls
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="m"} 100.0
sglang:forward_execution_seconds_total{category="target_verify",model_name="m"} 1.9
sglang:forward_execution_seconds_total{category="eagle_draft",model_name="m"} 0.3
sglang:forward_execution_seconds_total{category="decode",model_name="m"} 0.0
sglang:cuda_graph_passes_total{mode="decode_cuda_graph",model_name="m"} 10.0
"""
AFTER = """sglang:spec_verify_calls_total{model_name="m"} 300.0
sglang:forward_execution_seconds_total{category="target_verify",model_name="m"} 7.7
sglang:forward_execution_seconds_total{category="eagle_draft",model_name="m"} 0.96
sglang:forward_execution_seconds_total{category="decode",model_name="m"} 1.12
sglang:cuda_graph_passes_total{mode="decode_cuda_graph",model_name="m"} 90.0
sglang:cuda_graph_passes_total{mode="decode_none",model_name="m"} 20.0
"""


def test_phase_metrics_from_counter_deltas():
    m = prometheus.phase_metrics(prometheus.parse(BEFORE), prometheus.parse(AFTER))
    assert m["verify_ms"] == pytest.approx(29.0)
    assert m["draft_ms"] == pytest.approx(3.3)
    assert m["decode_ms"] == pytest.approx(1000 * 1.12 / 100)


def test_phase_metrics_absent_without_counters():
    assert prometheus.phase_metrics({}, prometheus.parse("sglang:num_running_reqs 1\n")) == {}
