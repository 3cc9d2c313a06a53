"""`reference=log:PATH`: reading old SGLang / NCCL logs, the record they give, and the diff of a
partial fingerprint (what the log tells, what it cannot), on fixtures in the real formats."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from orchestrator.bench.sglang_log import parse_decode
from orchestrator.commands import parts
from orchestrator.config.compose import compose_settings
from orchestrator.errors import UserError
from orchestrator.records import UNSET
from orchestrator.reference import lines as L
from orchestrator.reference import record
from orchestrator.reference.diff import differences
from orchestrator.reference.parsed import parse_files
from orchestrator.reference.server_args import setting_differences, target_settings

LOGS = Path(__file__).parent / "fixtures" / "sglang_logs"
FACTS = Path(__file__).parent / "fixtures" / "sglang_0_5_23" / "source_facts.json"
PATTERN = "verify (?P<verify_ms>[0-9.]+) ms"


def test_prefix_of_configure_logger_and_its_variants():
    p = L.split_prefix("[2026-01-14 10:02:11 TP0] Decode batch, #running-req: 1")
    assert p.ranks == "TP0" and p.message.startswith("Decode batch") and p.stamp is not None
    q = L.split_prefix("[2026-01-14 10:02:11.250 DP1 TP3] x")
    assert q.ranks == "DP1 TP3" and q.stamp - p.stamp == pytest.approx(0.25)
    r = L.split_prefix("[2026-02-18 03:19:27] INFO engine.py:156: server_args={'a': 1}")
    assert r.message == "server_args={'a': 1}"
    no_year = L.split_prefix("[01-14 10:02:11] hello", year=2026)
    assert no_year.stamp == p.stamp and not no_year.year_known
    assert L.split_prefix("gpu:1:1 [0] NCCL INFO x").stamp is None


def test_server_args_both_forms_read_without_eval():
    form, args = L.server_args("server_args={'tp_size': 8, 'x': None, 'c': {'max_bs': 32}}")
    assert form == "dict" and args == {"tp_size": 8, "x": None, "c": {"max_bs": 32}}
    form, args = L.server_args(
        "server_args=ServerArgs(tp_size=8, cuda_graph_config=CudaGraphConfig(max_bs=32),"
        " mode=<Mode.EXTEND: 'extend'>, d=PosixPath('/data'), n=inf, m=-3, t=(1, 2))")
    assert form == "repr"
    assert args == {"tp_size": 8, "cuda_graph_config": {"max_bs": 32},
                    "mode": "<Mode.EXTEND: 'extend'>", "d": "/data", "n": "inf", "m": -3,
                    "t": [1, 2]}
    # a call that would run something is text, never evaluated
    _, args = L.server_args("server_args={'a': __import__('os').system('false')}")
    assert isinstance(args["a"], str)
    with pytest.raises(L.LogLineError):
        L.server_args("server_args={'model_path': '/m', 'tp_si")  # cut short
    assert L.server_args("Decode batch, ...") is None


def test_nccl_info_lines_as_nccl_prints_them():
    v = L.nccl_info("gpu-node-17:2117:2117 [0] NCCL INFO NCCL version 2.27.5+cuda12.9")
    assert (v.host, v.pid, v.dev, v.version) == ("gpu-node-17", 2117, 0, "2.27.5")
    s = L.nccl_info("gpu-node-17:2117:2117 [0] NCCL INFO NCCL_PROTO set by environment to LL128")
    assert (s.var, s.value) == ("NCCL_PROTO", "LL128")
    i = L.nccl_info("h:1:2 [3] NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.")
    assert (i.var, i.value, i.dev) == ("NCCL_MAX_NCHANNELS", "4", 3)
    assert L.nccl_info("h:1:2 [3] NCCL INFO Channel 00/04 : 0 1 2 3").var is None
    assert L.nccl_info("[2026-01-14 10:02:11] NCCL INFO x") is None


def test_decode_and_prefill_lines_follow_the_saved_0523_format_strings():
    """The decode line as 0.5.23's f-strings print it (fields by name, whatever their order)."""
    facts = json.loads(FACTS.read_text())["log_formats"]["decode"]["fstrings"]
    assert any("Decode batch{iter_msg}, #running-req" in f for f in facts)
    assert any("accept len: {spec_accept_length:.2f}" in f for f in facts)
    d = parse_decode("Decode batch, #running-req: 2, #token: 380, token usage: 0.00, accept len: 2.41,"
                 " accept rate: 0.70, cuda graph: True, gen throughput (token/s): 176.12,"
                 " #queue-req: 0")
    assert (d.running_req, d.accept_len, d.cuda_graph, d.gen_throughput) == (2, 2.41, True, 176.12)


