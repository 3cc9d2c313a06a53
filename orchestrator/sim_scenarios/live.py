"""The long-running server of the `server_state` scenario: slow after days, fine after a restart.

Nothing changed in the code or on the node; the server itself did. Its state fault
(`state:PCT:MAX`: every 1000 requests served make every pass PCT% slower, up to MAX%; a model,
`targets/sim/faults.py`) stands for what a long-running process accumulates. `plan_live`
records the plan and its truth (the level a fresh restart measures, and the aged one);
`start` launches the server as an operator would (its own session, outliving the command that
started it, its log in `live/server.log`) on a simulated node of a runs directory, and `age`
serves it the traffic that wears it down ("days" of requests, compressed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from orchestrator.bench.client import make_requests, run_repetition
from orchestrator.sim_scenarios import presets as material
from orchestrator.sim_scenarios.old_log import SERVER_FLAGS, checkout
from orchestrator.targets.sim import gpu_state, model
from orchestrator.targets.sim.dialect import DEVICE_TIMER_ENV
from orchestrator.targets.sim.faults import parse_faults

DIR = "live"
FAULT = "state:40:40"  # +40% per 1000 requests served, at most +40%
AGE_REQUESTS = 1000  # what "days" of traffic leave: +40% (the cap)
TIME_SCALE = 0.05


def plan_live(out: Path, truth: Mapping, seed: int) -> dict:
    """The live server's plan (`live_server.json`) and its truth."""
    env = json.loads((out / "now_env.json").read_text())
    state = gpu_state.load(out / "now_gpu_state.json")
    profile = json.loads((out / "repo" / "sim_profile.json").read_text())
    fresh = model.predict(material.EAGLE_LAUNCH, env, state,
                          material.effects_of(profile, env=env)).verify_ms
    factor = parse_faults(FAULT).state_factor(AGE_REQUESTS, False)
    plan = {"flags": [*SERVER_FLAGS, "--sim-time-scale", str(TIME_SCALE), "--sim-fault", FAULT,
                      "--gc-warning-threshold-secs", "0.2"],  # no seed: each start its own noise
            "commit": truth["bad"], "age_requests": AGE_REQUESTS}
    (out / "live_server.json").write_text(material.render_json(plan))
    return {"fault": FAULT, "age_requests": AGE_REQUESTS, "state_pct": round(100 * (factor - 1), 2),
            "fresh_verify_ms": round(fresh, 4), "aged_verify_ms": round(fresh * factor, 4),
            "note": "the bad commit (same code as the good one) on the node as it is now"}


def start(out: Path, node_dir: Path, port: int) -> subprocess.Popen:
    """Launch the planned server on the simulated node `node_dir` (its GPU state, packages
    and login environment), detached: it outlives this process, as a real server does."""
    plan = json.loads((out / "live_server.json").read_text())
    live = out / DIR
    code = live / "code"
    if not code.exists():
        code.mkdir(parents=True)
        checkout(out / "repo", plan["commit"], code)
    env = dict(os.environ)
    env_file = node_dir / "env.json"
    if env_file.exists():
        env.update({str(k): str(v) for k, v in json.loads(env_file.read_text()).items()})
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    env[DEVICE_TIMER_ENV] = "1"  # per-phase seconds in /metrics, as the node's servers run
    argv = [sys.executable, "-P", "-m", "orchestrator.targets.sim", *plan["flags"],
            "--host", "127.0.0.1", "--port", str(port),
            "--sim-gpu-state", str(node_dir / "gpu_state.json")]
    if (node_dir / "packages.json").exists():
        argv += ["--sim-packages", str(node_dir / "packages.json")]
    with open(live / "server.log", "ab") as log:
        return subprocess.Popen(argv, cwd=code, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float = 60.0) -> None:
    import httpx

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the live server exited ({proc.returncode}) before it was ready")
        try:
            if httpx.get(f"{url}/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise RuntimeError(f"the live server at {url} was not ready within {timeout_s:.0f} s")


def age(url: str, requests: int, seed: int = 0) -> None:
    """Serve `requests` short requests, 32 at a time: the traffic that wears the server down."""
    run_repetition(url, make_requests(requests, 32, 8, seed + 7), concurrency=32,
                   timeout_s=300.0, time_scale=TIME_SCALE)
