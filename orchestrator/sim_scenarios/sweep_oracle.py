"""A virtual trial: the simulated node's own performance model plus restart noise.

The sweep's experiment is pure, so it can be driven without launching servers: this oracle
answers a candidate with what the sim server would measure (its flags resolved exactly as the
sim resolves them, its pure model `predict`), times one restart-level noise factor. It also
knows the truth (the noise-free value of every configuration), which is what the benchmark
and the acceptance tests score a sweep against.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from orchestrator.gpu.base import ClockPolicy
from orchestrator.records import Candidate
from orchestrator.targets.base import NodeContext
from orchestrator.targets.sim import args as sim_args
from orchestrator.targets.sim.gpu_control import with_policy
from orchestrator.targets.sim.gpu_state import GpuState, default_state
from orchestrator.targets.sim.model import (
    LaunchConfig,
    LaunchError,
    expected_request_ms,
    predict,
)
from orchestrator.targets.sim.noise import lognormal_factor
from orchestrator.targets.sim.profile import NEUTRAL, ProfileError, load_effects
from orchestrator.targets.simnode import SimTarget

ORACLE_METRICS = ("output_throughput", "verify_ms", "draft_ms", "decode_ms", "accept_len")
_TIME_METRICS = ("verify_ms", "draft_ms", "decode_ms")


class SimOracle:
    def __init__(self, target_conf: Mapping[str, Any], bench_conf: Mapping[str, Any], *,
                 metric: str = "output_throughput", restart_cv: float | None = None,
                 trial_cv: float = 0.005, seed: int = 0, state: GpuState | None = None,
                 profile: str | Path | None = None):
        if metric not in ORACLE_METRICS:
            raise ValueError(f"the oracle knows {', '.join(ORACLE_METRICS)}, not {metric!r}")
        self.target_conf = dict(target_conf)
        self.bench = dict(bench_conf)
        self.metric = metric
        self.restart_cv = float(target_conf.get("noise_restart_cv", 0.02)
                                if restart_cv is None else restart_cv)
        self.trial_cv = trial_cv  # request-level noise left after averaging a trial's requests
        self.rng = random.Random(seed)
        self.state = state or default_state()
        # The checked-out code's sim profile (`sim_profile.json` of a worktree): what a commit
        # changes, including code that makes an NCCL variable matter. None: the base model.
        self.profile = profile
        self._truth: dict[str, float | None] = {}
        self._launches: dict[tuple, LaunchConfig] = {}

    def _argv(self, candidate: Candidate) -> list[str]:
        conf = {**self.target_conf, **candidate.server_dict}
        target = SimTarget(conf, self.bench, NodeContext("oracle", Path("oracle-node")))
        argv = target.command(Path("."), 0)
        return argv[argv.index("orchestrator.targets.sim") + 1:]

    def _launch(self, candidate: Candidate, env: Mapping[str, str]) -> LaunchConfig:
        """The sim's resolved launch flags (cached: env-only sweeps share one)."""
        key = (candidate.server, tuple(sorted((k, v) for k, v in env.items()
                                              if k.startswith("SLEUTH_SIM_"))))
        if key not in self._launches:
            self._launches[key] = sim_args.parse(self._argv(candidate), env).launch
        return self._launches[key]

    def _state_under(self, clock: str) -> GpuState:
        """The node's GPU state with the candidate's clock policy applied, as the sim's GPU
        control applies it before the server starts (`orchestrator/targets/sim/gpu_control.py`)."""
        policy = ClockPolicy.parse(clock)
        try:
            return with_policy(self.state, policy)
        except ValueError as exc:
            raise LaunchError("device", str(exc)) from exc

    def truth(self, candidate: Candidate) -> float | None:
        """Noise-free metric of the candidate; None when the server would not start."""
        if candidate.key in self._truth:
            return self._truth[candidate.key]
        env = {**{str(k): str(v) for k, v in self.target_conf.get("env", {}).items()},
               **candidate.env_dict}
        value: float | None
        try:
            launch = self._launch(candidate, env)
            effects = load_effects(self.profile, env) if self.profile is not None else NEUTRAL
            pred = predict(launch, env, self._state_under(candidate.clock), effects,
                           prompt_tokens=int(self.bench.get("input_len", 128)))
        except (LaunchError, sim_args.ConfigError, ProfileError):
            value = None
        else:
            out = int(self.bench.get("output_len", 64))
            value = {
                "output_throughput": 1000.0 * out / expected_request_ms(pred, out),
                "verify_ms": pred.verify_ms, "draft_ms": pred.draft_ms,
                "decode_ms": pred.decode_ms, "accept_len": pred.accept_len,
            }[self.metric]
        self._truth[candidate.key] = value
        return value

    def measure(self, candidate: Candidate) -> float | None:
        """One restart: the truth times this restart's noise (times slow down, rates drop)."""
        true = self.truth(candidate)
        if true is None:
            return None
        factor = lognormal_factor(self.rng, self.restart_cv) * lognormal_factor(
            self.rng, self.trial_cv)
        if self.metric == "accept_len":
            return true * lognormal_factor(self.rng, self.trial_cv)
        return true * factor if self.metric in _TIME_METRICS else true / factor

