"""A virtual node in a recorded system state: what its trials would record and measure.

The isolate benchmark's system cases and the pure tests of the difference model drive the real
chain (fingerprints -> `fingerprint_diff.diff` -> `differences.changes_from_system` ->
`reference_good` / `apply` -> candidates) without launching servers. This oracle stands in
for a trial: the fingerprint a trial of a candidate would store on this node (GPU snapshot
after the candidate's clock policy, the server's own environment after the node's launcher
wrapper, packages, SM clock under load), and a restart's value of the metric from the sim's
pure model with restart noise. Every step is the code a real trial runs (`with_policy`,
`snapshot_of`, `wrapped_environment`, `record_server_env`, `model.predict`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping

from orchestrator.gpu.base import ClockPolicy
from orchestrator.records import Candidate, apply_unset
from orchestrator.sim_scenarios.presets import EAGLE_LAUNCH, effects_of
from orchestrator.sim_scenarios.system_stories import SystemState
from orchestrator.system.fingerprint import record_server_env, whole_env
from orchestrator.targets.sim import model
from orchestrator.targets.sim.gpu_control import snapshot_of, with_policy
from orchestrator.targets.sim.gpu_state import GpuState
from orchestrator.targets.sim.launcher import PASS_VAR, wrapped_environment
from orchestrator.targets.sim.noise import lognormal_factor


class SystemOracle:
    def __init__(self, state: SystemState, profile: Mapping, *, metric: str = "verify_ms",
                 restart_cv: float = 0.02, rng: random.Random | None = None):
        self.state, self.profile, self.metric = state, dict(profile), metric
        self.restart_cv = restart_cv
        self.rng = rng or random.Random(0)

    def environments(self, cand: Candidate) -> tuple[dict[str, str], dict[str, str]]:
        """(what sleuth hands the launcher, what the server gets after the node's wrapper)."""
        intended = apply_unset({**self.state.env, **cand.env_dict})
        handed = dict(intended)
        if self.state.strip:
            handed[PASS_VAR] = ",".join(sorted(cand.env_dict))
        return intended, wrapped_environment(handed, list(self.state.strip))

    def gpus(self, cand: Candidate) -> GpuState:
        """The GPUs under the candidate's clock policy, with the NCCL its packages load (its
        pins over the node's: an overlay that took effect)."""
        return with_policy(self.state.model_gpus(cand.package_dict), ClockPolicy.parse(cand.clock))

    def truth(self, cand: Candidate) -> float:
        _, env = self.environments(cand)
        pred = model.predict(EAGLE_LAUNCH, env, self.gpus(cand), effects_of(self.profile, env=env))
        return float({"verify_ms": pred.verify_ms, "draft_ms": pred.draft_ms}[self.metric])

    def measure(self, cand: Candidate) -> float:
        return self.truth(cand) * lognormal_factor(self.rng, self.restart_cv)

    def fingerprint(self, cand: Candidate) -> dict:
        intended, actual = self.environments(cand)
        gpus = self.gpus(cand)
        clocks = [model.effective_sm_clock_mhz(g, "verify") for g in gpus.gpus]
        fp = {
            "git": {"sha": cand.commit, "patches": {}},
            "env": {"requested": whole_env(cand.env_dict), "server": whole_env(intended)},
            "packages": {**self.state.packages, **cand.package_dict},
            "gpu": snapshot_of(with_policy(self.state.gpus, ClockPolicy.parse(cand.clock))),
            "host": {"kernel": "6.8.0", "hostname": "node-a"},
            "clock_policy": cand.clock,
            "telemetry": {"n_samples": len(clocks),
                          "sm_clock_mhz": {"mean": sum(c for c, _ in clocks) / len(clocks)},
                          "throttle_reasons": sorted({r for _, rs in clocks for r in rs})},
        }
        record_server_env(fp, intended, actual)
        return fp
