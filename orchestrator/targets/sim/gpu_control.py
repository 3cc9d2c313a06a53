"""Simulated GPU control: the sim node's GPU-state JSON file, read and written like NVML.

The sim server re-reads the file when it changes, so a policy applied here is what the server
experiences; telemetry uses the sim's own model of clocks and power under load.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from orchestrator.gpu.base import ClockPolicy, GpuControl, GpuSample
from orchestrator.targets.sim import gpu_state
from orchestrator.targets.sim.model import busy_power_w, effective_sm_clock_mhz
from orchestrator.util import wallclock


def with_policy(state: gpu_state.GpuState, policy: ClockPolicy) -> gpu_state.GpuState:
    """The GPU state with a clock policy applied, as the driver would apply it. Pure: the
    sim's GPU control writes the result to the node, the sweep's oracle and the isolate
    benchmark predict from it. Raises ValueError for a power limit above a GPU's maximum."""
    for g in state.gpus:
        changes: dict = {}
        if policy.reset:
            changes.update(sm_clock_locked_mhz=None, power_limit_w=g.power_limit_default_w)
        if policy.locked_mhz is not None:
            changes["sm_clock_locked_mhz"] = min(policy.locked_mhz, g.sm_clock_max_mhz)
        if policy.sm_unlock:
            changes["sm_clock_locked_mhz"] = None
        if policy.mem_locked_mhz is not None:
            changes["mem_clock_locked_mhz"] = min(policy.mem_locked_mhz, g.mem_clock_mhz)
        if policy.mem_unlock:
            changes["mem_clock_locked_mhz"] = None
        if policy.app_sm_mhz is not None:
            changes["applications_clock_sm_mhz"] = min(policy.app_sm_mhz, g.sm_clock_max_mhz)
        if policy.app_default:
            changes["applications_clock_sm_mhz"] = None
        if policy.power_default:
            changes["power_limit_w"] = g.power_limit_default_w
        if policy.power_w is not None:
            if policy.power_w > g.power_limit_max_w:
                raise ValueError(f"power limit {policy.power_w} W is above GPU {g.index}'s"
                                 f" maximum {g.power_limit_max_w} W")
            changes["power_limit_w"] = policy.power_w
        if policy.persistence is not None:
            changes["persistence_mode"] = policy.persistence
        if changes:
            state = state.with_gpu(g.index, **changes)
    return state


# The settings a policy may change, saved before it is applied and put back after the trial.
_RESTORED = ("sm_clock_locked_mhz", "power_limit_w", "mem_clock_locked_mhz",
             "applications_clock_sm_mhz", "persistence_mode")


def snapshot_of(state: gpu_state.GpuState) -> dict:
    """A GPU state as a fingerprint records it (what :meth:`SimGpuControl.snapshot` returns):
    the applications clock reads as its default (the maximum) when it was never set, as
    NVML reports it."""
    doc = gpu_state.to_dict(state)
    gpus = []
    for g in doc.get("gpus", []):
        g = dict(g)
        g["processes"] = sorted(
            [{"pid": p["pid"], "name": p["name"], "used_memory_mib": p["used_memory_mib"]}
             for p in g.get("processes", [])], key=lambda p: p["pid"])
        g["applications_clock_sm_default_mhz"] = g["sm_clock_max_mhz"]
        if g.get("applications_clock_sm_mhz") is None:
            g["applications_clock_sm_mhz"] = g["sm_clock_max_mhz"]
        gpus.append(g)
    return {
        "backend": SimGpuControl.name,
        "driver_version": doc.get("driver_version"),
        "cuda_driver_version": doc.get("cuda_driver_version"),
        "nccl_version": doc.get("nccl_version"),
        "gpus": gpus,
    }


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
        return snapshot_of(self._state())

    def sample(self, own_pids: Collection[int] = ()) -> list[GpuSample]:
        now = wallclock.now()
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
        before = self._state()
        try:
            state = with_policy(before, policy)
        except ValueError as exc:
            raise RuntimeError(str(exc)) from exc
        # Only what the policy changed is restored afterwards, as on NVML: restoring a power
        # limit does not undo a clock lock another process set during the trial.
        previous = [{"index": old.index, **{k: getattr(old, k) for k in _RESTORED
                                            if getattr(old, k) != getattr(new, k)}}
                    for old, new in zip(before.gpus, state.gpus, strict=True)]
        gpu_state.save(self.path, state)
        return previous

    def restore(self, token: object) -> None:
        if token is None:
            return
        state = self._state()
        for saved in token:  # type: ignore[union-attr]
            if isinstance(saved, dict):
                fields = {k: saved[k] for k in _RESTORED if k in saved}
                state = state.with_gpu(int(saved["index"]), **fields)
            else:  # a token written before the policy had more parts: (index, lock, power)
                index, locked, power = saved
                state = state.with_gpu(index, sm_clock_locked_mhz=locked, power_limit_w=power)
        gpu_state.save(self.path, state)
