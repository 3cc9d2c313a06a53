"""What kernel evidence a run takes: read from the config once, before anything runs.

`evidence.kernels` defaults by target: on for the simulated node (restarts cost nothing and
the demo should show the evidence), off for `sglang` and `command`, where each profiled side
costs `evidence.restarts` real server restarts; the run's first lines state that cost.
"""

from __future__ import annotations

from typing import Any

from orchestrator.config.settings import RunSettings

KERNELS_PHASE = "kernels"  # the phase of the profiling trials after the answer


def target_name(cfg: RunSettings) -> str:
    name = cfg.target.name
    if name == "sglang" and getattr(cfg.target, "engine", None) == "sim":
        return "sim"  # target=sglang launcher=sim: the simulator behind the real adapter
    return name


def kernels_enabled(cfg: RunSettings) -> bool:
    """`evidence.kernels`, or the target's default when it is null."""
    if cfg.evidence.kernels is None:
        return target_name(cfg) == "sim"
    return cfg.evidence.kernels


def settings(cfg: RunSettings) -> dict[str, Any]:
    """The profile settings a trial carries (`TrialSpec.extra["profile"]`)."""
    return {"requests": cfg.evidence.requests or cfg.bench.requests}


def profile_extra(cfg: RunSettings, phase: str) -> dict[str, Any]:
    """`{"profile": settings}` for a trial that takes a profile: every trial with
    `trial.profile=true`, and the kernel-evidence trials; else nothing."""
    if phase == KERNELS_PHASE or cfg.trial.profile:
        return {"profile": settings(cfg)}
    return {}


def cost_line(cfg: RunSettings, n_causes_max: int | None = None) -> str:
    """The run's first-lines statement of what kernel evidence will cost (or that it is off)."""
    restarts = cfg.evidence.restarts
    causes = int(n_causes_max or cfg.evidence.max_causes)
    if not kernels_enabled(cfg):
        return ("kernel evidence: off (evidence.kernels=true profiles each named cause's two "
                f"sides after the answer: {2 * restarts} server restarts per cause, up to "
                f"{causes} causes)")
    return (f"kernel evidence: on: after the answer, {2 * restarts} profiled server restarts per"
            f" named cause (up to {causes} causes, {2 * restarts * causes} restarts at most)")
