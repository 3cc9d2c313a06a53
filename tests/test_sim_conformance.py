"""The sim speaks SGLang: endpoints, field names, metric names and log formats.

Expected strings are copied from SGLang's source:
- routes and `/get_server_info` payload: python/sglang/srt/entrypoints/http_server.py
  (`health_generate`, `get_model_info`, `get_server_info`, `generate_request`, `flush_cache`);
- `meta_info` keys: python/sglang/srt/managers/tokenizer_manager.py (`_handle_batch_output`,
  spec fields from `fill_spec_decoding_meta`);
- metric names, label names and histogram buckets:
  python/sglang/srt/observability/metrics_collector.py (SchedulerMetricsCollector,
  TokenizerMetricsCollector; read on main, 2026; the 0.5.23 names the design relies on);
- log lines: `report_prefill_stats` / `report_decode_stats` (scheduler metrics mixin) in the
  v0.5.9 format, and `Load weight begin.` / `Capture cuda graph begin.` (model_runner.py) and
  "The server is fired up and ready to roll!" (http_server.py `_wait_and_warmup`).
"""

from __future__ import annotations

import http.client
import json
import re
import urllib.error
import urllib.request

import pytest

from orchestrator.bench import prometheus
from orchestrator.targets.sim.launcher import SimProcess, run_sim

FAST = ["--sim-time-scale", "0.02", "--sim-load-seconds", "2", "--sim-noise-restart-cv", "0",
        "--sim-noise-request-cv", "0"]  # fmt: skip
EAGLE = ["--tp-size", "8", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]  # fmt: skip

# --- strings copied from SGLang ------------------------------------------------------------
LOG_PREFIX_TP = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} TP0\] "
LOG_PREFIX_MAIN = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] "
F2 = r"\d+\.\d{2}"
DECODE_LINE = re.compile(
    "^" + LOG_PREFIX_TP + r"Decode batch, #running-req: \d+, #token: \d+, token usage: " + F2
    + ", accept len: " + F2 + ", accept rate: " + F2 + r", cuda graph: (True|False), "
    r"gen throughput \(token/s\): " + F2 + r", #queue-req: \d+$"
)  # fmt: skip
DECODE_LINE_BASELINE = re.compile(
    "^" + LOG_PREFIX_TP + r"Decode batch, #running-req: \d+, #token: \d+, token usage: " + F2
    + r", cuda graph: (True|False), gen throughput \(token/s\): " + F2 + r", #queue-req: \d+$"
)  # fmt: skip
PREFILL_LINE = re.compile(
    "^" + LOG_PREFIX_TP + r"Prefill batch, #new-seq: \d+, #new-token: \d+, #cached-token: \d+, "
    "token usage: " + F2 + r", #running-req: \d+, #queue-req: \d+, "
    r"input throughput \(token/s\): " + F2 + r", cuda graph: (True|False)$"
)  # fmt: skip
STARTUP_LINES = (
    re.compile("^" + LOG_PREFIX_TP + r"Load weight begin\. avail mem=" + F2 + " GB$"),
    re.compile("^" + LOG_PREFIX_TP + r"Load weight end\. type=\w+, dtype=torch\.\w+, avail mem="),
    re.compile("^" + LOG_PREFIX_TP + r"Capture cuda graph begin\. This can take up to several "
               r"minutes\. avail mem=" + F2 + " GB$"),  # fmt: skip
    re.compile("^" + LOG_PREFIX_TP + r"Capture cuda graph end\. Time elapsed: " + F2 + r" s\. "),
    re.compile("^" + LOG_PREFIX_MAIN + r"INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ "),
    re.compile("^" + LOG_PREFIX_MAIN + "The server is fired up and ready to roll!$"),
)
SERVER_ARG_FIELDS = (
    "model_path", "tokenizer_path", "host", "port", "tp_size", "dp_size", "served_model_name",
    "speculative_algorithm", "speculative_draft_model_path", "speculative_num_steps",
    "speculative_eagle_topk", "speculative_num_draft_tokens", "cuda_graph_max_bs",
    "disable_cuda_graph", "enable_metrics", "decode_log_interval", "max_running_requests",
    "chunked_prefill_size", "mem_fraction_static", "weight_version",
)  # fmt: skip
META_KEYS = ("id", "finish_reason", "prompt_tokens", "weight_version", "total_retractions",
             "completion_tokens", "cached_tokens")  # fmt: skip
SPEC_META_KEYS = ("spec_verify_ct", "spec_accept_rate", "spec_accept_length",
                  "spec_accepted_drafts", "spec_proposed_drafts", "spec_accept_histogram")  # fmt: skip
