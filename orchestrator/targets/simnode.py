"""Adapter for the embedded simulated SGLang node (`target=sim`).

It launches `python -m orchestrator.targets.sim` with SGLang's flag names, so the same server
surfaces (health, generate, metrics, logs) are exercised as on a real node. The node's simulated
GPU state lives in a JSON file in the node's state directory; GPU control and telemetry read
and write the same file.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from orchestrator.targets.base import Target, apply_unset


class SimTarget(Target):
    name = "sim"

    @property
    def time_scale(self) -> float:
        return float(self.conf.get("time_scale", 1.0))

    @property
    def gpu_state_path(self) -> Path:
        configured = self.conf.get("gpu_state") or ""
        return Path(configured) if configured else self.node.state_dir / "gpu_state.json"

    def gpu_control(self):
        from orchestrator.gpu.sim import SimGpuControl

        return SimGpuControl(self.gpu_state_path)

    def command(self, worktree: Path, port: int) -> list[str]:
        c = self.conf
        # -P: do not put the worktree on sys.path, so a repo can never shadow sleuth's modules.
        argv = [sys.executable, "-P", "-m", "orchestrator.targets.sim",
                "--model-path", str(c["model_path"]), "--host", self.host, "--port", str(port),
                "--tp-size", str(c["tp_size"]), "--enable-metrics"]
        if c.get("speculative_algorithm"):
            argv += ["--speculative-algorithm", str(c["speculative_algorithm"]),
                     "--speculative-num-steps", str(c["speculative_num_steps"]),
                     "--speculative-eagle-topk", str(c["speculative_eagle_topk"]),
                     "--speculative-num-draft-tokens", str(c["speculative_num_draft_tokens"])]
            if c.get("speculative_draft_model_path"):
                argv += ["--speculative-draft-model-path", str(c["speculative_draft_model_path"])]
        if c.get("cuda_graph_max_bs") is not None:
            argv += ["--cuda-graph-max-bs", str(c["cuda_graph_max_bs"])]
        if c.get("disable_cuda_graph"):
            argv.append("--disable-cuda-graph")
        argv += ["--sim-time-scale", str(self.time_scale),
                 "--sim-noise-restart-cv", str(c["noise_restart_cv"]),
                 "--sim-noise-request-cv", str(c["noise_request_cv"]),
                 "--sim-noise-outlier-rate", str(c.get("noise_outlier_rate", 0.0)),
                 "--sim-noise-outlier-factor", str(c.get("noise_outlier_factor", 3.0)),
                 "--sim-load-seconds", str(c["load_seconds"]),
                 "--sim-gpu-state", str(self.gpu_state_path)]
        if c.get("seed") is not None:
            argv += ["--sim-seed", str(c["seed"])]
        if c.get("fault"):
            argv += ["--sim-fault", str(c["fault"])]
        return self.launcher() + argv + [str(a) for a in c.get("extra_args", [])]

    def node_packages(self) -> dict[str, str] | None:
        """The simulated node's installed packages (`<node state>/packages.json`), if set."""
        import json

        path = self.node.state_dir / "packages.json"
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def node_env_path(self) -> Path:
        return self.node.state_dir / "env.json"

    def environment(self, candidate_env):
        """The simulated node's login environment (`<node state>/env.json`, if any) sits
        between this process's environment and the target's and candidate's settings: it is
        what a changed shell profile or systemd unit would change on a real node."""
        import json

        env = dict(os.environ)
        if self.node_env_path.exists():
            env.update({str(k): str(v) for k, v in json.loads(self.node_env_path.read_text()).items()})
        env.update({str(k): str(v) for k, v in self.conf.get("env", {}).items()})
        env.update(candidate_env)
        return apply_unset(env)


def set_node_state(state_dir: Path, *, gpu_state_file: Path | None = None,
                   env_file: Path | None = None, packages_file: Path | None = None) -> None:
    """Put a simulated node into a recorded system state (GPU state, login env, packages):
    how scenarios replay "the node as it was then" and "the node as it is now"."""
    import shutil

    state_dir.mkdir(parents=True, exist_ok=True)
    for src, name in ((gpu_state_file, "gpu_state.json"), (env_file, "env.json"),
                      (packages_file, "packages.json")):
        if src is not None:
            shutil.copyfile(src, state_dir / name)
