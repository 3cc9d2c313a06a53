"""Real GPU control through NVML (`pynvml`, from the nvidia-ml-py package).

Setting clocks and power limits needs root (or the admin having relaxed the restriction);
a failure to apply a policy fails the trial as `prepare_failed`, it never runs silently on the
wrong clocks. Every value read is best-effort: a field NVML does not support on this GPU is
left out of the snapshot rather than guessed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection

from orchestrator.gpu.base import ClockPolicy, GpuControl, GpuSample

_REASONS = (
    ("ClocksEventReasonApplicationsClocksSetting", "applications_clocks_setting"),
    ("ClocksEventReasonSwPowerCap", "sw_power_cap"),
    ("ClocksEventReasonHwSlowdown", "hw_slowdown"),
    ("ClocksEventReasonSwThermalSlowdown", "sw_thermal_slowdown"),
    ("ClocksEventReasonHwThermalSlowdown", "hw_thermal_slowdown"),
    ("ClocksEventReasonHwPowerBrakeSlowdown", "hw_power_brake_slowdown"),
)


def nvml_available() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return False
    pynvml.nvmlShutdown()
    return True


def _try(fn: Callable, *args, default=None):
    try:
        return fn(*args)
    except Exception:
        return default


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class NvmlGpuControl(GpuControl):
    name = "nvml"

    def __init__(self, indices: Collection[int] | None = None):
        import pynvml

        self.nv = pynvml
        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        self.indices = sorted(indices) if indices is not None else list(range(count))
        self.handles = {i: pynvml.nvmlDeviceGetHandleByIndex(i) for i in self.indices}

    def close(self) -> None:
        self.nv.nvmlShutdown()

    def _processes(self, h) -> list[dict]:
        procs = _try(self.nv.nvmlDeviceGetComputeRunningProcesses, h, default=[]) or []
        return sorted(
            [{"pid": int(p.pid), "used_memory_mib": int((p.usedGpuMemory or 0) // 2**20)}
             for p in procs], key=lambda p: p["pid"])

    def snapshot(self) -> dict:
        nv = self.nv
        gpus = []
        for i, h in self.handles.items():
            power = _try(nv.nvmlDeviceGetPowerManagementLimit, h)
            default_power = _try(nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
            gpus.append({
                "index": i,
                "name": _text(_try(nv.nvmlDeviceGetName, h, default="")),
                "uuid": _text(_try(nv.nvmlDeviceGetUUID, h, default="")),
                "memory_total_mib": (_try(nv.nvmlDeviceGetMemoryInfo, h).total // 2**20
                                     if _try(nv.nvmlDeviceGetMemoryInfo, h) else None),
                "sm_clock_max_mhz": _try(nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM),
                "sm_clock_mhz": _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM),
                "mem_clock_mhz": _try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM),
                "applications_clock_sm_mhz": _try(nv.nvmlDeviceGetApplicationsClock, h,
                                                  nv.NVML_CLOCK_SM),
                "power_limit_w": power / 1000 if power else None,
                "power_limit_default_w": default_power / 1000 if default_power else None,
                "persistence_mode": bool(_try(nv.nvmlDeviceGetPersistenceMode, h, default=0)),
                "pcie_gen": _try(nv.nvmlDeviceGetCurrPcieLinkGeneration, h),
                "pcie_gen_max": _try(nv.nvmlDeviceGetMaxPcieLinkGeneration, h),
                "pcie_width": _try(nv.nvmlDeviceGetCurrPcieLinkWidth, h),
                "pcie_width_max": _try(nv.nvmlDeviceGetMaxPcieLinkWidth, h),
                "ecc_errors": _try(nv.nvmlDeviceGetTotalEccErrors, h,
                                   nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC),
                "processes": self._processes(h),
            })
        return {
            "backend": self.name,
            "driver_version": _text(_try(nv.nvmlSystemGetDriverVersion, default="")),
            "cuda_driver_version": _try(nv.nvmlSystemGetCudaDriverVersion),
            "gpus": gpus,
        }

    def _reasons(self, h) -> tuple[str, ...]:
        nv = self.nv
        mask = _try(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None)
                    or nv.nvmlDeviceGetCurrentClocksThrottleReasons, h, default=0) or 0
        return tuple(name for attr, name in _REASONS if mask & getattr(nv, "nvml" + attr, 0))

    def sample(self, own_pids: Collection[int] = ()) -> list[GpuSample]:
        nv = self.nv
        now = time.time()
        out = []
        for i, h in self.handles.items():
            util = _try(nv.nvmlDeviceGetUtilizationRates, h)
            out.append(GpuSample(
                t=now, index=i,
                sm_clock_mhz=float(_try(nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM, default=0)),
                power_w=float(_try(nv.nvmlDeviceGetPowerUsage, h, default=0)) / 1000,
                temperature_c=float(_try(nv.nvmlDeviceGetTemperature, h,
                                         nv.NVML_TEMPERATURE_GPU, default=0)),
                utilization_pct=float(util.gpu) if util else 0.0,
                throttle_reasons=self._reasons(h),
                foreign_pids=tuple(p["pid"] for p in self._processes(h) if p["pid"] not in own_pids),
            ))
        return out

    def apply(self, policy: ClockPolicy) -> object:
        if policy.is_default:
            return None
        nv = self.nv
        previous = {i: _try(nv.nvmlDeviceGetPowerManagementLimit, h) for i, h in self.handles.items()}
        for h in self.handles.values():
            if policy.reset:
                nv.nvmlDeviceResetGpuLockedClocks(h)
                nv.nvmlDeviceSetPowerManagementLimit(h, nv.nvmlDeviceGetPowerManagementDefaultLimit(h))
            if policy.locked_mhz is not None:
                nv.nvmlDeviceSetGpuLockedClocks(h, policy.locked_mhz, policy.locked_mhz)
            if policy.power_w is not None:
                nv.nvmlDeviceSetPowerManagementLimit(h, policy.power_w * 1000)
        return {"power_mw": previous, "unlock": policy.locked_mhz is not None}

    def restore(self, token: object) -> None:
        if not token:
            return
        nv = self.nv
        for i, h in self.handles.items():
            if token["unlock"]:  # type: ignore[index]
                _try(nv.nvmlDeviceResetGpuLockedClocks, h)
            saved = token["power_mw"]  # type: ignore[index]
            mw = saved.get(i, saved.get(str(i)))  # JSON round trips turn keys into strings
            if mw:
                _try(nv.nvmlDeviceSetPowerManagementLimit, h, mw)