def test_user_pattern_named_groups_are_metrics():
    p = L.UserPattern(PATTERN)
    assert p.samples("[EAGLE] verify 19.02 ms (bs 1)") == {"verify_ms": 19.02}
    assert p.samples("nothing here") == {}
    with pytest.raises(ValueError, match="names no group"):
        L.UserPattern("verify ([0-9.]+) ms")
    with pytest.raises(ValueError, match="not a regular expression"):
        L.UserPattern("verify (?P<x>[0-9.+ ms")


def test_one_log_one_lifetime_with_every_part():
    log = parse_files(str(LOGS / "sglang_0523_tp8.log"), PATTERN)
    assert len(log.lifetimes) == 1 and not log.problems
    lt = log.lifetimes[0]
    assert lt.args_form == "dict" and lt.server_args["tp_size"] == 8
    assert lt.nccl_version == "2.27.5" and lt.nccl_info
    assert lt.nccl_env == {"NCCL_IB_DISABLE": "1", "NCCL_P2P_LEVEL": "PHB", "NCCL_PROTO": "LL128"}
    assert lt.hosts == ("gpu-node-17",)
    assert len(lt.values("verify_ms")) == 24 and 18.5 < lt.level("verify_ms") < 19.5
    assert len(lt.values("log_accept_len")) == 24 and lt.gc_pauses == (0.4123,)
    assert lt.prefill == (24, 24 * 128, 0)  # 0.5.23's prefill lines, read by field name


def test_rotated_and_gzipped_files_are_read_oldest_first():
    whole = parse_files(str(LOGS / "sglang_0523_tp8.log"), PATTERN).lifetimes[0]
    # the directory, and the two files named in the "wrong" order: the same one lifetime
    for spec in (str(LOGS / "rotated"),
                 f"{LOGS / 'rotated' / 'server.log'},{LOGS / 'rotated' / 'server.log.1.gz'}",
                 str(LOGS / "rotated" / "server.log*")):
        log = parse_files(spec, PATTERN)
        assert [Path(f).name for f in log.files] == ["server.log.1.gz", "server.log"]
        (lt,) = log.lifetimes
        assert lt.values("verify_ms") == whole.values("verify_ms")
        assert lt.nccl_env == whole.nccl_env and lt.where == "server.log.1.gz:2"


def test_each_server_start_is_a_lifetime_and_the_last_configuration_is_the_reference(tmp_path):
    text = (LOGS / "sglang_0523_tp8.log").read_text()
    other = text.replace("'mem_fraction_static': 0.88", "'mem_fraction_static': 0.80")
    path = tmp_path / "three.log.gz"
    with gzip.open(path, "wt") as f:
        f.write(text + other + text)
    log = parse_files(str(path), PATTERN)
    assert len(log.lifetimes) == 3
    summary = record.summarize(log)
    assert summary["chosen"] == [0, 2] and summary["left_out"] == [1]


def test_a_log_with_nothing_readable_is_bad_input():
    with pytest.raises(UserError, match="no line sleuth can read in 3 lines"):
        parse_files(str(LOGS / "unreadable.log"))
    with pytest.raises(UserError, match="no such file"):
        parse_files(str(LOGS / "missing.log"))


