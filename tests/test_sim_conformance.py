"""The sim speaks SGLang: endpoints, field names, metric names and log formats, for each release
it imitates (`--sim-sglang-version 0.5.23`, the default, and `0.5.9`).

Expected names and formats come from the saved facts of the real packages
(tests/fixtures/sglang_*/, see tests/sglang_facts.py and experiments/sglang_fixtures.py):
metric names from the metrics collector, forward-time categories from the runners, the decode /
prefill log f-strings, `meta_info` keys from the tokenizer manager, routes and `/model_info`
fields from http_server.py, ServerArgs fields (0.5.23: what `build_server_info` returned).
Strings no fixture holds (startup lines, the flush text) are copied from the same sources:
`Load weight begin.` / `Capture cuda graph begin.` (model_runner.py), "The server is fired up
and ready to roll!" (http_server.py `_wait_and_warmup`).
"""

from __future__ import annotations

import http.client
import json
import os
import re
import urllib.error
import urllib.request

import pytest

from orchestrator.bench import prometheus
from tests import sglang_facts as sf
from tests.sim_client import SimClient, run_sim

FAST = ["--sim-time-scale", "0.02", "--sim-load-seconds", "2", "--sim-noise-restart-cv", "0",
        "--sim-noise-request-cv", "0"]  # fmt: skip
EAGLE = ["--tp-size", "8", "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]  # fmt: skip
TIMER_ENV = {**os.environ, "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}

LOG_PREFIX_TP = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} TP0\] "
LOG_PREFIX_MAIN = r"\[\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\] "
F2 = sf.F2
STARTUP_LINES = (
    re.compile("^" + LOG_PREFIX_TP + r"Load weight begin\. avail mem=" + F2 + " GB$"),
    re.compile("^" + LOG_PREFIX_TP + r"Load weight end\. type=\w+, dtype=torch\.\w+, avail mem="),
    re.compile("^" + LOG_PREFIX_TP + r"Capture cuda graph begin\. This can take up to several "
               r"minutes\. avail mem=" + F2 + " GB$"),  # fmt: skip
    re.compile("^" + LOG_PREFIX_TP + r"Capture cuda graph end\. Time elapsed: " + F2 + r" s\. "),
    re.compile("^" + LOG_PREFIX_MAIN + r"INFO:     Uvicorn running on http://127\.0\.0\.1:\d+ "),
    re.compile("^" + LOG_PREFIX_MAIN + "The server is fired up and ready to roll!$"),
)
# Keys the route adds around ServerArgs, and scheduler info (not ServerArgs fields).
SERVER_INFO_EXTRA = {"internal_states", "version", "max_total_num_tokens", "max_req_input_len"}
TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
FLUSH_TEXT = (
    "Cache flushed.\nPlease check backend logs for more details. "
    "(When there are running or waiting requests, the operation will not be performed.)\n"
)
SPEC_NAMES = {  # (correct drafts, proposed drafts, histogram) in each release's meta_info
    "0.5.9": ("spec_accept_token_num", "spec_draft_token_num", "spec_accept_histogram"),
    "0.5.23": ("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_correct_drafts_histogram"),
}


