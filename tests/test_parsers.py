"""Server-side parsers against verbatim SGLang output formats."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.bench import prometheus
from orchestrator.bench.sglang_log import log_metrics, parse_decode

FIXTURES = Path(__file__).parent / "fixtures"

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


def test_graph_field_is_parsed_on_every_device():
    """0.5.23 names the field after the device (`_graph_backend_label`): each label the saved
    source lists is read, not only `cuda graph`."""
    facts = json.loads((FIXTURES / "sglang_0_5_23" / "source_facts.json").read_text())
    labels = facts["log_formats"]["graph_labels"]
    assert {"cuda graph", "cpu graph", "npu graph", "musa graph"} <= set(labels)
    for label in labels:
        line = DECODE_059.replace("cuda graph: True", f"{label}: False")
        assert parse_decode(line).cuda_graph is False, label


def _expo(**series: float) -> str:
    """Prometheus text for `category=...`/`mode=...` series (scheduler labels abridged)."""
    lines = []
    for key, value in series.items():
        if key in ("verify_calls", "gen_tokens", "prompt_tokens"):
            name = {"verify_calls": "sglang:spec_verify_calls_total",
                    "gen_tokens": "sglang:generation_tokens_total",
                    "prompt_tokens": "sglang:prompt_tokens_total"}[key]
            lines.append(f'{name}{{model_name="m"}} {value}')
        elif key in ("decode_cuda_graph", "decode_none"):
            lines.append(f'sglang:cuda_graph_passes_total{{model_name="m",mode="{key}"}} {value}')
        elif key.startswith("batch_"):
            lines.append(f'sglang:gpu_execution_seconds_total{{category="{key[6:]}",model_name="m"}} {value}')
        else:
            lines.append(f'sglang:forward_execution_seconds_total{{category="{key}",model_name="m"}} {value}')
    return "\n".join(lines) + "\n"


def _phases(before: dict, after: dict, **kw) -> dict:
    return prometheus.phase_metrics(prometheus.parse(_expo(**before)), prometheus.parse(_expo(**after)), **kw)


def test_verify_per_pass_and_per_request_at_concurrency_four():
    # 100 decode passes of 4 requests each: spec_verify_calls_total (per request) grows by 400.
    m = _phases({"target_verify": 1.0, "eagle_draft": 0.1, "eagle_draft_extend": 0.1,
                 "verify_calls": 0, "decode_cuda_graph": 0},
                {"target_verify": 3.9, "eagle_draft": 0.5, "eagle_draft_extend": 0.3,
                 "verify_calls": 400, "decode_cuda_graph": 100})
    assert m["verify_ms"] == pytest.approx(29.0)  # one pass over the whole batch
    assert m["verify_ms_per_request"] == pytest.approx(29.0 / 4)
    assert m["draft_ms"] == pytest.approx(6.0)
    assert m["cuda_graph_share"] == 1.0 and "decode_ms" not in m
    assert m["draft_graph_share"] == 1.0  # the draft's steps ran in its graph runner


def test_prefill_per_token_only_where_extend_holds_prefill_alone():
    """The draft's extend in its graph: `extend` is prefill, per computed prompt token."""
    before = {"target_verify": 0.0, "eagle_draft": 0.0, "eagle_draft_extend": 0.0, "extend": 0.0,
              "decode": 0.0, "decode_cuda_graph": 0, "prompt_tokens": 0}
    after = {"target_verify": 1.0, "eagle_draft": 0.2, "eagle_draft_extend": 0.1, "extend": 0.1,
             "decode": 0.2, "decode_cuda_graph": 50, "prompt_tokens": 512}
    m = _phases(before, after)
    assert m["prefill_ms_per_ktok"] == pytest.approx(1e6 * 0.1 / 512)
    assert m["draft_graph_share"] == pytest.approx(0.5)  # half the draft steps' time eager


def test_eager_draft_is_draft_time_not_decode_time():
    """Without graphs 0.5.23 files the draft's steps under `decode` and its extend under
    `extend`, with prefill: decode_ms must not appear, draft_ms only with prefill measured."""
    before = {"target_verify": 0.0, "decode": 0.0, "extend": 0.0, "verify_calls": 0,
              "decode_none": 0, "prompt_tokens": 0}
    # 50 cycles: verify 20 ms, draft steps 6 ms, draft extend 3 ms; prefill 4 x 128 tokens, 25 ms each.
    after = {"target_verify": 1.0, "decode": 0.3, "extend": 0.15 + 0.1, "verify_calls": 50,
             "decode_none": 50, "prompt_tokens": 512}
    assert prometheus.deltas(prometheus.parse(_expo(**before)),
                             prometheus.parse(_expo(**after))).needs_prefill_probe()
    without = _phases(before, after)
    assert "decode_ms" not in without and "draft_ms" not in without
    assert without["verify_ms"] == pytest.approx(20.0) and without["cuda_graph_share"] == 0.0
    assert "prefill_ms_per_ktok" not in without  # `extend` mixes the draft's extend in
    assert without["draft_graph_share"] == 0.0
    m = _phases(before, after, prefill_s_per_token=0.025 / 128)
    assert m["draft_ms"] == pytest.approx(9.0)
    assert m["prefill_ms_per_ktok"] == pytest.approx(1e6 * 0.025 / 128)  # the probe's