METRIC_NAMES = (
    "sglang:num_running_reqs", "sglang:num_queue_reqs", "sglang:gen_throughput",
    "sglang:token_usage", "sglang:spec_accept_length", "sglang:spec_accept_rate",
    "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
    "sglang:spec_verify_calls_total", "sglang:forward_execution_seconds_total",
    "sglang:cuda_graph_passes_total", "sglang:num_requests_total",
    "sglang:time_to_first_token_seconds_bucket", "sglang:time_to_first_token_seconds_sum",
    "sglang:time_to_first_token_seconds_count", "sglang:inter_token_latency_seconds_bucket",
    "sglang:inter_token_latency_seconds_sum", "sglang:inter_token_latency_seconds_count",
    "sglang:e2e_request_latency_seconds_bucket", "sglang:e2e_request_latency_seconds_sum",
    "sglang:e2e_request_latency_seconds_count",
)  # fmt: skip
FORWARD_CATEGORIES = ("decode", "extend", "target_verify", "eagle_draft", "eagle_draft_extend", "idle")
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)


# One server per test (not per module): the suite's guard fails any test that leaves a
# process running, and a launch costs only ~0.3 s at this time scale.
@pytest.fixture
def eagle(tmp_path) -> SimProcess:
    d = tmp_path
    args = [*EAGLE, *FAST, "--enable-metrics", "--decode-log-interval", "4"]
    with run_sim(args, cwd=d, log_path=d / "server.log") as sim:
        yield sim


@pytest.fixture
def baseline(tmp_path) -> SimProcess:
    d = tmp_path / "base"
    d.mkdir()
    with run_sim(["--tp-size", "8", *FAST], cwd=d, log_path=d / "server.log") as sim:
        yield sim


def _generate(sim: SimProcess, n: int = 12, **extra) -> dict:
    doc = {"input_ids": list(range(1000, 1032)), "sampling_params": {"max_new_tokens": n,
           "temperature": 0.0, "ignore_eos": True}, **extra}  # fmt: skip
    return sim.post_json("/generate", doc)


def _raw_stream(sim: SimProcess, path: str, doc: dict) -> tuple[dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sim.port, timeout=30)
    try:
        conn.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def test_health_server_info_and_model_info(eagle):
    assert eagle.status("/health") == 200 and eagle.status("/health_generate") == 200
    _generate(eagle)
    info = eagle.get_json("/server_info")
    assert info == {**eagle.get_json("/get_server_info"), "internal_states": info["internal_states"]}
    for field in SERVER_ARG_FIELDS:
        assert field in info, field
    assert info["tp_size"] == 8 and info["speculative_algorithm"] == "EAGLE3"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == (2, 1, 3)  # fmt: skip
    assert info["cuda_graph_max_bs"] >= 1 and info["disable_cuda_graph"] is False
    assert info["max_running_requests"] == 48  # SGLang's cap with EAGLE
    assert isinstance(info["version"], str)
    state = info["internal_states"][0]
    assert 1.0 < state["avg_spec_accept_length"] <= 3.0  # tokens per verify, bonus included
    assert "last_gen_throughput" in state
    model_info = eagle.get_json("/get_model_info")
    assert set(model_info) == {"model_path", "tokenizer_path", "is_generation",
                               "preferred_sampling_params", "weight_version"}  # fmt: skip
    assert model_info["is_generation"] is True
    models = eagle.get_json("/v1/models")
    assert models["object"] == "list" and models["data"][0]["id"] == info["served_model_name"]


def test_generate_non_streaming(eagle):
    out = _generate(eagle, n=17)
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    for key in (*META_KEYS, *SPEC_META_KEYS, "e2e_latency"):
        assert key in meta, key
    assert len(out["output_ids"]) == meta["completion_tokens"] == 17
    assert meta["finish_reason"] == {"type": "length", "length": 17}
    assert meta["prompt_tokens"] == 32
    assert meta["spec_accept_length"] == pytest.approx(17 / meta["spec_verify_ct"])
    assert meta["spec_proposed_drafts"] == meta["spec_verify_ct"] * 2
    assert sum(meta["spec_accept_histogram"]) == meta["spec_verify_ct"]
    assert meta["e2e_latency"] > 0
    again = _generate(eagle, n=17)
    assert again["text"] == out["text"]  # deterministic output for the same prompt
    assert again["meta_info"]["cached_tokens"] > 0  # radix cache hit on the repeated prompt
    batch = eagle.post_json("/generate", {"text": ["a b c", "d e"], "sampling_params": {"max_new_tokens": 3}})
    assert isinstance(batch, list) and [len(b["output_ids"]) for b in batch] == [3, 3]


def test_generate_stream_is_sse_with_cumulative_text(eagle):
    doc = {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 20, "ignore_eos": True},
           "stream": True}  # fmt: skip
    headers, body = _raw_stream(eagle, "/generate", doc)
    assert headers["content-type"].startswith("text/event-stream")
    events = body.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    chunks = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all(e.startswith("data: ") for e in events[:-1])
    assert len(chunks) >= 2
    for prev, cur in zip(chunks, chunks[1:], strict=False):
        assert cur["text"].startswith(prev["text"])  # cumulative, like SGLang's /generate
        assert cur["meta_info"]["completion_tokens"] > prev["meta_info"]["completion_tokens"]
        assert "e2e_latency" not in prev["meta_info"] and prev["meta_info"]["finish_reason"] is None
    last = chunks[-1]
    assert last["meta_info"]["completion_tokens"] == len(last["output_ids"]) == 20
    assert last["meta_info"]["finish_reason"]["type"] == "length"
    assert "e2e_latency" in last["meta_info"] and "spec_verify_ct" in last["meta_info"]