def log_line_regexes(version: str, *, speculative: bool, device_timer: bool) -> tuple[re.Pattern, re.Pattern]:
    """(decode, prefill) line regexes assembled from the release's own saved f-strings, on the
    path a single-node, non-disaggregated CUDA server takes."""
    fmt = sf.facts(version)["log_formats"]
    dec, pre = fmt["decode"]["fstrings"], fmt["prefill"]["fstrings"]
    iters = r"(?: \[\d+\])?"
    if version == "0.5.23":
        usage = fmt["usage_fstrings"]
        # `", ".join(parts) + ", "` in the reporter
        dec_usage = sf.fstring(sf.pick(usage["get_decode_usage_msg_parts"], "#token: ")[0], {}) + ", "
        pre_usage = sf.fstring(sf.pick(usage["get_prefill_usage_msg_parts"], "token usage: ")[0], {}) + ", "
        graph_expr = "self._graph_backend_label"
    else:  # the usage f-strings are in the log function itself, separator included
        dec_usage = sf.fstring(sf.pick(dec, "#token: ")[0], {})
        pre_usage = sf.fstring(sf.pick(pre, "token usage: ")[0], {})
        graph_expr = "graph_backend[self.device]"
    values = {"iter_msg": iters, graph_expr: "cuda graph", "can_run_cuda_graph": "(True|False)"}
    graph = "{" + graph_expr + "}"
    head = sf.pick(dec, "Decode batch")[0]
    decode = sf.fstring(head, {**values, "token_usage_msg": dec_usage})
    if speculative:
        decode += sf.fstring(sf.pick(dec, "accept len")[0], values)
    decode += sf.fstring(sf.pick(dec, graph)[0], values)
    prefill = sf.fstring(sf.pick(pre, "Prefill batch")[0], {**values, "token_usage_msg": pre_usage})
    order = (graph, "input throughput") if version == "0.5.23" else ("input throughput", graph)
    prefill += "".join(sf.fstring(s, values) for s in sf.pick(pre, *order))
    if device_timer and version == "0.5.23":
        occupancy = ", " + sf.fstring(fmt["occupancy_fstrings"][0], {})
        decode, prefill = decode + occupancy, prefill + occupancy
    return re.compile("^" + LOG_PREFIX_TP + decode + "$"), re.compile("^" + LOG_PREFIX_TP + prefill + "$")


# One server per test (not per module): the suite's guard fails any test that leaves a
# process running, and a launch costs only ~0.3 s at this time scale.
@pytest.fixture(params=sf.VERSIONS)
def version(request) -> str:
    return request.param


@pytest.fixture
def eagle(tmp_path, version) -> SimClient:
    d = tmp_path
    args = [*EAGLE, *FAST, "--enable-metrics", "--decode-log-interval", "4",
            "--sim-sglang-version", version]  # fmt: skip
    with run_sim(args, cwd=d, log_path=d / "server.log", env=TIMER_ENV) as sim:
        sim.version = version
        yield sim


@pytest.fixture
def baseline(tmp_path, version) -> SimClient:
    d = tmp_path / "base"
    d.mkdir()
    args = ["--tp-size", "8", *FAST, "--sim-sglang-version", version]
    with run_sim(args, cwd=d, log_path=d / "server.log", env=TIMER_ENV) as sim:
        yield sim


def _generate(sim: SimClient, n: int = 12, **extra) -> dict:
    doc = {"input_ids": list(range(1000, 1032)), "sampling_params": {"max_new_tokens": n,
           "temperature": 0.0, "ignore_eos": True}, **extra}  # fmt: skip
    return sim.post_json("/generate", doc)


def _raw_stream(sim: SimClient, path: str, doc: dict) -> tuple[dict, bytes]:
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
    real = (sf.server_info_keys() if eagle.version == "0.5.23"
            else set(sf.facts("0.5.9")["server_args_fields"]))
    assert set(info) - SERVER_INFO_EXTRA <= real, sorted(set(info) - SERVER_INFO_EXTRA - real)
    assert info["version"] == eagle.version
    assert info["tp_size"] == 8 and info["speculative_algorithm"] == "EAGLE3"
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"]) == (2, 1, 3)  # fmt: skip
    max_bs = "cuda_graph_max_bs_decode" if eagle.version == "0.5.23" else "cuda_graph_max_bs"
    assert info[max_bs] >= 1 and info["disable_cuda_graph"] is False
    assert info["max_running_requests"] == 48  # SGLang's cap with EAGLE
    state = info["internal_states"][0]
    assert 1.0 < state["avg_spec_accept_length"] <= 3.0  # tokens per verify, bonus included
    assert "last_gen_throughput" in state
    # /model_info (bench_serving reads the tokenizer from it) and its deprecated alias.
    model_info = eagle.get_json("/model_info")
    assert model_info == eagle.get_json("/get_model_info")
    assert set(model_info) == set(sf.facts(eagle.version)["http"]["model_info_keys"])
    assert model_info["is_generation"] is True
    routes = sf.facts(eagle.version)["http"]["routes"]
    for path in ("/model_info", "/get_model_info", "/server_info", "/get_server_info",
                 "/health_generate", "/flush_cache", "/generate"):
        assert path in routes, path
    models = eagle.get_json("/v1/models")
    assert models["object"] == "list" and models["data"][0]["id"] == info["served_model_name"]


