"""Attaching to a running server, stopping it and relaunching it, on a real simulated server
process; and the bad input of `live=`: one line, exit 2, nothing written."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from orchestrator.errors import UserError
from orchestrator.live import proc
from orchestrator.live.attach import attach
from orchestrator.live.restart import relaunch, stop
from orchestrator.util.process import free_port, read_environ
from tests.sim_client import run_sim

pytestmark = pytest.mark.e2e  # real servers, and the sleuth command

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--tp-size", "8", "--enable-metrics", "--sim-time-scale", "0.02",
        "--sim-load-seconds", "2"]
SLEUTH = str(Path(sys.executable).parent / "sleuth")


def test_attach_by_pid_and_by_url_reads_the_server(tmp_path):
    env = {**os.environ, "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1", "HF_TOKEN": "hf_" + "x" * 30}
    with run_sim(ARGS, cwd=tmp_path, log_path=tmp_path / "s.log", env=env) as sim:
        by_pid = attach(str(sim.process.pid))
        by_url = attach(sim.base_url)
    for server in (by_pid, by_url):
        assert server.pid == sim.process.pid and server.url == sim.base_url
        assert server.argv[1:3] == ("-m", "orchestrator.targets.sim")
        assert server.cwd == str(tmp_path) and server.log_path == str(tmp_path / "s.log")
        assert server.env["SGLANG_ENABLE_METRICS_DEVICE_TIMER"] == "1"
        assert server.info["tp_size"] == 8 and server.info["version"] == "0.5.23"
        assert server.uptime_s is not None and 0 <= server.uptime_s < 120
        assert server.rss_bytes and server.rss_bytes > 10 * 2**20
        assert server.restartable and server.flag("--sim-time-scale") == "0.02"


def test_attach_refuses_what_is_not_a_running_server(tmp_path):
    with pytest.raises(UserError, match="no such process"):
        attach("999999999")
    with pytest.raises(UserError, match="no SGLang server answers"):
        attach(str(os.getpid()))  # this test: a process, not a server
    with pytest.raises(UserError, match="PID or its URL"):
        attach("ftp://host/x")


def test_stop_then_relaunch_leaves_the_same_command_running(tmp_path):
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "orchestrator.targets.sim", *ARGS, "--port", str(port),
            "--model-path", "sim/x"]
    with open(tmp_path / "s.log", "ab") as log:
        original = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=log,
                                    stderr=subprocess.STDOUT, start_new_session=True)
    again = None
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.05)
        server = attach(str(original.pid))
        ended = stop(server, grace_s=10)
        assert ended.clean and ended.signal_used == "SIGTERM"
        assert original.wait(timeout=10) is not None
        again = relaunch(server, ready_timeout_s=30)
        assert again.ready and again.pid != original.pid
        assert proc.cmdline(again.pid) == argv and proc.cwd(again.pid) == str(tmp_path)
        assert read_environ(again.pid)["PYTHONPATH"] == str(ROOT)
        assert (tmp_path / "s.log").read_text().count("server_args=") == 2  # appended
    finally:
        original.kill()
        if again is not None and again.pid:
            try:
                os.kill(again.pid, 9)
            except ProcessLookupError:
                pass
        time.sleep(0.2)


@pytest.mark.parametrize("args, needle", [
    (["live=999999999"], "no such process"),
    (["live=http://127.0.0.1:1"], "no SGLang server answers"),
    (["live=ftp://host/x"], "PID or its URL"),
])
def test_bad_live_input_is_one_line_exit_2_nothing_written(tmp_path, args, needle):
    done = subprocess.run([SLEUTH, "investigate", "target=sim", f"runs_dir={tmp_path / 'r'}",
                           "run_id=x", *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and needle in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "r").exists()


def test_a_server_without_the_device_timer_cannot_report_verify(tmp_path):
    spec = ["--speculative-algorithm", "EAGLE3"]
    with run_sim([*ARGS, *spec], cwd=tmp_path, log_path=tmp_path / "s.log",
                 env={k: v for k, v in os.environ.items()
                      if k != "SGLANG_ENABLE_METRICS_DEVICE_TIMER"}) as sim:
        done = subprocess.run([SLEUTH, "investigate", "target=sim", f"live={sim.process.pid}",
                               f"runs_dir={tmp_path / 'r'}"], capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 2 and "SGLANG_ENABLE_METRICS_DEVICE_TIMER=1" in done.stderr
    assert "metric=tpot_ms_p50" in done.stderr and not (tmp_path / "r").exists()
    # its configuration is what it reports: no speculative decoding, no verify to measure
    with run_sim(ARGS, cwd=tmp_path, log_path=tmp_path / "t.log") as sim:
        done = subprocess.run([SLEUTH, "investigate", "target=sim", f"live={sim.process.pid}",
                               f"runs_dir={tmp_path / 'r'}"], capture_output=True, text=True,
                              timeout=120)
    assert done.returncode == 2 and "measured only with speculative decoding" in done.stderr


def test_without_a_restart_the_running_server_is_weighed_against_the_reference(tmp_path,
                                                                               sim_repo):
    """No restart: nothing is launched (the server holds the node), state is not tested, and
    the running server is set against the reference's level (an old log's, here), exit 3."""
    repo, _ = sim_repo
    log = ROOT / "tests" / "fixtures" / "sglang_logs" / "sglang_0523_tp8.log"
    spec = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
            "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]
    env = {**os.environ, "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1"}
    with run_sim([*ARGS, *spec], cwd=tmp_path, log_path=tmp_path / "s.log", env=env) as sim:
        done = subprocess.run(
            [SLEUTH, "investigate", "target=sim", f"live={sim.process.pid}", f"repo={repo}",
             f"runs_dir={tmp_path / 'r'}", "run_id=x", f"reference=log:{log}",
             "log.pattern=verify (?P<verify_ms>[0-9.]+) ms", "bench.requests=2",
             "bench.output_len=16", "bench.repetitions=2"],
            capture_output=True, text=True, timeout=300)
        assert sim.process.poll() is None  # never stopped
    import json

    answer = json.loads((tmp_path / "r" / "x" / "findings-investigate.json").read_text())["answer"]
    assert done.returncode == 3, done.stdout[-2000:] + done.stderr
    assert "server state was not tested" in answer["sentence"]
    assert "the reference's configuration was not tested" in answer["sentence"]
    assert "from 18.9" in answer["breakdown"] and "the reference log:" in answer["breakdown"]
    assert not (tmp_path / "r" / "x" / "relaunched.json").exists()