def test_the_record_states_what_the_log_tells_and_what_it_cannot(tmp_path, sim_repo):
    repo, shas = sim_repo
    cfg = compose_settings("investigate", ["target=sim", f"repo={repo}",
                                           f"runs_dir={tmp_path / 'runs'}",
                                           f"log.pattern={PATTERN}"])
    ref = record.load_any(parts.reference_query(cfg), f"log:{LOGS / 'rotated'}")
    assert ref["candidate"].commit == shas[-1]  # HEAD, said so
    assert ref["values"]["verify_ms"] == [pytest.approx(18.915, abs=0.05)]
    assert ref["config"]["target"]["tp_size"] == 8
    assert ref["config"]["target"]["speculative_num_steps"] == 2
    assert ref["config"]["target"]["cuda_graph_max_bs"] == 32
    knows, unknown = ref["log"]["knows"], " ".join(ref["log"]["unknown"])
    assert any("NCCL 2.27.5" in k and "NCCL_PROTO=LL128" in k for k in knows)
    assert any(k.startswith("verify_ms 18.9") for k in knows)
    for part in ("clocks and power limit", "GPU driver", "the commit it ran",
                 "#running-req 1-3", "24 prefill batches, 128 new tokens each, 0% from the"):
        assert part in unknown
    assert ref["fingerprint"]["env"]["server"]["NCCL_DEBUG"] == "INFO"
    assert record.no_level(ref, "verify_ms") is None
    assert "log.pattern=" in record.no_level(ref, "draft_ms")
    cfg = compose_settings("investigate", ["target=sim", f"repo={repo}", f"good={shas[0]}",
                                           f"runs_dir={tmp_path / 'runs'}"])
    ref = record.load_any(parts.reference_query(cfg), f"log:{LOGS / 'sglang_0523_tp8.log'}")
    assert ref["candidate"].commit == shas[0] and "verify_ms" not in ref["values"]


def _now_fp(**changes) -> dict:
    gpus = [{"index": i, "name": "RTX PRO 6000", "power_limit_w": 450.0,
             "power_limit_default_w": 600.0, "sm_clock_locked_mhz": None,
             "mem_clock_locked_mhz": None, "applications_clock_sm_mhz": 2430,
             "applications_clock_sm_default_mhz": 2430, "pcie_gen": 5, "pcie_width": 16,
             "processes": []} for i in range(8)]
    fp = {"git": {"sha": "a" * 40},
          "env": {"server": {"NCCL_IB_DISABLE": "1", "HOME": "/root", "CUDA_HOME": "/cuda"},
                  "not_received": {"NCCL_PROTO": "LL128"}, "source": "process"},
          "gpu": {"driver_version": "595.45.04", "nccl_version": "2.27.3", "gpus": gpus},
          "packages": {"nvidia-nccl-cu12": "2.28.3", "torch": "2.9.1"},
          "server_args": {"tp_size": 8, "mem_fraction_static": 0.85, "port": 1,
                          "model_path": "/models/Kimi-K2.5"},
          "host": {"hostname": "gpu-node-17"}}
    fp.update(changes)
    return fp


def test_the_log_diff_names_known_differences_and_lists_unknowns(tmp_path, sim_repo):
    repo, _ = sim_repo
    cfg = compose_settings("investigate", ["target=sim", f"repo={repo}",
                                           f"runs_dir={tmp_path / 'runs'}"])
    ref = record.load_any(parts.reference_query(cfg), f"log:{LOGS / 'sglang_0523_tp8.log'}")
    diffs = {d.key: d for d in differences(ref["fingerprint"], _now_fp())}
    proto = diffs["NCCL_PROTO"]  # printed then, gone now (and the node sets it: stripped)
    assert proto.controllable and proto.factor == ("env", "NCCL_PROTO", "LL128")
    assert proto.extra.get("dropped_before_server")
    level = diffs["NCCL_P2P_LEVEL"]
    assert level.factor == ("env", "NCCL_P2P_LEVEL", "PHB") and level.now is None
    assert diffs["NCCL_DEBUG"].reference == "INFO"  # its own INFO lines say so
    assert "NCCL_IB_DISABLE" not in diffs  # the same then and now
    nccl = diffs["nvidia-nccl-cu12"]
    assert nccl.factor == ("package", "nvidia-nccl-cu12", "2.27.5") and nccl.controllable
    power = diffs["power_limit_w"]  # unknown then; differs from the default now: tested
    assert power.controllable and power.factor == ("clock", "power", "default")
    assert power.label == "power limit: not in the log (default 600 W) -> 450 W"
    assert "sm_clock_locked_mhz" not in diffs  # at its default now: nothing to test
    mem = diffs["mem_fraction_static"]  # a logged setting the target does not set
    assert (mem.reference, mem.now, mem.controllable) == (0.88, 0.85, False)
    assert "port" not in diffs and "hostname" not in diffs
    unknown = {d.key: d for d in diffs.values() if d.category == "unknown"}
    assert set(unknown) >= {"clocks and power limit", "GPU driver and CUDA",
                            "GPU model and PCIe link", "package versions other than NCCL",
                            "environment variables other than NCCL_*", "the commit it ran"}
    assert not any(d.controllable for d in unknown.values())
    locked = _now_fp()
    for g in locked["gpu"]["gpus"]:
        g["sm_clock_locked_mhz"] = 1600
    lock = {d.key: d for d in differences(ref["fingerprint"], locked)}["sm_clock_locked_mhz"]
    assert lock.factor == ("clock", "locked", "off")
    assert lock.label == "SM clock lock: not in the log (default none) -> 1600 MHz"


