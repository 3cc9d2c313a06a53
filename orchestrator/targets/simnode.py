"""Adapter for the embedded simulated SGLang node (`target=sim`).

It launches `python -m orchestrator.targets.sim` with SGLang's flag names, so the same server
surfaces (health, generate, metrics, logs) are exercised as on a real node. The node's simulated
GPU state lives in a JSON file in the node's state directory; GPU control and telemetry read
and write the same file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from orchestrator.targets.base import Target


class SimTarget(Target):
    name = "sim"

    @property
    def time_scale(self) -> float:
        return float(self.conf.get("time_scale", 1.0))

    @property
    def gpu_state_path(self) -> Path:
        configured = self.conf.get("gpu_state") or ""
        return Path(configured) if configured else self.node.state_dir / "gpu_state.json"

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
                 "--sim-load-seconds", str(c["load_seconds"]),
                 "--sim-gpu-state", str(self.gpu_state_path)]
        if c.get("seed") is not None:
            argv += ["--sim-seed", str(c["seed"])]
        if c.get("fault"):
            argv += ["--sim-fault", str(c["fault"])]
        return self.launcher() + argv + [str(a) for a in c.get("extra_args", [])]

    def prepare(self, worktree: Path, trial_dir: Path) -> None:
        """Make sure the node has a GPU state file (a fresh node starts at the defaults)."""
        path = self.gpu_state_path
        if not path.exists():
            from orchestrator.targets.sim import gpu_state

            path.parent.mkdir(parents=True, exist_ok=True)
            gpu_state.save(path, gpu_state.default_state())
