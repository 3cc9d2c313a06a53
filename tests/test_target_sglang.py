"""The SGLang adapter: version facts, flag checks, parsers against verbatim SGLang output, and the
whole adapter end to end against the sim (everything but the real launch command runs on CPU).

Version facts and verbatim strings come from the released wheels on PyPI (`sglang==0.4.6`,
`0.5.1`, `0.5.9`, `0.5.23`; cut-overs bisected over 0.5.10 .. 0.5.20): the scheduler's decode
and prefill log statements, the metrics collector's names and labels, `http_server.py`'s routes
and `bench_serving.py`'s result record.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from orchestrator.bench import prometheus
from orchestrator.bench.sglang_log import log_metrics, parse_decode
from orchestrator.cli import run as cli_run
from orchestrator.commands import bisect
from orchestrator.config.compose import compose_config
from orchestrator.errors import UserError
from orchestrator.records import Outcome
from orchestrator.store import RunStore
from orchestrator.targets import sglang_versions as v
from orchestrator.targets.base import NodeContext
from orchestrator.targets.sglang import (
    SglangTarget,
    parse_bench_serving,
    server_accept_length,
)
from orchestrator.targets.sim.args import build_parser
from orchestrator.targets.sim.scenario import generate_scenario

FAST = ["target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=30"]
EAGLE = ["target.speculative_algorithm=EAGLE3", "target.speculative_num_steps=2",
         "target.speculative_eagle_topk=1", "target.speculative_num_draft_tokens=3",
         "target.tp_size=8"]


def _target(tmp_path: Path, *overrides: str, target: str = "sglang") -> SglangTarget:
    cfg = compose_config("trial", [f"target={target}", *overrides])
    conf = OmegaConf.to_container(cfg.target, resolve=True)
    bench = OmegaConf.to_container(cfg.bench, resolve=True)
    return SglangTarget(conf, bench, NodeContext("n0", tmp_path / "node"))


# -- version facts ------------------------------------------------------------------------------
def test_version_strings_parse():
    assert v.parse_version("0.5.15.post1") == (0, 5, 15)
    assert v.parse_version("v0.5.9") == (0, 5, 9)
    assert v.parse_version("0.5.3rc2") == (0, 5, 3)
    assert v.parse_version("main") is None and v.parse_version("") is None


@pytest.mark.parametrize(("version", "per_phase", "info", "verify", "bench"), [
    # 0.5.5: only /get_server_info; 0.5.9: /server_info added, old name kept.
    ("0.5.5", False, ("/get_server_info",), False, "sglang.bench_serving"),
    ("0.5.9", False, ("/server_info", "/get_server_info"), False, "sglang.bench_serving"),
    # 0.5.13: spec_verify_calls_total appears; flags still the old ones.
    ("0.5.13", False, ("/server_info", "/get_server_info"), True, "sglang.bench_serving"),
    # 0.5.14: per-phase CUDA-graph flags (--cuda-graph-max-bs a deprecated alias until 0.5.20).
    ("0.5.14", True, ("/server_info", "/get_server_info"), True, "sglang.bench_serving"),
    # 0.5.15: bench_serving moved to sglang.benchmark.serving (the old module is a shim).
    ("0.5.23", True, ("/server_info", "/get_server_info"), True, "sglang.benchmark.serving"),
])
def test_features_by_version(version, per_phase, info, verify, bench):
    f = v.features_for_version(v.parse_version(version))
    assert (f.cuda_graph_per_phase, f.server_info_paths, f.verify_ms_from_metrics,
            f.bench_serving_module) == (per_phase, info, verify, bench)


def test_cuda_graph_flags_follow_the_split(tmp_path):
    old = _target(tmp_path, "target.model_path=m", "target.sglang_version=0.5.9",
                  "target.cuda_graph_max_bs=32", "target.disable_cuda_graph=true")
    args = old.server_args(30000)
    assert args[args.index("--cuda-graph-max-bs") + 1] == "32"
    assert "--disable-cuda-graph" in args and "--cuda-graph-max-bs-decode" not in args
    new = _target(tmp_path, "target.model_path=m", "target.sglang_version=0.5.23",
                  "target.cuda_graph_max_bs=32", "target.disable_cuda_graph=true")
    args = new.server_args(30000)
    assert args[args.index("--cuda-graph-max-bs-decode") + 1] == "32"
    assert "--cuda-graph-max-bs" not in args and "--disable-cuda-graph" not in args
    assert args[args.index("--cuda-graph-backend-decode") + 1] == "disabled"
    assert args[args.index("--cuda-graph-backend-prefill") + 1] == "disabled"


def test_help_output_overrides_the_version_number():
    # A patched build that says 0.5.9 but already has the per-phase flags (as 0.5.14+ list them).
    help_text = ("  --cuda-graph-max-bs-decode CUDA_GRAPH_MAX_BS_DECODE\n"
                 "                        Maximum batch size captured for the decode cuda graph.\n")
    f = v.features_from_help(v.help_flags(help_text), (0, 5, 9))
    assert f.cuda_graph_per_phase and f.source == "help"
    assert not v.features_from_help({"--cuda-graph-max-bs"}, (0, 5, 23)).cuda_graph_per_phase


def test_unknown_flag_is_named_with_a_suggestion():
    accepted = v.help_flags(build_parser().format_help())  # argparse help, as SGLang's is
    assert {"--tp-size", "--tensor-parallel-size", "--cuda-graph-max-bs"} <= accepted
    assert v.unknown_flag(["--tp-size", "8", "--enable-metrics"], accepted) is None
    # The 0.5.14+ spelling on an older build; a typo gets the nearest real flag.
    assert v.unknown_flag(["--cuda-graph-max-bs-decode", "8"], accepted).startswith(
        "--cuda-graph-max-bs-decode")
    assert v.unknown_flag(["--enable-metric"], accepted) == (
        "--enable-metric (did you mean --enable-metrics?)")
    assert v.unknown_flag(["--attention-backend=fa3"], accepted) is None


# -- parsers against verbatim SGLang output -----------------------------------------------------
# Each line is the f-string of the named release's decode/prefill log statement, filled in,
# with the scheduler's `[time TP0] ` prefix.
DECODE_046 = ("[2026-02-26 10:00:01 TP0] Decode batch. #running-req: 1, #token: 310, token usage:"
              " 0.00, accept len: 2.10, gen throughput (token/s): 94.12, #queue-req: 0")
DECODE_051 = ("[2026-02-26 10:00:01 TP0] Decode batch. #running-req: 1, #token: 310, token usage:"
              " 0.00, accept len: 2.10, cuda graph: True, gen throughput (token/s): 94.12,"
              " #queue-req: 0, ")
DECODE_059 = ("[2026-02-26 10:00:01 TP0] Decode batch, #running-req: 1, #token: 310, token usage:"
              " 0.00, accept len: 2.10, accept rate: 0.55, cuda graph: True, gen throughput"
              " (token/s): 94.12, #queue-req: 0")
# 0.5.23 with SGLANG_ENABLE_METRICS_DEVICE_TIMER=1 appends the forward occupancy.
DECODE_0523 = ("[2026-02-26 10:00:01 TP0] Decode batch, #running-req: 1, #token: 310, token usage:"
               " 0.00, accept len: 1.90, accept rate: 0.45, cuda graph: False, gen throughput"
               " (token/s): 60.41, #queue-req: 0, fwd occupancy: 97.12%, fwd+idle occupancy:"
               " 99.80%")
PREFILL_059 = ("[2026-02-26 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 128, #cached-token:"
               " 0, token usage: 0.00, #running-req: 0, #queue-req: 0, input throughput (token/s):"
               " 0.00, cuda graph: False")
PREFILL_0523 = ("[2026-02-26 10:00:00 TP0] Prefill batch, #new-seq: 1, #new-token: 128,"
                " #cached-token: 0, #token: 128, token usage: 0.00, #running-req: 0, #queue-req: 0,"
                " #pending-token: 0, cuda graph: False, input throughput (token/s): 0.00")


@pytest.mark.parametrize(("line", "graph", "accept", "gen"), [
    (DECODE_046, None, 2.10, 94.12),
    (DECODE_051, True, 2.10, 94.12),
    (DECODE_059, True, 2.10, 94.12),
    (DECODE_0523, False, 1.90, 60.41),
])
def test_decode_line_every_release(line, graph, accept, gen):
    d = parse_decode(line)
    assert (d.running_req, d.cuda_graph, d.accept_len, d.gen_throughput) == (1, graph, accept, gen)


def test_log_metrics_ignore_prefill_and_main_process_lines():
    text = "\n".join([PREFILL_059, PREFILL_0523, DECODE_059, DECODE_0523,
                      '[2026-02-26 10:00:02] INFO:     127.0.0.1:5 - "POST /generate HTTP/1.1" 200'])
    m = log_metrics(text)
    assert m["cuda_graph_share"] == pytest.approx(0.5)
    assert m["log_accept_len"] == pytest.approx(2.0)
    assert m["log_gen_throughput"] == pytest.approx((94.12 + 60.41) / 2)


# prometheus_client exposition of SGLang 0.5.23's collectors: scheduler metrics carry
# model_name, engine_type, tp_rank, pp_rank, moe_ep_rank (+category/mode); the tokenizer's
# spec_verify_calls_total carries model_name, engine_type.
def _exposition_0523(verify_s: float, draft_s: float, decode_s: float, calls: float,
                     graph_passes: float) -> str:
    lab = 'model_name="moonshotai/Kimi-K2.5",engine_type="unified"'
    sched = f'{lab},tp_rank="0",pp_rank="0",moe_ep_rank="0"'
    return "\n".join([
        "# HELP sglang:forward_execution_seconds_total Total time that GPU is busy executing"
        " model forward passes. Refer to ForwardMode for category labels.",
        "# TYPE sglang:forward_execution_seconds_total counter",
        f'sglang:forward_execution_seconds_total{{{sched},category="target_verify"}} {verify_s}',
        f'sglang:forward_execution_seconds_total{{{sched},category="eagle_draft"}} {draft_s}',
        f'sglang:forward_execution_seconds_total{{{sched},category="decode"}} {decode_s}',
        "# HELP sglang:spec_verify_calls_total Total number of speculative verify calls.",
        "# TYPE sglang:spec_verify_calls_total counter",
        f"sglang:spec_verify_calls_total{{{lab}}} {calls}",
        f'sglang:cuda_graph_passes_total{{{sched},mode="decode_cuda_graph"}} {graph_passes}',
        "",
    ])


def test_verify_ms_from_0523_counters():
    before = prometheus.parse(_exposition_0523(1.0, 0.2, 0.5, 50.0, 10.0))
    after = prometheus.parse(_exposition_0523(3.9, 0.5, 0.6, 150.0, 20.0))
    m = prometheus.phase_metrics(before, after)
    assert m["verify_ms"] == pytest.approx(29.0)
    assert m["draft_ms"] == pytest.approx(3.0)
    assert m["decode_ms"] == pytest.approx(10.0)


def test_0_5_9_scheduler_level_seconds_give_no_verify_ms():
    # 0.5.9 names it gpu_execution_seconds_total, with categories like forward_decode that
    # cover a whole draft+verify step, and exports no verify-call counter: nothing to divide.
    text = ('sglang:gpu_execution_seconds_total{model_name="m",engine_type="unified",tp_rank="0",'
            'pp_rank="0",moe_ep_rank="0",category="forward_decode"} %s\n')
    m = prometheus.phase_metrics(prometheus.parse(text % 1.0), prometheus.parse(text % 2.0))
    assert "verify_ms" not in m and "draft_ms" not in m


def test_server_info_accept_length_over_dp_ranks():
    # /server_info: ServerArgs fields + scheduler info + internal_states (one per DP rank).
    info = {"tp_size": 8, "version": "0.5.9", "internal_states": [
        {"last_gen_throughput": 60.2, "avg_spec_accept_length": 2.0},
        {"last_gen_throughput": 61.0, "avg_spec_accept_length": 2.5}]}
    assert server_accept_length(info) == pytest.approx(2.25)
    assert server_accept_length({"internal_states": [{"last_gen_throughput": 1.0}]}) is None


# bench_serving's record, with the keys of 0.5.9's `result` dict (abridged values).
BENCH_SERVING_RECORD = {
    "tag": None, "backend": "sglang", "dataset_name": "random-ids", "request_rate": float("inf"),
    "max_concurrency": 1, "random_input_len": 128, "random_output_len": 64,
    "server_info": {"internal_states": [{"avg_spec_accept_length": 2.4}]}, "duration": 2.5,
    "completed": 4, "total_input_tokens": 512, "total_output_tokens": 256,
    "request_throughput": 1.6, "input_throughput": 204.8, "output_throughput": 102.4,
    "mean_e2e_latency_ms": 620.0, "median_e2e_latency_ms": 610.0, "p90_e2e_latency_ms": 700.0,
    "mean_ttft_ms": 40.0, "median_ttft_ms": 38.0, "p99_ttft_ms": 55.0, "mean_tpot_ms": 9.2,
    "median_tpot_ms": 9.1, "p99_tpot_ms": 11.0, "mean_itl_ms": 9.2, "median_itl_ms": 9.0,
    "p95_itl_ms": 10.5, "p99_itl_ms": 12.0, "concurrency": 0.99, "accept_length": 2.4,
}


def test_bench_serving_file_uses_the_last_appended_record(tmp_path):
    path = tmp_path / "out.jsonl"
    stale = {**BENCH_SERVING_RECORD, "output_throughput": 1.0}
    path.write_text(json.dumps(stale) + "\n" + json.dumps(BENCH_SERVING_RECORD) + "\n")
    m = parse_bench_serving(path)
    assert m["output_throughput"] == 102.4 and m["tpot_ms_p50"] == 9.1
    assert m["ttft_ms_p50"] == 38.0 and m["accept_len"] == 2.4 and m["completed"] == 4
    assert "tag" not in m and "server_info" not in m


# -- the command the adapter builds ---------------------------------------------------------------
def test_kimi_example_builds_the_seed_launch_command(tmp_path):
    t = _target(tmp_path, target="sglang_kimi_k25_eagle3")
    argv = t.command(tmp_path, 30000)
    assert argv[:3] == [sys.executable, "-m", "sglang.launch_server"]
    flat = " ".join(argv)
    for part in ("--model-path moonshotai/Kimi-K2.5", "--tp-size 8", "--trust-remote-code",
                 "--speculative-algorithm EAGLE3", "--speculative-num-steps 2",
                 "--speculative-eagle-topk 1", "--speculative-num-draft-tokens 3",
                 "--speculative-draft-model-path lightseekorg/kimi-k2.5-eagle3",
                 "--enable-metrics", "--port 30000"):
        assert part in flat, part


def test_environment_device_timer_and_worktree_code_first(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/opt/site")
    t = _target(tmp_path, "target.model_path=m", "target.env.NCCL_PROTO=LL128")
    t.prepare(tmp_path / "wt", tmp_path / "trial")
    env = t.environment({"NCCL_ALGO": "Ring"})
    assert env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"
    assert env["PYTHONPATH"].split(":") == [str(tmp_path / "wt" / "python"), "/opt/site"]
    assert (env["NCCL_PROTO"], env["NCCL_ALGO"]) == ("LL128", "Ring")
    off = _target(tmp_path, "target.model_path=m", "target.device_timer=false")
    assert "SGLANG_ENABLE_METRICS_DEVICE_TIMER" not in off.environment({})


def test_launcher_sim_runs_the_simulator_configured_through_env(tmp_path):
    t = _target(tmp_path, "launcher=sim", "target.time_scale=0.5", "target.seed=3")
    argv = t.command(tmp_path, 30000)
    assert argv[:4] == [sys.executable, "-P", "-m", "orchestrator.targets.sim"]
    assert not any(a.startswith("--sim-") for a in argv)  # only SGLang's own flags
    env = t.environment({})
    assert env["SLEUTH_SIM_TIME_SCALE"] == "0.5" and env["SLEUTH_SIM_SEED"] == "3"
    assert t.time_scale == 0.5
    assert _target(tmp_path, "target.model_path=m").time_scale == 1.0


def test_preflight_against_the_sim_help(tmp_path):
    good = _target(tmp_path, "launcher=sim", *EAGLE)
    assert good.preflight() is None
    assert good.features.source == "help" and not good.features.cuda_graph_per_phase
    bad = _target(tmp_path, "launcher=sim", "target.extra_args=[--cuda-graph-max-bs-decode,8]")
    problem = bad.preflight()
    assert "does not accept --cuda-graph-max-bs-decode" in problem and "n0" in problem
    unset = _target(tmp_path)
    assert "target.model_path" in unset.preflight()
    with pytest.raises(UserError, match="launcher must be one of sglang, sim"):
        _target(tmp_path, "launcher=vllm")  # refused when the configuration is composed


def test_features_without_preflight_come_from_the_installed_version(tmp_path):
    # A trial with its own server settings gets a fresh target that never ran preflight: it
    # must still spell flags for the build that is there (the sim reports 0.5.9).
    fresh = _target(tmp_path, "launcher=sim", "target.cuda_graph_max_bs=16")
    assert fresh.features.version == (0, 5, 9) and not fresh.features.cuda_graph_per_phase
    assert "--cuda-graph-max-bs" in fresh.server_args(1)
    pinned = _target(tmp_path, "target.model_path=m", "target.sglang_version=0.5.20")
    assert pinned.features.cuda_graph_per_phase


# -- end to end against the sim -------------------------------------------------------------------
def test_trial_through_the_sglang_adapter(tmp_path, sim_repo, ray_session):
    repo, shas = sim_repo
    cfg = compose_config("trial", ["target=sglang", "launcher=sim", f"repo={repo}",
                                   f"runs_dir={tmp_path / 'runs'}", f"commit={shas[2]}",
                                   "trial.retries=0", *FAST, *EAGLE])
    from orchestrator.commands import trial as trial_cmd

    assert trial_cmd.run(cfg) == 0
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(run_dir / "trials.db").trials()
    assert row.outcome is Outcome.OK, row.detail
    # Phase metrics from /metrics, accept length from /server_info (flushed per repetition).
    assert 24 < row.result.value("verify_ms") < 34  # verify_mult 1.5 on a ~19 ms verify
    assert 1.0 < row.result.value("server_accept_len") <= 3.0
    for m in row.result.measurements:
        assert {"verify_ms", "draft_ms", "accept_len", "server_accept_len",
                "output_throughput"} <= set(m.metrics)
    assert row.result.fingerprint["env"]["relevant"]["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"
    command = (run_dir / "trials" / str(row.id) / "command.txt").read_text()
    assert "-m orchestrator.targets.sim" in command and "--enable-metrics" in command
    log = Path(row.log_path).read_text()
    assert log.count("Cache flushed successfully") >= 2  # before each of the 2 repetitions


FAKE_BENCH_SERVING = r"""
import argparse, json
p = argparse.ArgumentParser()
for flag in ("--backend", "--base-url", "--dataset-name", "--num-prompts", "--random-input-len",
             "--random-output-len", "--random-range-ratio", "--max-concurrency", "--seed",
             "--warmup-requests", "--output-file", "--model"):
    p.add_argument(flag)
