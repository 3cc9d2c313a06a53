"""An in-memory stand-in for `pynvml` (nvidia-ml-py): the functions `orchestrator/gpu/nvml.py`
calls, under the real module's names, constants and error classes, over GPUs held as records.

Why a fake: the NVML backend changes clocks and power limits on real GPUs, and its contract
(apply, restore exactly, refuse cleanly) must hold on machines without one. What the fake
rejects follows NVML's documented behaviour: a power limit outside the board's constraints is
`NVML_ERROR_INVALID_ARGUMENT`, a setter without root is `NVML_ERROR_NO_PERMISSION`; locked
clocks can be set and reset but never read back (NVML has no getter for them), so the test
reads them through `FakeNvml.settings`, as a person at the node would with nvidia-smi.
`test_gpu_control.py` checks every name here against the installed pynvml, so the fake cannot
drift from the real API unnoticed.
"""

from __future__ import annotations

import types
from dataclasses import dataclass, field

# Constants, with the real module's names and values (checked against it by the suite).
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_TEMPERATURE_GPU = 0
NVML_VOLATILE_ECC = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
nvmlClocksEventReasonApplicationsClocksSetting = 0x0000000000000002
nvmlClocksEventReasonSwPowerCap = 0x0000000000000004
nvmlClocksEventReasonHwSlowdown = 0x0000000000000008
nvmlClocksEventReasonSwThermalSlowdown = 0x0000000000000020
nvmlClocksEventReasonHwThermalSlowdown = 0x0000000000000040
nvmlClocksEventReasonHwPowerBrakeSlowdown = 0x0000000000000080

CONSTANTS = {name: value for name, value in globals().items()
             if name.startswith(("NVML_", "nvmlClocksEventReason"))}


