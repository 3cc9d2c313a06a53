"""What kernel evidence a run takes: read from the config once, before anything runs.

`evidence.kernels` defaults by target: on for the simulated node (restarts cost nothing and
the demo should show the evidence), off for `sglang` and `command`, where each profiled side
costs `evidence.restarts` real server restarts; the run's first lines state that cost.
Each function takes the part of the settings it reads (`evidence`, `target`, `bench`).
"""

from __future__ import annotations

from typing import Any

from orchestrator.config.schema import BenchConf, EvidenceConf, TargetConf

KERNELS_PHASE = "kernels"  # the phase of the profiling trials after the answer


def target_name(target: TargetConf) -> str:
    name = target.name
    if name == "sglang" and getattr(target, "engine", None) == "sim":
        return "sim"  # target=sglang launcher=sim: the simulator behind the real adapter
    return name


def kernels_enabled(evidence: EvidenceConf, target: TargetConf) -> bool:
    """`evidence.kernels`, or the target's default when it is null."""
    if evidence.kernels is None:
        return target_name(target) == "sim"
    return evidence.kernels


def profile_extra(evidence: EvidenceConf, bench: BenchConf, profile: bool,
                  phase: str) -> dict[str, Any]:
    """`{"profile": settings}` for a trial that takes a profile (`TrialSpec.extra`): every
    trial with `trial.profile=true`, and the kernel-evidence trials; else nothing."""
    if phase == KERNELS_PHASE or profile:
        return {"profile": {"requests": evidence.requests or bench.requests}}
    return {}


def cost_line(evidence: EvidenceConf, target: TargetConf, n_causes_max: int | None = None) -> str:
    """The run's first-lines statement of what kernel evidence will cost (or that it is off)."""
    restarts = evidence.restarts
    causes = int(n_causes_max or evidence.max_causes)
    if not kernels_enabled(evidence, target):
        return ("kernel evidence: off (evidence.kernels=true profiles each named cause's two "
                f"sides after the answer: {2 * restarts} server restarts per cause, up to "
                f"{causes} causes)")
    return (f"kernel evidence: on: after the answer, {2 * restarts} profiled server restarts per"
            f" named cause (up to {causes} causes, {2 * restarts * causes} restarts at most)")
