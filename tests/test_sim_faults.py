"""Injected faults and start-up failures, as a runner sees them from outside the process:
exit status, health answers, and what happens to a stream."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import time

import pytest

from orchestrator.util.process import free_port
from tests.sim_client import SimClient, run_sim

FAST = ["--tp-size", "8", "--sim-time-scale", "0.02", "--sim-load-seconds", "2",
        "--sim-noise-restart-cv", "0", "--sim-noise-request-cv", "0"]  # fmt: skip
BIND_ERROR = "error while attempting to bind on address"


def _request(n: int, first_token: int = 100) -> dict:
    return {"input_ids": list(range(first_token, first_token + 16)),
            "sampling_params": {"max_new_tokens": n, "ignore_eos": True}}  # fmt: skip


def _statuses_until_exit(sim: SimClient, timeout: float = 20.0) -> tuple[int, set]:
    seen = set()
    deadline = time.monotonic() + timeout
    while sim.process.poll() is None and time.monotonic() < deadline:
        seen.add(sim.status("/health", timeout=0.5))
        time.sleep(0.01)
    return sim.wait_exit(timeout=5), seen


def test_exit_at_start(tmp_path):
    args = [*FAST, "--sim-load-seconds", "20", "--sim-fault", "exit_at_start"]
    with run_sim(args, cwd=tmp_path, log_path=tmp_path / "s.log", wait_ready=False) as sim:
        code, seen = _statuses_until_exit(sim)
        log = sim.log()
    assert code == 1
    assert 200 not in seen and 503 in seen  # it was loading (503), never healthy
    assert "Load weight begin" in log and "Scheduler hit an exception" in log
    assert "Traceback (most recent call last):" in log


def test_crash_after_n_requests_breaks_the_stream_in_flight(tmp_path):
    with run_sim([*FAST, "--sim-fault", "crash_after:2"], cwd=tmp_path, log_path=tmp_path / "s.log") as sim:
        for i in range(2):
            out = sim.post_json("/generate", _request(20, 100 + 50 * i))
            assert out["meta_info"]["completion_tokens"] == 20
        received = []
        with pytest.raises((ConnectionError, http.client.HTTPException, RuntimeError)):
            for _, chunk in sim.iter_stream("/generate", {**_request(2000, 900), "stream": True}):
                received.append(chunk["meta_info"]["completion_tokens"])
            raise RuntimeError("stream ended with [DONE] although the server crashed")
        code = sim.wait_exit(timeout=10)
        log = sim.log()
    assert code == -signal.SIGABRT
    assert not received or received[-1] < 2000
    assert sim.status("/health", timeout=0.5) is None
    assert "Scheduler hit an exception" in log
    assert not list(tmp_path.glob("core*"))  # no core dump left in the worktree


def test_never_ready_stays_503_and_alive(tmp_path):
    env_fault = {**os.environ, "SLEUTH_SIM_FAULT": "never_ready"}  # env fallback
    with run_sim(FAST, cwd=tmp_path, log_path=tmp_path / "s.log", env=env_fault, wait_ready=False) as sim:
        deadline = time.monotonic() + 1.0  # 25x the modeled load time at this scale
        seen = set()
        while time.monotonic() < deadline:
            seen.add(sim.status("/health", timeout=0.5))
            time.sleep(0.02)
        assert seen == {503} or seen == {None, 503}
        assert 503 in seen and sim.process.poll() is None
        assert sim.status("/server_info") == 503
        assert "fired up" not in sim.log()


def test_hang_mid_stream_keeps_connection_and_process(tmp_path):
    args = [*FAST, "--sim-fault", "hang_mid_stream:1"]
    with run_sim(args, cwd=tmp_path, log_path=tmp_path / "s.log") as sim:
        assert sim.post_json("/generate", _request(10))["meta_info"]["completion_tokens"] == 10
        received = []
        with pytest.raises(TimeoutError):
            for _, chunk in sim.iter_stream("/generate", {**_request(40, 500), "stream": True}, timeout=1.0):
                received.append(chunk["meta_info"]["completion_tokens"])
        assert received and received[-1] < 40  # some tokens came, then nothing
        assert sim.process.poll() is None  # alive
        assert sim.status("/health", timeout=5) == 503  # SGLang's health check times out
        assert sim.process.poll() is None


def test_degrade_makes_each_request_slower(tmp_path):
    with run_sim([*FAST, "--sim-fault", "degrade:25"], cwd=tmp_path, log_path=tmp_path / "s.log") as sim:
        latencies = [
            sim.post_json("/generate", _request(30, 100 + 100 * i))["meta_info"]["e2e_latency"]
            for i in range(3)
        ]
    assert latencies[1] / latencies[0] == pytest.approx(1.25, rel=0.02)
    assert latencies[2] / latencies[1] == pytest.approx(1.25, rel=0.02)


def test_refuse_bind_and_a_real_port_collision_fail_alike(tmp_path):
    with run_sim([*FAST, "--sim-fault", "refuse_bind"], cwd=tmp_path, log_path=tmp_path / "a.log",
                 wait_ready=False) as sim:  # fmt: skip
        assert sim.wait_exit(timeout=10) == 1
        assert BIND_ERROR in sim.log() and "address already in use" in sim.log()
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        with run_sim(FAST, cwd=tmp_path, log_path=tmp_path / "b.log", port=port, wait_ready=False) as sim:
            assert sim.wait_exit(timeout=10) == 1
            log = sim.log()
    assert f"('127.0.0.1', {port}): address already in use" in log
    assert "Load weight begin" not in log  # failed before loading anything


@pytest.mark.parametrize(
    ("extra", "env", "expect"),
    [
        ([], {"NCCL_PROTO": "bogus"}, "NCCL error"),
        (["--tp-size", "16"], {}, "invalid device ordinal"),
        ([], {"CUDA_VISIBLE_DEVICES": "0,1"}, "invalid device ordinal"),
    ],
)
def test_launch_failures_exit_1_with_an_error(tmp_path, extra, env, expect):
    full_env = {**os.environ, **env}
    with run_sim([*FAST, *extra], cwd=tmp_path, log_path=tmp_path / "s.log", env=full_env,
                 wait_ready=False) as sim:  # fmt: skip
        code, seen = _statuses_until_exit(sim)
        log = sim.log()
    assert code == 1 and 200 not in seen
    assert expect in log and "Traceback (most recent call last):" in log


def test_bad_flags_exit_2(tmp_path):
    with run_sim([*FAST, "--sim-fault", "explode"], cwd=tmp_path, log_path=tmp_path / "a.log",
                 wait_ready=False) as sim:  # fmt: skip
        assert sim.wait_exit(timeout=10) == 2
        assert "unknown fault" in sim.log()
    with run_sim([*FAST, "--no-such-flag"], cwd=tmp_path, log_path=tmp_path / "b.log",
                 wait_ready=False) as sim:  # fmt: skip
        assert sim.wait_exit(timeout=10) == 2