def test_prefill_probe_gives_seconds_per_computed_token():
    probe = prometheus.deltas(prometheus.parse(_expo(extend=1.0, prompt_tokens=100)),
                              prometheus.parse(_expo(extend=1.1, prompt_tokens=612)))
    assert prometheus.prefill_seconds_per_token(probe) == pytest.approx(0.1 / 512)
    ran_decode = prometheus.deltas(prometheus.parse(_expo(extend=1.0, prompt_tokens=0, decode_none=0)),
                                   prometheus.parse(_expo(extend=1.1, prompt_tokens=512, decode_none=3)))
    assert prometheus.prefill_seconds_per_token(ran_decode) is None


def test_plain_decode_per_step_and_0_5_9_batch_timer():
    m = _phases({"decode": 0.0, "decode_cuda_graph": 0}, {"decode": 1.12, "decode_cuda_graph": 100})
    assert m == {"decode_ms": pytest.approx(11.2), "cuda_graph_share": 1.0}
    # 0.5.9 times whole scheduler batches: a plain decode batch is a decode step ...
    old = _phases({"batch_forward_decode": 0.0, "decode_none": 0},
                  {"batch_forward_decode": 1.12, "decode_none": 100}, speculative=False)
    assert old["decode_ms"] == pytest.approx(11.2)
    # ... but a speculative one is draft + verify + extend in one number: nothing to report.
    spec = _phases({"batch_forward_decode": 0.0, "decode_none": 0},
                   {"batch_forward_decode": 3.0, "decode_none": 100}, speculative=True)
    assert spec == {"cuda_graph_share": 0.0}


def test_phase_metrics_absent_without_counters():
    assert prometheus.phase_metrics({}, prometheus.parse("sglang:num_running_reqs 1\n")) == {}


def test_label_values_with_escapes_and_braces_are_read_as_prometheus_does():
    """A quoted label value may hold `}`, `,`, `=` and the escapes `\\"`, `\\\\`, `\\n` (a model
    path, a LoRA name): the sample is kept, its value unescaped, and its other labels still
    select it. A pattern that ended the labels at the first `}` dropped such a sample."""
    text = (
        "# TYPE sglang:forward_execution_seconds_total counter\n"
        'sglang:forward_execution_seconds_total{category="target_verify",model_name="m}x,y=z"} 2.5\n'
        'sglang:forward_execution_seconds_total{category="decode",model_name="a\\"b\\\\c\\nd"} 1.5\n'
    )
    samples = prometheus.parse(text)
    assert samples == {
        ("sglang:forward_execution_seconds_total",
         (("category", "target_verify"), ("model_name", "m}x,y=z"))): 2.5,
        ("sglang:forward_execution_seconds_total",
         (("category", "decode"), ("model_name", 'a"b\\c\nd'))): 1.5,
    }
    assert prometheus.total(samples, prometheus.FORWARD, category="target_verify") == 2.5
    assert prometheus.total(samples, prometheus.FORWARD, model_name='a"b\\c\nd') == 1.5


def test_a_garbled_line_costs_that_line_only():
    """A page the parser refuses as a whole (a line cut off mid-scrape, a stray word) is read
    line by line: every well-formed sample around the bad line is kept, as before."""
    text = (
        '# TYPE sglang:cuda_graph_passes_total counter\n'
        'sglang:cuda_graph_passes_total{mode="decode_cuda_graph"} 7\n'
        'sglang:cuda_graph_passes_total{mode="decode_none"\n'
        'not a sample at all\n'
        'sglang:spec_verify_calls_total{model_name="m"} 3e2 1700000000000\n'
    )
    samples = prometheus.parse(text)
    assert samples == {
        ("sglang:cuda_graph_passes_total", (("mode", "decode_cuda_graph"),)): 7.0,
        ("sglang:spec_verify_calls_total", (("model_name", "m"),)): 300.0,
    }
    assert all(type(v) is float for v in samples.values())
