"""What kernel evidence a run takes: read from the config once, before anything runs.

`evidence.kernels` defaults by target: on for the simulated node (restarts cost nothing and
the demo should show the evidence), off for `sglang` and `command`, where each profiled side
costs `evidence.restarts` real server restarts; the run's first lines state that cost.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from omegaconf import DictConfig, OmegaConf

KERNELS_PHASE = "kernels"  # the phase of the profiling trials after the answer


def _get(cfg: Any, dotted: str, default: Any = None) -> Any:
    """`cfg` at a dotted key (a DictConfig or a plain mapping), `default` when absent or null."""
    if isinstance(cfg, DictConfig):
        value = OmegaConf.select(cfg, dotted, default=None)
    else:
        value = cfg
        for part in dotted.split("."):
            value = value.get(part) if isinstance(value, Mapping) else None
    return default if value is None else value


def target_name(cfg: Any) -> str:
    name = str(_get(cfg, "target.name", "") or "")
    if name == "sglang" and str(_get(cfg, "target.engine", "") or "") == "sim":
        return "sim"  # target=sglang launcher=sim: the simulator behind the real adapter
    return name


def kernels_enabled(cfg: Any) -> bool:
    """`evidence.kernels`, or the target's default when it is null."""
    value = _get(cfg, "evidence.kernels")
    if value is None:
        return target_name(cfg) == "sim"
    return bool(value)


def settings(cfg: Any) -> dict[str, Any]:
    """The profile settings a trial carries (`TrialSpec.extra["profile"]`)."""
    n = _get(cfg, "evidence.requests")
    return {"requests": int(n) if n else int(_get(cfg, "bench.requests", 4))}


def profile_extra(cfg: Any, phase: str) -> dict[str, Any]:
    """`{"profile": settings}` for a trial that takes a profile: every trial with
    `trial.profile=true`, and the kernel-evidence trials; else nothing."""
    if phase == KERNELS_PHASE or bool(_get(cfg, "trial.profile", False)):
        return {"profile": settings(cfg)}
    return {}


def cost_line(cfg: Any, n_causes_max: int | None = None) -> str:
    """The run's first-lines statement of what kernel evidence will cost (or that it is off)."""
    restarts = int(_get(cfg, "evidence.restarts", 3))
    causes = int(n_causes_max or _get(cfg, "evidence.max_causes", 3))
    if not kernels_enabled(cfg):
        return ("kernel evidence: off (evidence.kernels=true profiles each named cause's two "
                f"sides after the answer: {2 * restarts} server restarts per cause, up to "
                f"{causes} causes)")
    return (f"kernel evidence: on: after the answer, {2 * restarts} profiled server restarts per"
            f" named cause (up to {causes} causes, {2 * restarts * causes} restarts at most)")
