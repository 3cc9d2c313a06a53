"""Adapter for the embedded simulated SGLang node (`target=sim`).

It launches `python -m orchestrator.targets.sim` with SGLang's flag names, so the same server
surfaces (health, generate, metrics, logs) are exercised as on a real node. The node's simulated
GPU state lives in a JSON file in the node's state directory; GPU control and telemetry read
and write the same file.

`target.sglang_version` picks the SGLang release the sim imitates (0.5.23 by default, or 0.5.9;
see `orchestrator.targets.sim.dialect`); the CUDA-graph flags are spelled for it. Like the
`sglang` target, it turns on SGLang's device timer (per-phase seconds in `/metrics`) and
measures each repetition through `orchestrator.bench.server_measure`.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx

from orchestrator.bench import server_measure
from orchestrator.bench.client import RequestSpec
from orchestrator.records import apply_unset
from orchestrator.targets.base import Target
from orchestrator.targets.sim.dialect import DEVICE_TIMER_ENV, Dialect, UnknownVersion, dialect


class SimTarget(Target):
    supports_profile = True  # the sim answers /start_profile and /stop_profile as SGLang does
    name = "sim"

    @property
    def time_scale(self) -> float:
        return self.settings.time_scale

    @property
    def dialect(self) -> Dialect:
        return dialect(self.settings.sglang_version or None)

    def preflight(self) -> str | None:
        try:
            dialect(self.settings.sglang_version or None)
        except UnknownVersion as exc:
            return f"target.sglang_version: {exc}"
        return None

    @property
    def gpu_state_path(self) -> Path:
        configured = self.settings.gpu_state
        return Path(configured) if configured else self.node.state_dir / "gpu_state.json"

    def gpu_control(self):
        from orchestrator.targets.sim.gpu_control import SimGpuControl

        return SimGpuControl(self.gpu_state_path)

    def command(self, worktree: Path, port: int) -> list[str]:
        c = self.settings
        # -P: do not put the worktree on sys.path, so a repo can never shadow sleuth's modules.
        argv = [sys.executable, "-P", "-m", "orchestrator.targets.sim",
                "--model-path", str(c.model_path), "--host", self.host, "--port", str(port),
                "--tp-size", str(c.tp_size), "--enable-metrics"]
        if c.speculative_algorithm:
            argv += ["--speculative-algorithm", str(c.speculative_algorithm),
                     "--speculative-num-steps", str(c.speculative_num_steps),
                     "--speculative-eagle-topk", str(c.speculative_eagle_topk),
                     "--speculative-num-draft-tokens", str(c.speculative_num_draft_tokens)]
            if c.speculative_draft_model_path:
                argv += ["--speculative-draft-model-path", str(c.speculative_draft_model_path)]
        per_phase = self.dialect.per_phase_graph_flags
        if c.cuda_graph_max_bs is not None:
            flag = "--cuda-graph-max-bs-decode" if per_phase else "--cuda-graph-max-bs"
            argv += [flag, str(c.cuda_graph_max_bs)]
        if c.disable_cuda_graph:
            argv += (["--cuda-graph-backend-decode", "disabled", "--cuda-graph-backend-prefill",
                      "disabled"] if per_phase else ["--disable-cuda-graph"])
        argv += ["--sim-sglang-version", self.dialect.version,
                 "--sim-time-scale", str(self.time_scale),
                 "--sim-noise-restart-cv", str(c.noise_restart_cv),
                 "--sim-noise-request-cv", str(c.noise_request_cv),
                 "--sim-noise-outlier-rate", str(c.noise_outlier_rate),
                 "--sim-noise-outlier-factor", str(c.noise_outlier_factor),
                 "--sim-load-seconds", str(c.load_seconds),
                 "--sim-gpu-state", str(self.gpu_state_path)]
        if self.node_packages_path.exists():
            argv += ["--sim-packages", str(self.node_packages_path)]
        if c.seed is not None:
            argv += ["--sim-seed", str(c.seed)]
        if c.fault:
            argv += ["--sim-fault", str(c.fault)]
        return self.launcher() + self.node_wrapper() + argv + [str(a) for a in c.extra_args]

    @property
    def node_launcher_path(self) -> Path:
        return self.node.state_dir / "launcher.json"

    def _launcher(self, key: str) -> list[str]:
        import json

        if not self.node_launcher_path.exists():
            return []
        return [str(v) for v in json.loads(self.node_launcher_path.read_text()).get(key, [])]

    def _stripped(self) -> list[str]:
        return self._launcher("strip")

    def node_wrapper(self) -> list[str]:
        """The node's own launcher wrapper (`<node state>/launcher.json`), if it has one: it
        drops inherited variables before the server starts (`targets/sim/launcher.py`)."""
        strip, drop = self._stripped(), self._launcher("drop")
        if not strip and not drop:
            return []
        return [sys.executable, "-P", "-m", "orchestrator.targets.sim.launcher",
                "--strip", ",".join(strip), "--drop", ",".join(drop), "--"]

    @property
    def node_packages_path(self) -> Path:
        return self.node.state_dir / "packages.json"

    def node_packages(self) -> dict[str, str] | None:
        """The simulated node's installed packages (`<node state>/packages.json`), if set."""
        import json

        path = self.node_packages_path
        return json.loads(path.read_text()) if path.exists() else None

    def imported_packages(self, server, base_url, env, cwd, names, libraries) -> dict:
        """What the sim server found and loaded, as it reports it (`GET /sim/packages`)."""
        return sim_report(self.http, base_url)

    @property
    def node_env_path(self) -> Path:
        return self.node.state_dir / "env.json"

    def environment(self, candidate_env):
        """The simulated node's login environment (`<node state>/env.json`, if any) sits
        between this process's environment and the target's and candidate's settings: it is
        what a changed shell profile or systemd unit would change on a real node."""
        import json

        env = dict(os.environ)
        env[DEVICE_TIMER_ENV] = "1"  # per-phase seconds in /metrics, as the sglang target sets
        if self.node_env_path.exists():
            env.update({str(k): str(v) for k, v in json.loads(self.node_env_path.read_text()).items()})
        target_env = {str(k): str(v) for k, v in self.settings.env.items()}
        env.update(target_env)
        env.update(candidate_env)
        if self._stripped():  # what sleuth passes explicitly, as `docker run -e NAME` would
            from orchestrator.targets.sim.launcher import PASS_VAR

            env[PASS_VAR] = ",".join(sorted({*target_env, *candidate_env}))
        return apply_unset(env)

    def measure(self, base_url: str, requests: list[RequestSpec], log_path: Path) -> dict[str, float]:
        return server_measure.measure(self, base_url, requests, log_path,
                                      server_info=self._server_info)

    def server_settings(self, base_url: str) -> dict | None:
        from orchestrator.bench.server_measure import settings_of

        return settings_of(self._server_info(base_url))

    def _server_info(self, base_url: str) -> dict | None:
        try:
            r = self.http.get(f"{base_url}/server_info", timeout=10.0)
        except httpx.HTTPError:
            return None
        return r.json() if r.status_code == 200 else None


def sim_report(client: httpx.Client, base_url: str) -> dict:
    """A sim server's own account of its packages; RuntimeError when it gives none."""
    try:
        r = client.get(f"{base_url}/sim/packages", timeout=10.0)
    except httpx.HTTPError as exc:
        raise RuntimeError(f"GET /sim/packages failed: {exc}") from exc
    if r.status_code != 200:
        raise RuntimeError(f"GET /sim/packages answered {r.status_code}")
    return {**r.json(), "source": "the sim server's report"}


def set_node_state(state_dir: Path, *, gpu_state_file: Path | None = None,
                   env_file: Path | None = None, packages_file: Path | None = None,
                   launcher_file: Path | None = None) -> None:
    """Put a simulated node into a recorded system state (GPU state, login env, packages, its
    launcher wrapper): how scenarios replay "the node as it was then" and "as it is now"."""
    import shutil

    state_dir.mkdir(parents=True, exist_ok=True)
    for src, name in ((gpu_state_file, "gpu_state.json"), (env_file, "env.json"),
                      (packages_file, "packages.json"), (launcher_file, "launcher.json")):
        if src is not None:
            shutil.copyfile(src, state_dir / name)