class NVMLError(Exception):
    """Like pynvml's: `value` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return {NVML_ERROR_UNINITIALIZED: "Uninitialized",
                NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
                NVML_ERROR_NOT_SUPPORTED: "Not Supported",
                NVML_ERROR_NO_PERMISSION: "Insufficient Permissions"}.get(
                    self.value, f"NVML Error with code {self.value}")


class NVMLError_Uninitialized(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_UNINITIALIZED)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_NoPermission(NVMLError):
    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NO_PERMISSION)


ERRORS = (NVMLError, NVMLError_Uninitialized, NVMLError_InvalidArgument, NVMLError_NoPermission)


@dataclass
class FakeGpu:
    """One board: what NVML reports and what its setters change (power in mW, as NVML)."""

    index: int
    sm_max_mhz: int = 2430
    mem_max_mhz: int = 14001
    app_sm_mhz: int | None = None  # None: the default applications clock (the maximum)
    app_mem_mhz: int | None = None
    power_mw: int = 600_000
    power_default_mw: int = 600_000
    power_min_mw: int = 150_000
    power_max_mw: int = 600_000
    persistence: int = NVML_FEATURE_ENABLED
    sm_lock_mhz: int | None = None  # settable and resettable, never readable through NVML
    mem_lock_mhz: int | None = None
    processes: dict[int, int] = field(default_factory=dict)  # pid -> bytes of GPU memory
    reasons: int = 0


class FakeNvml:
    """The node's GPUs and the pynvml functions over them (`module()` is what gets imported)."""

    def __init__(self, gpus: list[FakeGpu]) -> None:
        self.gpus = gpus
        self.writable = True  # False: every setter answers NVML_ERROR_NO_PERMISSION (not root)
        self.initialised = 0

    def module(self) -> types.ModuleType:
        mod = types.ModuleType("pynvml")
        mod.__dict__.update(CONSTANTS)
        for error in ERRORS:
            setattr(mod, error.__name__, error)
        for name in dir(self):
            if name.startswith("nvml"):
                setattr(mod, name, getattr(self, name))
        return mod

    def settings(self) -> list[dict]:
        """Every setting a clock policy may change, per GPU, as the node really has it."""
        return [{"power_limit_w": g.power_mw / 1000, "sm_clock_locked_mhz": g.sm_lock_mhz,
                 "mem_clock_locked_mhz": g.mem_lock_mhz,
                 "applications_clock_sm_mhz": g.app_sm_mhz or g.sm_max_mhz,
                 "persistence_mode": g.persistence == NVML_FEATURE_ENABLED} for g in self.gpus]

    def set_from_outside(self, index: int, key: str, value: object) -> None:
        """Another process (an admin, a job) changes a setting with nvidia-smi."""
        g = self.gpus[index]
        if key == "power_limit_w":
            g.power_mw = int(float(value) * 1000)  # type: ignore[arg-type]
        elif key == "sm_clock_locked_mhz":
            g.sm_lock_mhz = value  # type: ignore[assignment]
        elif key == "applications_clock_sm_mhz":
            g.app_sm_mhz = value  # type: ignore[assignment]
        elif key == "persistence_mode":
            g.persistence = NVML_FEATURE_ENABLED if value else NVML_FEATURE_DISABLED
        else:
            raise KeyError(key)

    # -- the checks NVML makes ------------------------------------------------------------------
    def _live(self) -> None:
        if not self.initialised:
            raise NVMLError_Uninitialized()

    def _may_set(self) -> None:
        self._live()
        if not self.writable:
            raise NVMLError_NoPermission()

    # -- pynvml's functions (names and arguments as in nvidia-ml-py) ----------------------------
    def nvmlInit(self) -> None:
        self.initialised += 1

    def nvmlShutdown(self) -> None:
        self._live()
        self.initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._live()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        self._live()
        if not 0 <= index < len(self.gpus):
            raise NVMLError_InvalidArgument()
        return self.gpus[index]

    def nvmlSystemGetDriverVersion(self) -> str:
        return "570.86.15"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return 12080

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return f"GPU-00000000-0000-0000-0000-00000000000{handle.index}"

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu, version=None):
        used = sum(handle.processes.values())
        total = 141 * 2**30
        return types.SimpleNamespace(total=total, free=total - used, used=used)

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, type: int) -> int:
        return handle.sm_max_mhz if type == NVML_CLOCK_SM else handle.mem_max_mhz

    def nvmlDeviceGetClockInfo(self, handle: FakeGpu, type: int) -> int:
        if type == NVML_CLOCK_SM:
            return handle.sm_lock_mhz or handle.app_sm_mhz or handle.sm_max_mhz
        return handle.mem_lock_mhz or handle.app_mem_mhz or handle.mem_max_mhz

    def nvmlDeviceGetApplicationsClock(self, handle: FakeGpu, type: int) -> int:
        if type == NVML_CLOCK_SM:
            return handle.app_sm_mhz or handle.sm_max_mhz
        return handle.app_mem_mhz or handle.mem_max_mhz

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: FakeGpu, type: int) -> int:
        return self.nvmlDeviceGetMaxClockInfo(handle, type)

    def nvmlDeviceGetPowerManagementLimit(self, handle: FakeGpu) -> int:
        return handle.power_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: FakeGpu) -> int:
        return handle.power_default_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: FakeGpu) -> list[int]:
        return [handle.power_min_mw, handle.power_max_mw]

    def nvmlDeviceGetPersistenceMode(self, handle: FakeGpu) -> int:
        return handle.persistence

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeGpu) -> int:
        return 5

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeGpu) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeGpu) -> int:
        return 16

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeGpu) -> int:
        return 16

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeGpu, errorType: int,
                                    counterType: int) -> int:
        return 0

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeGpu) -> list:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used, gpuInstanceId=0xFFFFFFFF,
                                      computeInstanceId=0xFFFFFFFF)
                for pid, used in handle.processes.items()]

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu):
        return types.SimpleNamespace(gpu=100 if handle.processes else 0, memory=0)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        return min(handle.power_mw, 450_000 if handle.processes else 90_000)

    def nvmlDeviceGetTemperature(self, handle: FakeGpu, sensor: int) -> int:
        return 41

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeGpu) -> int:
        return handle.reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeGpu) -> int:
        return handle.reasons

    # -- setters: root only, checked against the board's limits --------------------------------
    def nvmlDeviceSetPowerManagementLimit(self, handle: FakeGpu, limit: int) -> None:
        self._may_set()
        if not handle.power_min_mw <= limit <= handle.power_max_mw:
            raise NVMLError_InvalidArgument()
        handle.power_mw = int(limit)

    def nvmlDeviceSetGpuLockedClocks(self, handle: FakeGpu, minGpuClockMHz: int,
                                     maxGpuClockMHz: int) -> None:
        self._may_set()
        if not 0 < minGpuClockMHz <= maxGpuClockMHz:
            raise NVMLError_InvalidArgument()
        handle.sm_lock_mhz = min(int(maxGpuClockMHz), handle.sm_max_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: FakeGpu) -> None:
        self._may_set()
        handle.sm_lock_mhz = None

    def nvmlDeviceSetMemoryLockedClocks(self, handle: FakeGpu, minMemClockMHz: int,
                                        maxMemClockMHz: int) -> None:
        self._may_set()
        if not 0 < minMemClockMHz <= maxMemClockMHz:
            raise NVMLError_InvalidArgument()
        handle.mem_lock_mhz = min(int(maxMemClockMHz), handle.mem_max_mhz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: FakeGpu) -> None:
        self._may_set()
        handle.mem_lock_mhz = None

    def nvmlDeviceSetApplicationsClocks(self, handle: FakeGpu, maxMemClockMHz: int,
                                        maxGraphicsClockMHz: int) -> None:
        self._may_set()
        if not (0 < maxGraphicsClockMHz <= handle.sm_max_mhz
                and 0 < maxMemClockMHz <= handle.mem_max_mhz):
            raise NVMLError_InvalidArgument()
        handle.app_sm_mhz, handle.app_mem_mhz = int(maxGraphicsClockMHz), int(maxMemClockMHz)

    def nvmlDeviceResetApplicationsClocks(self, handle: FakeGpu) -> None:
        self._may_set()
        handle.app_sm_mhz = handle.app_mem_mhz = None

    def nvmlDeviceSetPersistenceMode(self, handle: FakeGpu, mode: int) -> None:
        self._may_set()
        if mode not in (NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED):
            raise NVMLError_InvalidArgument()
        handle.persistence = mode
