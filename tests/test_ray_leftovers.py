"""Ray's leftovers and noise: a SIGKILLed controller's local Ray goes with it, agents
included, and what Ray publishes to the driver stays off the console."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from orchestrator.control.raylet_watch import members

# A controller's local Ray, as sleuth starts it; prints the raylet's pid once its agents run.
CONTROLLER = textwrap.dedent("""
    import os, time
    import ray
    from orchestrator.control.ray_cluster import start_ray

    start_ray({"kind": "local"}, nodes=1)
    raylet = ray._private.worker._global_node.all_processes["raylet"][0].process.pid
    deadline = time.monotonic() + 120
    while len([p for p in os.listdir("/proc") if p.isdigit() and _ppid(p) == raylet]) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    print(raylet, flush=True)
    time.sleep(600)
""").replace("import ray\n", "import ray\n\ndef _ppid(p):\n    try:\n        return int(open("
              "f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1])\n    except OSError:\n"
              "        return -1\n", 1)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.e2e
def test_a_sigkilled_controller_leaves_no_ray_agent_behind(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", CONTROLLER], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": os.getcwd()})
    try:
        raylet = int(proc.stdout.readline())
        agents = [p for p in members(raylet) if p != raylet]
        assert len(agents) >= 2  # DashboardAgent, RuntimeEnvAgent, workers: the raylet's session
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    # Ray's own fate-sharing takes the raylet; the agents used to wait out a 60 s timeout
    # publishing its log to the dead GCS. Bounded well below that, for a loaded machine.
    deadline = time.monotonic() + 40
    while any(_alive(p) for p in [raylet, *agents]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in [raylet, *agents] if _alive(p)]


def test_messages_ray_publishes_to_the_driver_stay_off_the_console(ray_session, capfd, caplog):
    import ray

    from orchestrator.control.ray_cluster import RAY_MESSAGES, quiet_driver_messages

    quiet_driver_messages()
    dump = "\n".join(f"    [state-dump] line {i}" for i in range(40))
    caplog.set_level(logging.INFO, logger=RAY_MESSAGES.name)
    ray._private.utils.publish_error_to_driver(
        "raylet_died", f"Raylet is terminated. Termination is unexpected.\n{dump}",
        gcs_client=ray._private.worker.global_worker.gcs_client)
    deadline = time.monotonic() + 60
    while "[state-dump] line 39" not in caplog.text:  # it arrived, and went to the logger
        assert time.monotonic() < deadline, "the published message never reached the driver"
        time.sleep(0.1)
    out, err = capfd.readouterr()
    assert "state-dump" not in out and "state-dump" not in err