def test_generate_non_streaming(eagle):
    out = _generate(eagle, n=17)
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert set(meta) <= sf.meta_keys(eagle.version), sorted(set(meta) - sf.meta_keys(eagle.version))
    correct, proposed, histogram = SPEC_NAMES[eagle.version]
    for key in ("id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
                "e2e_latency", "spec_verify_ct", "spec_accept_rate", "spec_accept_length",
                correct, proposed, histogram):
        assert key in meta, key
    assert len(out["output_ids"]) == meta["completion_tokens"] == 17
    assert meta["finish_reason"] == {"type": "length", "length": 17}
    assert meta["prompt_tokens"] == 32
    assert meta["spec_accept_length"] == pytest.approx(17 / meta["spec_verify_ct"])
    assert meta[proposed] == meta["spec_verify_ct"] * 2
    assert meta["spec_accept_rate"] == pytest.approx(meta[correct] / meta[proposed])
    assert sum(meta[histogram]) == meta["spec_verify_ct"]
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
    # One chunk per step while the handler keeps up; a busy host can finish the whole
    # generation before the handler writes, and the steps then arrive as one cumulative chunk.
    assert len(chunks) >= 1
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
    assert names <= sf.metric_names(eagle.version), sorted(names - sf.metric_names(eagle.version))
    assert "# TYPE sglang:prompt_tokens counter" in text
    assert "# TYPE sglang:time_to_first_token_seconds histogram" in text
    assert "# TYPE sglang:gen_throughput gauge" in text
    les = [dict(ls)["le"] for n, ls in samples if n == "sglang:time_to_first_token_seconds_bucket"
           and dict(ls)["is_streaming"] == "false"]  # fmt: skip
    assert [float(x) for x in les] == [*map(float, TTFT_BUCKETS), float("inf")]
    sched = dict(next(ls for n, ls in samples if n == "sglang:num_running_reqs"))
    assert set(sched) == {"model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank"}
    passes = prometheus.total(samples, "sglang:cuda_graph_passes_total", mode="decode_cuda_graph")
    if eagle.version == "0.5.9":
        # One timer around each scheduler batch: "forward_" + the batch's forward mode.
        assert "sglang:spec_verify_calls_total" not in names
        cats = {dict(ls)["category"] for n, ls in samples if n == "sglang:gpu_execution_seconds_total"}
        assert cats == {"forward_extend", "forward_decode"}
        assert sf.categories("0.5.9", "scheduler_metrics_mixin.py") == {"forward_"}
        return
    cats = {dict(ls)["category"] for n, ls in samples if n == "sglang:forward_execution_seconds_total"}
    # In CUDA graphs: each graph runner's own category (the saved source's, file by file).
    assert cats == ({"extend"} | sf.categories("0.5.23", "eager_runner.py") & {"target_verify"}
                    | sf.categories("0.5.23", "eagle_draft_cuda_graph_runner.py")
                    | sf.categories("0.5.23", "eagle_draft_extend_cuda_graph_runner.py"))
    verify = prometheus.total(samples, "sglang:forward_execution_seconds_total", category="target_verify")
    calls = prometheus.total(samples, "sglang:spec_verify_calls_total")
    assert verify > 0 and calls == passes  # one request: a verify call per decode pass
    assert 1000 * verify / passes == pytest.approx(19.0, rel=0.02)  # verify ms per pass


