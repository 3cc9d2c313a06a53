"""The simulated server's log as an old-log reference reads it, and its state faults.

The log's `server_args=` (0.5.23's dict, 0.5.9's repr), NCCL's INFO lines with
`NCCL_DEBUG=INFO`, the custom verify line: each is read back by the log parsers and agrees
with what the server reports. The state faults (`state:`, `burst:`) slow a long-running
server, show in its memory and its GC warnings, and are gone after a restart (or `/freeze_gc`)."""

from __future__ import annotations

import os
import threading

import pytest

from orchestrator.bench import prometheus
from orchestrator.live.proc import rss_bytes
from orchestrator.reference.parsed import parse_files
from orchestrator.targets.sim.faults import FaultSpecError, parse_faults
from tests.sim_client import run_sim

pytestmark = pytest.mark.e2e  # real simulated servers

SPEC = ["--tp-size", "8", "--enable-metrics", "--speculative-algorithm", "EAGLE3",
        "--speculative-num-steps", "2", "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", "3", "--sim-time-scale", "0.02",
        "--sim-load-seconds", "2", "--sim-noise-restart-cv", "0", "--sim-noise-request-cv", "0"]
TIMER = {"SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}


def _env(**more: str) -> dict:
    return {**os.environ, **TIMER, **more}


def _generate(sim, n: int, tokens: int = 8, concurrency: int = 1) -> None:
    """`n` requests, `concurrency` at a time. Each round's threads wait at a barrier and send
    together: on a busy host starting 128 threads takes longer than a short request runs, and
    without it the first would be served before the last was sent (no burst at all)."""
    def one(i: int, ready: threading.Barrier) -> None:
        ready.wait(timeout=60)
        sim.post_json("/generate", {"input_ids": list(range(100 + i % 50, 132 + i % 50)),
                                    "sampling_params": {"max_new_tokens": tokens,
                                                        "ignore_eos": True}})
    for start in range(0, n, concurrency):
        ids = range(start, min(n, start + concurrency))
        ready = threading.Barrier(len(ids))
        threads = [threading.Thread(target=one, args=(i, ready)) for i in ids]
        [t.start() for t in threads]
        [t.join() for t in threads]


def _verify_ms(sim) -> float:
    before = prometheus.parse(sim_text(sim, "/metrics"))
    _generate(sim, 2, tokens=32)
    after = prometheus.parse(sim_text(sim, "/metrics"))
    return prometheus.phase_metrics(before, after)["verify_ms"]


def sim_text(sim, path: str) -> str:
    import urllib.request

    with urllib.request.urlopen(sim.base_url + path, timeout=10) as resp:
        return resp.read().decode()


@pytest.mark.parametrize("version, form", [("0.5.23", "dict"), ("0.5.9", "repr")])
def test_server_args_as_each_release_logs_them_read_back(tmp_path, version, form):
    log = tmp_path / "s.log"
    with run_sim([*SPEC, "--sim-sglang-version", version], cwd=tmp_path, log_path=log,
                 env=_env()) as sim:
        info = sim.get_json("/server_info")
    (lifetime,) = parse_files(str(log)).lifetimes
    assert lifetime.args_form == form
    args = lifetime.server_args
    shared = set(args) & set(info)
    assert len(shared) > 40 and all(args[k] == info[k] for k in shared)


def test_nccl_info_lines_only_with_nccl_debug_info(tmp_path):
    env = _env(NCCL_DEBUG="INFO", NCCL_PROTO="LL128", NCCL_MAX_NCHANNELS="0x4",
               NCCL_P2P_LEVEL="4", NCCL_DEBUG_SUBSYS="INIT,ENV")
    with run_sim(SPEC, cwd=tmp_path, log_path=tmp_path / "info.log", env=env) as sim:
        _generate(sim, 1)
    (lt,) = parse_files(str(tmp_path / "info.log")).lifetimes
    assert lt.nccl_info and lt.nccl_version == "2.27.3"  # the default node's system NCCL
    # integers as NCCL prints them (parsed), P2P levels by name; its own debug settings never
    assert lt.nccl_env == {"NCCL_PROTO": "LL128", "NCCL_MAX_NCHANNELS": "4",
                           "NCCL_P2P_LEVEL": "PHB"}
    text = (tmp_path / "info.log").read_text()
    assert "NCCL INFO NCCL_MAX_NCHANNELS set by environment to 4.\n" in text
    assert "NCCL INFO NCCL_PROTO set by environment to LL128\n" in text
    assert text.count("NCCL INFO NCCL_PROTO set by") == 8  # one per rank (tp 8)
    with run_sim(SPEC, cwd=tmp_path, log_path=tmp_path / "quiet.log",
                 env=_env(NCCL_PROTO="LL128")) as sim:
        _generate(sim, 1)
    assert "NCCL INFO" not in (tmp_path / "quiet.log").read_text()


def test_the_verify_line_is_the_device_verify_time(tmp_path):
    log = tmp_path / "v.log"
    with run_sim([*SPEC, "--sim-verify-log", "1", "--decode-log-interval", "10"], cwd=tmp_path,
                 log_path=log, env=_env()) as sim:
        measured = _verify_ms(sim)
        _generate(sim, 4, tokens=64)
    (lt,) = parse_files(str(log), "verify (?P<verify_ms>[0-9.]+) ms").lifetimes
    assert len(lt.values("verify_ms")) >= 3
    assert lt.level("verify_ms") == pytest.approx(measured, rel=0.02)


def test_state_fault_parses_and_refuses_nonsense():
    plan = parse_faults("state:40:30,burst:8:35")
    assert (plan.state_pct_per_k, plan.state_max_pct) == (40.0, 30.0)
    assert (plan.burst_queue, plan.burst_pct) == (8, 35.0)
    assert plan.state_factor(500, False) == pytest.approx(1.2)
    assert plan.state_factor(5000, True) == pytest.approx(1.3 * 1.35)
    for bad in ("state:x", "burst:8", "burst:x:3", "state:-1"):
        with pytest.raises(FaultSpecError):
            parse_faults(bad)


def test_served_requests_slow_a_server_and_a_restart_restores_it(tmp_path):
    args = [*SPEC, "--sim-fault", "state:40:40", "--gc-warning-threshold-secs", "0.2"]
    with run_sim(args, cwd=tmp_path, log_path=tmp_path / "a.log", env=_env()) as sim:
        fresh = _verify_ms(sim)
        rss_fresh = rss_bytes([sim.process.pid])
        _generate(sim, 1000, tokens=2, concurrency=32)
        aged = _verify_ms(sim)
        rss_aged = rss_bytes([sim.process.pid])
    assert aged / fresh == pytest.approx(1.4, rel=0.01)
    assert rss_aged - rss_fresh > 40 * 2**20  # 64 KiB kept per request served
    assert "LONG GARBAGE COLLECTION DETECTED | Generation 2" in (tmp_path / "a.log").read_text()
    with run_sim(args, cwd=tmp_path, log_path=tmp_path / "b.log", env=_env()) as sim:
        assert _verify_ms(sim) == pytest.approx(fresh, rel=0.01)  # a restart restores it


def test_an_overload_burst_slows_a_server_until_freeze_gc(tmp_path):
    with run_sim([*SPEC, "--sim-fault", "burst:8:35"], cwd=tmp_path, log_path=tmp_path / "c.log",
                 env=_env()) as sim:
        fresh = _verify_ms(sim)
        # 128 at once (sent together from a barrier): 48 run, the rest wait (the burst). How
        # many wait at the same moment still depends on how fast this host sends, so a burst
        # is tried a few times, with requests long enough to still run when the last arrive.
        for _ in range(5):
            _generate(sim, 128, tokens=32, concurrency=128)
            slowed = _verify_ms(sim) / fresh
            if slowed > 1.01:
                break
        assert slowed == pytest.approx(1.35, rel=0.01)
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(sim.base_url + "/freeze_gc", method="POST"),
                               timeout=10).read()
        assert _verify_ms(sim) == pytest.approx(fresh, rel=0.01)
