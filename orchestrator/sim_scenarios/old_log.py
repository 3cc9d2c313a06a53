"""The old log of the `old_log` scenario: what the engineer had instead of a sleuth run.

It is not written by hand: the simulated server runs the good commit on the node as it was
(the scenario's `reference_*` state: NCCL_PROTO=LL128 and NCCL_DEBUG=INFO in its environment,
the stock 600 W power limit) with the seed's custom instrumentation on (`--sim-verify-log`: an
`[EAGLE] verify 19.02 ms` line per decode-log window), serves a while of traffic one request at a
time, and its log is kept under `old_logs/`, rotated as logrotate leaves it (the start,
with `server_args=` and the NCCL lines, compressed in `server.log.1.gz`, the rest in
`server.log`). The truth records the noise-free verify time of that state, the level the log
should show.
"""

from __future__ import annotations

import gzip
import io
import json
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping
from pathlib import Path

from orchestrator.bench.client import make_requests, run_repetition
from orchestrator.sim_scenarios import presets as material
from orchestrator.targets.sim import gpu_state, model
from orchestrator.targets.sim.launcher import run_sim

DIR = "old_logs"
PATTERN = "verify (?P<verify_ms>[0-9.]+) ms"
TIME_SCALE = 0.02
REQUESTS = 48  # the traffic the log caught: one request at a time, as sleuth's bench sends
# The sim target's defaults (`conf/target/sim.yaml`): the configuration the old server ran.
SERVER_FLAGS = ("--model-path", "moonshotai/Kimi-K2.5", "--tp-size", "8", "--enable-metrics",
                "--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
                "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3",
                "--speculative-draft-model-path", "lightseekorg/kimi-k2.5-eagle3")


def checkout(repo: Path, sha: str, into: Path) -> None:
    """The files of commit `sha` under `into` (what a server started there would read)."""
    tar = subprocess.run(["git", "-C", str(repo), "archive", "--format=tar", sha],
                         capture_output=True, check=True).stdout
    with tarfile.open(fileobj=io.BytesIO(tar)) as archive:
        archive.extractall(into, filter="data")


def record_old_log(out: Path, truth: Mapping, seed: int) -> dict:
    """Run the old server, keep its log in `out/old_logs/`; returns the truth about it."""
    logs = out / DIR
    logs.mkdir()
    env = json.loads((out / "reference_env.json").read_text())
    with tempfile.TemporaryDirectory(prefix="sleuth-old-server-") as tmp:
        code = Path(tmp) / "code"
        code.mkdir()
        checkout(out / "repo", str(truth["good"]), code)
        raw = Path(tmp) / "server.log"
        args = [*SERVER_FLAGS, "--sim-time-scale", str(TIME_SCALE), "--sim-load-seconds", "5",
                "--sim-gpu-state", str(out / "reference_gpu_state.json"),
                "--sim-packages", str(out / "reference_packages.json"),
                "--sim-verify-log", "1", "--sim-seed", str(seed)]
        with run_sim(args, cwd=code, log_path=raw, env=env, ready_timeout=60.0) as sim:
            run_repetition(sim.base_url, make_requests(REQUESTS, 128, 64, seed), concurrency=1,
                           timeout_s=120.0, time_scale=TIME_SCALE)
        lines = raw.read_text(errors="replace").splitlines(keepends=True)
        profile = json.loads((code / "sim_profile.json").read_text())
    cut = max(1, int(len(lines) * 0.6))
    with gzip.open(logs / "server.log.1.gz", "wt") as f:
        f.writelines(lines[:cut])
    (logs / "server.log").write_text("".join(lines[cut:]))
    state = gpu_state.load(out / "reference_gpu_state.json")
    verify = model.predict(material.EAGLE_LAUNCH, env, state,
                           material.effects_of(profile, env=env)).verify_ms
    return {"dir": DIR, "files": ["server.log.1.gz", "server.log"], "pattern": PATTERN,
            "requests": REQUESTS, "verify_ms": round(verify, 4),
            "note": "the good commit on the reference node, one request at a time"}