def test_openai_completions(eagle):
    out = eagle.post_json("/v1/completions", {"model": "x", "prompt": "Hello there", "max_tokens": 5})
    assert out["object"] == "text_completion" and out["choices"][0]["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 5
    assert out["usage"]["total_tokens"] == out["usage"]["prompt_tokens"] + 5
    doc = {"prompt": "Hello there", "max_tokens": 6, "stream": True,
           "stream_options": {"include_usage": True}}  # fmt: skip
    _, body = _raw_stream(eagle, "/v1/completions", doc)
    events = [e.removeprefix("data: ") for e in body.decode().split("\n\n") if e]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])  # deltas
    assert len(text.split()) == 6
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    _, body = _raw_stream(eagle, "/v1/completions", {**doc, "stream_options": None})
    assert all(json.loads(e[6:])["usage"] is None for e in body.decode().split("\n\n")[:-2])


def test_metrics_names_types_and_labels(eagle):
    _generate(eagle, n=30)
    with urllib.request.urlopen(eagle.base_url + "/metrics") as resp:
        assert resp.headers["content-type"].startswith("text/plain")
        text = resp.read().decode()
    samples = prometheus.parse(text)
    names = {name for name, _ in samples}
    for name in METRIC_NAMES:
        assert name in names, name
    assert "# TYPE sglang:prompt_tokens counter" in text
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in text
    assert "# TYPE sglang:gen_throughput gauge" in text
    cats = {dict(ls).get("category") for n, ls in samples if n == "sglang:forward_execution_seconds_total"}
    assert cats == set(FORWARD_CATEGORIES)
    les = [dict(ls)["le"] for n, ls in samples if n == "sglang:time_to_first_token_seconds_bucket"
           and dict(ls)["is_streaming"] == "false"]  # fmt: skip
    assert [float(x) for x in les] == [*map(float, TTFT_BUCKETS), float("inf")]
    verify = prometheus.total(samples, "sglang:forward_execution_seconds_total", category="target_verify")
    calls = prometheus.total(samples, "sglang:spec_verify_calls_total")
    assert verify > 0 and calls > 0
    assert 1000 * verify / calls == pytest.approx(19.0, rel=0.02)  # per-call verify ms
    assert prometheus.total(samples, "sglang:forward_execution_seconds_total", category="decode") == 0
    sched = dict(next(ls for n, ls in samples if n == "sglang:num_running_reqs"))
    assert set(sched) == {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}


def test_log_lines_match_sglang_formats(eagle, baseline):
    _generate(eagle, n=40)
    _generate(baseline, n=45)
    log = eagle.log().splitlines()
    assert any(DECODE_LINE.match(line) for line in log)
    assert any(PREFILL_LINE.match(line) for line in log)
    for pattern in STARTUP_LINES:
        assert any(pattern.match(line) for line in log), pattern.pattern
    base_log = baseline.log().splitlines()
    assert any(DECODE_LINE_BASELINE.match(line) for line in base_log)
    assert not any("accept len" in line for line in base_log)
    order = [i for i, line in enumerate(log) if "Load weight begin" in line or "fired up" in line]
    assert "Load weight begin" in log[order[0]] and "fired up" in log[order[-1]]


def test_flush_cache_resets_accept_statistics(eagle):
    _generate(eagle)
    assert "avg_spec_accept_length" in eagle.get_json("/server_info")["internal_states"][0]
    with urllib.request.urlopen(urllib.request.Request(eagle.base_url + "/flush_cache", method="POST")) as r:
        assert r.status == 200 and r.read().decode() == FLUSH_TEXT
    assert "avg_spec_accept_length" not in eagle.get_json("/server_info")["internal_states"][0]
    first = _generate(eagle, n=10)
    assert first["meta_info"]["cached_tokens"] == 0  # the prefix cache was flushed too


def test_baseline_surfaces_and_errors(baseline):
    assert baseline.status("/metrics") == 404  # SGLang exports /metrics only with --enable-metrics
    out = _generate(baseline, n=9)
    assert not any(k.startswith("spec_") for k in out["meta_info"])
    assert "avg_spec_accept_length" not in baseline.get_json("/server_info")["internal_states"][0]
    assert baseline.status("/no_such_route") == 404
    with pytest.raises(urllib.error.HTTPError) as info:
        baseline.post_json("/generate", {"sampling_params": {"max_new_tokens": 3}})
    assert info.value.code == 400
    assert json.loads(info.value.read())["message"].startswith("Either text, input_ids")
    with pytest.raises(urllib.error.HTTPError) as info:
        baseline.post_json("/generate", {"text": "x", "sampling_params": {"max_new_tokens": -1}})
    assert info.value.code == 400
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(baseline.base_url + "/generate")  # GET is not a route method
    assert info.value.code == 405
