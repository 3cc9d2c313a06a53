"""Real GPU control through NVML (`pynvml`, from the nvidia-ml-py package).

Setting clocks and power limits needs root (or the admin having relaxed the restriction);
a failure to apply a policy fails the trial as `prepare_failed`, it never runs silently on the
wrong clocks. Every value read is best-effort: a field NVML does not support on this GPU is
left out of the snapshot rather than guessed.

NVML can set SM and memory clock locks but has no call that reads them back. The snapshot
therefore records no lock value; a lock set from outside shows in the telemetry (the SM clock
under load, the "applications clocks setting" clock event reason), which is what `compare`
ranks on. Restoring a policy puts back what NVML can read (power limit, applications clocks,
persistence mode) and releases the locks this policy set; a lock the policy released
(`locked:off`, asked for explicitly: a compare on NVML never proposes it, having no lock value
to restore) stays released, since its value cannot be read.

A policy that one GPU refuses halfway (a power limit beyond that board's maximum, no
permission) is undone before the error is raised, so a refused policy leaves no GPU half-set;
a restore that fails tries every other part and GPU, then raises, so the trial reports the
clocks as not restored. The snapshot carries each board's maximum power limit, which the trial
checks a power policy against before setting anything (`runner/trial.py: clock_problem`).
"""

from __future__ import annotations

from collections.abc import Callable, Collection

from orchestrator.gpu.base import ClockPolicy, GpuControl, GpuSample
from orchestrator.util import wallclock

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
            constraints = _try(nv.nvmlDeviceGetPowerManagementLimitConstraints, h)
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
                "applications_clock_sm_default_mhz": _try(nv.nvmlDeviceGetDefaultApplicationsClock,
                                                          h, nv.NVML_CLOCK_SM),
                "applications_clock_mem_mhz": _try(nv.nvmlDeviceGetApplicationsClock, h,
                                                   nv.NVML_CLOCK_MEM),
                "power_limit_w": power / 1000 if power else None,
                "power_limit_default_w": default_power / 1000 if default_power else None,
                # What `clock_problem` checks a power policy against before anything is set.
                "power_limit_max_w": constraints[1] / 1000 if constraints else None,
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
        now = wallclock.now()
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
        token: dict = {
            "power_mw": {i: _try(nv.nvmlDeviceGetPowerManagementLimit, h)
                         for i, h in self.handles.items()},
            "unlock": policy.locked_mhz is not None,
            "mem_unlock": policy.mem_locked_mhz is not None,
        }
        if policy.app_sm_mhz is not None or policy.app_default:
            token["app_clocks"] = {
                i: (_try(nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_MEM),
                    _try(nv.nvmlDeviceGetApplicationsClock, h, nv.NVML_CLOCK_SM))
                for i, h in self.handles.items()}
        if policy.persistence is not None:
            token["persistence"] = {i: _try(nv.nvmlDeviceGetPersistenceMode, h)
                                    for i, h in self.handles.items()}
        try:
            self._set(policy, token)
        except BaseException as exc:
            # A policy one GPU refuses (a limit beyond its board, no permission) must not leave
            # the GPUs before it half-set: the trial fails as prepare_failed on the node as it was.
            try:
                self.restore(token)
            except Exception as undo:
                exc.add_note(f"putting back what was already set failed too: {undo}")
            raise
        return token

    def _set(self, policy: ClockPolicy, token: dict) -> None:
        nv = self.nv
        for i, h in self.handles.items():
            if policy.reset or policy.sm_unlock:
                nv.nvmlDeviceResetGpuLockedClocks(h)
            if policy.reset or policy.power_default:
                nv.nvmlDeviceSetPowerManagementLimit(h, nv.nvmlDeviceGetPowerManagementDefaultLimit(h))
            if policy.locked_mhz is not None:
                nv.nvmlDeviceSetGpuLockedClocks(h, policy.locked_mhz, policy.locked_mhz)
            if policy.mem_unlock:
                nv.nvmlDeviceResetMemoryLockedClocks(h)
            if policy.mem_locked_mhz is not None:
                nv.nvmlDeviceSetMemoryLockedClocks(h, policy.mem_locked_mhz, policy.mem_locked_mhz)
            if policy.app_default:
                nv.nvmlDeviceResetApplicationsClocks(h)
            if policy.app_sm_mhz is not None:
                mem = token["app_clocks"][i][0] or nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM)
                nv.nvmlDeviceSetApplicationsClocks(h, mem, policy.app_sm_mhz)
            if policy.power_w is not None:
                nv.nvmlDeviceSetPowerManagementLimit(h, policy.power_w * 1000)
            if policy.persistence is not None:
                nv.nvmlDeviceSetPersistenceMode(h, nv.NVML_FEATURE_ENABLED if policy.persistence
                                                else nv.NVML_FEATURE_DISABLED)

    def restore(self, token: object) -> None:
        if not token:
            return
        nv = self.nv

        def saved(key: str, i: int):
            values = token.get(key) or {}  # type: ignore[union-attr]
            return values.get(i, values.get(str(i)))  # JSON round trips turn keys into strings

        failed: list[str] = []

        def put_back(i: int, fn: Callable, *args) -> None:
            try:
                fn(*args)
            except Exception as exc:  # the other parts and GPUs are still put back
                failed.append(f"GPU {i} {getattr(fn, '__name__', 'call')}: {exc}")

        for i, h in self.handles.items():
            if token["unlock"]:  # type: ignore[index]
                put_back(i, nv.nvmlDeviceResetGpuLockedClocks, h)
            if token.get("mem_unlock"):  # type: ignore[union-attr]
                put_back(i, nv.nvmlDeviceResetMemoryLockedClocks, h)
            app = saved("app_clocks", i)
            if app and app[0] and app[1]:
                put_back(i, nv.nvmlDeviceSetApplicationsClocks, h, app[0], app[1])
            persistence = saved("persistence", i)
            if persistence is not None:
                put_back(i, nv.nvmlDeviceSetPersistenceMode, h, persistence)
            mw = saved("power_mw", i)
            if mw:
                put_back(i, nv.nvmlDeviceSetPowerManagementLimit, h, mw)
        if failed:  # the trial then says "clock policy NOT restored", never runs on silently
            raise RuntimeError("could not restore " + "; ".join(failed))