p.add_argument("--disable-tqdm", action="store_true")
a = p.parse_args()
import http.client
host, port = a.base_url.split("//")[1].split(":")
conn = http.client.HTTPConnection(host, int(port), timeout=10)
for i in range(int(a.num_prompts)):  # the requests, against the server it was pointed at
    body = {"input_ids": [100 + i] * int(a.random_input_len), "sampling_params": {
        "max_new_tokens": int(a.random_output_len), "temperature": 0.0, "ignore_eos": True}}
    conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
    assert json.loads(conn.getresponse().read())["meta_info"]["completion_tokens"] > 0
conn.close()  # client closes first: no TIME_WAIT left on the server's port
with open(a.output_file, "a") as f:  # bench_serving appends
    f.write(json.dumps({"completed": int(a.num_prompts), "output_throughput": 123.0,
                        "median_tpot_ms": 8.0, "accept_length": None}) + "\n")
"""


def test_bench_serving_client_against_the_sim(tmp_path, sim_repo, ray_session):
    repo, shas = sim_repo
    fake = tmp_path / "fake_bench_serving.py"
    fake.write_text(FAKE_BENCH_SERVING)
    code = cli_run(["trial", "target=sglang", "launcher=sim", f"repo={repo}",
                    f"runs_dir={tmp_path / 'runs'}", "trial.retries=0",
                    "target.bench_client=bench_serving",
                    f"target.bench_serving_command=[{sys.executable},{fake}]", *FAST, *EAGLE])
    assert code == 0
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(run_dir / "trials.db").trials()
    assert row.outcome is Outcome.OK, row.detail
    trial_dir = run_dir / "trials" / str(row.id)
    files = sorted(trial_dir.glob("bench_serving.*.jsonl"))
    assert len(files) == 2 and all(len(f.read_text().splitlines()) == 1 for f in files)
    for m in row.result.measurements:
        assert m.metrics["output_throughput"] == 123.0 and m.metrics["tpot_ms_p50"] == 8.0
        assert "verify_ms" in m.metrics  # /metrics still bracket the external client
        assert m.metrics["accept_len"] == m.metrics["server_accept_len"]  # from /server_info


def test_unaccepted_flag_fails_the_run_with_one_line(tmp_path, sim_repo, ray_session, capsys):
    repo, _ = sim_repo
    with pytest.raises(Exception) as info:
        cli_run(["trial", "target=sglang", "launcher=sim", f"repo={repo}",
                 f"runs_dir={tmp_path / 'runs'}", "target.extra_args=[--cuda-graph-max-bs-decode,8]",
                 *FAST])
    assert info.value.exit_code == 2
    assert "does not accept --cuda-graph-max-bs-decode" in " ".join(str(info.value).split())


@pytest.mark.slow
def test_bisect_sglang_adapter_on_the_sim_finds_the_planted_commit(tmp_path, ray_session):
    scenario = generate_scenario(tmp_path / "sc", 80, 11, "one_culprit")
    truth = scenario.truth
    cfg = compose_config("bisect", ["target=sglang", "launcher=sim", f"repo={scenario.repo}",
                                    f"runs_dir={tmp_path / 'runs'}", f"good={truth['good']}",
                                    f"bad={truth['bad']}", "metric=verify_ms", "nodes=2",
                                    *FAST, *EAGLE])
    assert bisect.run(cfg) == 0
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    doc = json.loads((run_dir / "findings.json").read_text())
    (planted,) = truth["culprits"]
    assert doc["findings"][0]["id"] == planted["sha"]
    assert doc["findings"][0]["probability"] >= 0.99