def test_without_nccl_info_lines_nccl_variables_are_unknown(tmp_path, sim_repo):
    repo, _ = sim_repo
    cfg = compose_settings("investigate", ["target=sim", f"repo={repo}",
                                           f"runs_dir={tmp_path / 'runs'}"])
    ref = record.load_any(parts.reference_query(cfg), f"log:{LOGS / 'sglang_0509_repr.log'}")
    diffs = {d.key: d for d in differences(ref["fingerprint"], _now_fp())}
    assert not any(k.startswith("NCCL_") for k in diffs)
    assert "environment variables" in diffs and "nvidia-nccl-cu12" not in diffs
    assert any("NCCL release and NCCL variables" in u for u in ref["log"]["unknown"])


def test_server_settings_map_to_the_target_and_the_rest_are_compared():
    cfg = compose_settings("investigate", ["target=sim"])
    log = parse_files(str(LOGS / "sglang_0509_repr.log"))
    mapped = target_settings(log.lifetimes[0].server_args, cfg.target)
    assert mapped == {"name": "sim", "tp_size": 8, "model_path": "/models/Kimi-K2.5",
                      "speculative_algorithm": "EAGLE3", "speculative_num_steps": 2,
                      "speculative_eagle_topk": 1, "speculative_num_draft_tokens": 3,
                      "cuda_graph_max_bs": 32, "disable_cuda_graph": False}
    plain = target_settings({"speculative_algorithm": None, "tp_size": 4,
                             "cuda_graph_backend_decode": "disabled"}, cfg.target)
    assert plain == {"name": "sim", "tp_size": 4, "speculative_algorithm": None,
                     "disable_cuda_graph": True}
    assert setting_differences({"a": 1, "port": 1, "api_key": "sk-x" * 8, "b": [1]},
                               {"a": 1.0, "port": 2, "api_key": "other", "b": [2]}) == \
        [("b", [1], [2])]


def test_a_stored_log_run_reads_back_as_the_same_reference(tmp_path, sim_repo, capsys):
    from orchestrator.commands import trial

    repo, shas = sim_repo
    runs = tmp_path / "runs"
    cfg = compose_settings("trial", [f"from_log={LOGS / 'rotated'}", "run_id=logref",
                                     f"runs_dir={runs}", f"repo={repo}", f"commit={shas[0]}",
                                     f"log.pattern={PATTERN}"])
    assert trial.run(cfg) == 0
    printed = capsys.readouterr().out
    assert "the log tells: verify_ms 18.9" in printed and "not in the log:" in printed
    later = compose_settings("investigate", ["target=sim", f"runs_dir={runs}"])
    ref = record.load_any(parts.reference_query(later), "logref")
    direct = record.load_any(parts.reference_query(compose_settings("investigate", [
        "target=sim", f"runs_dir={runs}", f"repo={repo}", f"commit={shas[0]}",
        f"log.pattern={PATTERN}"])), f"log:{LOGS / 'rotated'}")
    assert ref["candidate"] == direct["candidate"] and ref["candidate"].commit == shas[0]
    assert ref["values"] == direct["values"] and ref["config"] == direct["config"]
    assert ref["fingerprint"]["env"] == direct["fingerprint"]["env"]


def test_unset_is_the_level_of_a_variable_unset_then():
    assert UNSET == "<unset>"  # what the isolate sets for "NCCL printed no line for it"
