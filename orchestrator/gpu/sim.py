"""Simulated GPU control: the sim node's GPU-state JSON file, read and written like NVML.

The sim server re-reads the file when it changes, so a policy applied here is what the server
experiences; telemetry uses the sim's own model of clocks and power under load.
"""

from __future__ import annotations

import time
from collections.abc import Collection
from pathlib import Path

from orchestrator.gpu.base import ClockPolicy, GpuControl, GpuSample
from orchestrator.targets.sim import gpu_state
from orchestrator.targets.sim.model import busy_power_w, effective_sm_clock_mhz


def with_policy(state: gpu_state.GpuState, policy: ClockPolicy) -> gpu_state.GpuState:
    """The GPU state with a clock policy applied, as the driver would apply it. Pure: the
    sim's GPU control writes the result to the node, the sweep's oracle predicts from it.
    Raises ValueError for a power limit above a GPU's maximum."""
    for g in state.gpus:
        changes: dict = {}
        if policy.reset:
            changes.update(sm_clock_locked_mhz=None, power_limit_w=g.power_limit_default_w)
        if policy.locked_mhz is not None:
            changes["sm_clock_locked_mhz"] = min(policy.locked_mhz, g.sm_clock_max_mhz)
        if policy.power_w is not None:
            if policy.power_w > g.power_limit_max_w:
                raise ValueError(f"power limit {policy.power_w} W is above GPU {g.index}'s"
                                 f" maximum {g.power_limit_max_w} W")
            changes["power_limit_w"] = policy.power_w
        if changes:
            state = state.with_gpu(g.index, **changes)
    return state


class SimGpuControl(GpuControl):
    name = "sim"

    def __init__(self, state_path: Path):
        self.path = Path(state_path)
        if not self.path.exists():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            gpu_state.save(self.path, gpu_state.default_state())

    def _state(self) -> gpu_state.GpuState:
        return gpu_state.load(self.path)

    def snapshot(self) -> dict:
        doc = gpu_state.to_dict(self._state())
        gpus = []
        for g in doc.get("gpus", []):
            g = dict(g)
            g["processes"] = sorted(
                [{"pid": p["pid"], "name": p["name"], "used_memory_mib": p["used_memory_mib"]}
                 for p in g.get("processes", [])], key=lambda p: p["pid"])
            gpus.append(g)
        return {
            "backend": self.name,
            "driver_version": doc.get("driver_version"),
            "cuda_driver_version": doc.get("cuda_driver_version"),
            "nccl_version": doc.get("nccl_version"),
            "gpus": gpus,
        }

    def sample(self, own_pids: Collection[int] = ()) -> list[GpuSample]:
        now = time.time()
        out = []
        for g in self._state().gpus:
            clock, reasons = effective_sm_clock_mhz(g, "verify")
            out.append(GpuSample(
                t=now, index=g.index, sm_clock_mhz=round(clock, 1),
                power_w=round(busy_power_w(g, "verify"), 1),
                temperature_c=float(g.temperature_c), utilization_pct=100.0 if own_pids else 0.0,
                throttle_reasons=tuple(reasons),
                foreign_pids=tuple(p.pid for p in g.processes if p.pid not in own_pids),
            ))
        return out

    def apply(self, policy: ClockPolicy) -> object:
        if policy.is_default:
            return None  # leave the node exactly as it is, and restore nothing
        state = self._state()
        previous = [(g.index, g.sm_clock_locked_mhz, g.power_limit_w) for g in state.gpus]
        try:
            state = with_policy(state, policy)
        except ValueError as exc:
            raise RuntimeError(str(exc)) from exc
        gpu_state.save(self.path, state)
        return previous

    def restore(self, token: object) -> None:
        if token is None:
            return
        state = self._state()
        for index, locked, power in token:  # type: ignore[union-attr]
            state = state.with_gpu(index, sm_clock_locked_mhz=locked, power_limit_w=power)
        gpu_state.save(self.path, state)