def test_eager_draft_passes_are_filed_as_decode_and_extend(tmp_path):
    """0.5.23 without CUDA graphs: the eager runner names passes by forward mode, so the
    draft's steps are `decode`, its extend `extend`, verify still `target_verify`."""
    args = [*EAGLE, *FAST, "--enable-metrics", "--cuda-graph-backend-decode", "disabled",
            "--cuda-graph-backend-prefill", "disabled"]  # fmt: skip
    with run_sim(args, cwd=tmp_path, log_path=tmp_path / "server.log", env=TIMER_ENV) as sim:
        _generate(sim, n=30)
        samples = prometheus.parse(urllib.request.urlopen(sim.base_url + "/metrics").read().decode())
        log = sim.log()
    cats = {dict(ls)["category"] for n, ls in samples if n == "sglang:forward_execution_seconds_total"}
    eager = sf.categories("0.5.23", "eager_runner.py") - {"idle"}
    assert eager == {"decode", "extend", "target_verify"} and cats == eager
    assert not prometheus.total(samples, "sglang:cuda_graph_passes_total", mode="decode_cuda_graph")
    assert prometheus.total(samples, "sglang:cuda_graph_passes_total", mode="decode_none") > 0
    assert "cuda graph: False" in log and "cuda graph: True" not in log


def test_removed_and_deprecated_graph_flags(tmp_path):
    """0.5.23 refuses the old --cuda-graph-max-bs as ambiguous (as the real parser did, saved
    in argv_checks.json) and warns about --disable-cuda-graph; 0.5.9 takes both."""
    import subprocess
    import sys

    (refused,) = [c for c in sf.argv_checks() if "--cuda-graph-max-bs" in c["argv"]]
    run = subprocess.run([sys.executable, "-m", "orchestrator.targets.sim", "--model-path", "m",
                          "--cuda-graph-max-bs", "32"], capture_output=True, text=True, timeout=60)
    assert run.returncode == refused["exit_code"] == 2
    assert run.stderr.strip().splitlines()[-1].split("error: ", 1)[1] == refused["error"].split("error: ", 1)[1]
    with run_sim([*FAST, "--disable-cuda-graph"], cwd=tmp_path, log_path=tmp_path / "a.log") as sim:
        assert sim.get_json("/server_info")["disable_decode_cuda_graph"] is True
        assert "'--disable-cuda-graph' is deprecated" in sim.log()
    old = [*FAST, "--sim-sglang-version", "0.5.9", "--cuda-graph-max-bs", "8", "--disable-cuda-graph"]
    with run_sim(old, cwd=tmp_path, log_path=tmp_path / "b.log") as sim:
        info = sim.get_json("/server_info")
        assert (info["cuda_graph_max_bs"], info["disable_cuda_graph"], info["version"]) == (8, True, "0.5.9")


def test_log_lines_match_sglang_formats(eagle, baseline, version):
    _generate(eagle, n=40)
    _generate(baseline, n=45)
    decode, prefill = log_line_regexes(version, speculative=True, device_timer=True)
    log = eagle.log().splitlines()
    assert any(decode.match(line) for line in log), decode.pattern
    assert any(prefill.match(line) for line in log), prefill.pattern
    for pattern in STARTUP_LINES:
        assert any(pattern.match(line) for line in log), pattern.pattern
    base_decode, _ = log_line_regexes(version, speculative=False, device_timer=True)
    base_log = baseline.log().splitlines()
    assert any(base_decode.match(line) for line in base_log), base_decode.pattern
    assert not any("accept len" in line for line in base_log)
    order = [i for i, line in enumerate(log) if "Load weight begin" in line or "fired up" in line]
    assert "Load weight begin" in log[order[0]] and "fired up" in log[order[-1]]


def test_accept_totals_grow_once_per_log_window(tmp_path, version):
    """Both releases add to the totals behind avg_spec_accept_length only when a decode-log
    window closes (the saved source says where); a shorter run leaves it absent."""
    assert sf.facts(version)["accept_window"]["totals_only_per_window"]
    args = [*EAGLE, *FAST, "--decode-log-interval", "10", "--sim-sglang-version", version]
    with run_sim(args, cwd=tmp_path, log_path=tmp_path / "s.log") as sim:
        _generate(sim, n=12)  # ~5 cycles: less than one window
        assert "avg_spec_accept_length" not in sim.get_json("/server_info")["internal_states"][0]
        _generate(sim, n=60)  # now at least one window has closed
        assert 1.0 < sim.get_json("/server_info")["internal_states"][0]["avg_spec_accept_length"] <= 3.0


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
