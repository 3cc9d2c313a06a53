"""The device check's GPU steps that need no trial: NVML snapshot, telemetry under load, clock
lock and power limit (experiments/gpu_check.py runs them; the pure choices are tested here).

Each drives sleuth's own GPU code (`gpu.nvml.NvmlGpuControl`, `runner.telemetry`,
`system.fingerprint`); torch runs only in child processes of `--torch-python`, so the check's
own interpreter needs no torch, and the rehearsal without a GPU needs none either.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field

from orchestrator.gpu.base import ClockPolicy
from orchestrator.gpu.nvml import NvmlGpuControl
from orchestrator.runner.telemetry import TelemetrySampler
from orchestrator.system import fingerprint

LOAD_SECONDS = 6.0

LOAD_PY = '''import sys, time, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
a @ a
torch.cuda.synchronize()
print("busy", flush=True)  # the parent samples only from here on (torch import takes seconds)
until = time.time() + float(sys.argv[1])
while time.time() < until:
    for _ in range(20):
        a @ a
    torch.cuda.synchronize()
'''


@dataclass
class Step:
    name: str
    status: str  # ok | not permitted | FAIL
    detail: str
    seconds: float = 0.0
    data: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{self.name:<16} {self.status:<14} {self.detail} ({self.seconds:.1f} s)"

    def to_json(self) -> dict:
        return {"name": self.name, "status": self.status, "detail": self.detail,
                "seconds": round(self.seconds, 2), "data": self.data}


class NoGpu(Exception):
    pass


# -- pure choices (tested without a GPU) ----------------------------------------------------------
def not_permitted(exc: BaseException) -> bool:
    """NVML's refusal to change clocks or power (NVMLError_NoPermission / _NotSupported)."""
    text = f"{type(exc).__name__} {exc}".lower()
    return any(w in text for w in ("nopermission", "no permission", "insufficient permissions",
                                   "notsupported", "not supported"))


def pick_lock_clock(supported_mhz: list[int], max_mhz: int) -> int:
    """A supported SM clock near 70% of the maximum (clearly below it, so a lock shows)."""
    want = 0.7 * max_mhz
    candidates = [c for c in supported_mhz if c < 0.9 * max_mhz] or supported_mhz
    return min(candidates, key=lambda c: abs(c - want))


def pick_power_limit(current_w: float, min_w: float, max_w: float) -> int:
    """About 15% below the current limit, inside the board's constraints."""
    return int(max(min_w, min(max_w, round(current_w * 0.85))))


def find_torch_python(explicit: str | None) -> str:
    """An interpreter whose torch sees a CUDA device (this one, else `python3` on PATH)."""
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    tried = []
    for python in [explicit] if explicit else [sys.executable, shutil.which("python3") or ""]:
        if not python or python in tried:
            continue
        tried.append(python)
        try:
            rc = subprocess.run([python, "-c", code], capture_output=True, timeout=180).returncode
        except (OSError, subprocess.TimeoutExpired):
            continue
        if rc == 0:
            return python
    raise NoGpu(f"no Python with CUDA-enabled torch among {tried} (give --torch-python)")


def open_nvml(index: int) -> NvmlGpuControl:
    try:
        return NvmlGpuControl([index])
    except Exception as exc:  # no driver, no libnvidia-ml, no GPU with that index
        raise NoGpu(f"NVML cannot open GPU {index}: {type(exc).__name__}: {exc}") from None


# -- the steps --------------------------------------------------------------------------------------
def step_snapshot(gpu: NvmlGpuControl) -> Step:
    t0 = time.monotonic()
    snap = gpu.snapshot()
    g = snap["gpus"][0]
    need = ("name", "sm_clock_max_mhz", "power_limit_w", "pcie_gen", "pcie_width")
    missing = [k for k in need if g.get(k) in (None, "")]
    fp = fingerprint.collect(commit="", patches=(), requested_env={}, server_env=dict(os.environ),
                             node="gpu-check", gpu=snap)
    kept = {k: v for k, v in fp.items() if k in ("host", "python", "versions", "packages_hash")}
    detail = (f"driver {snap['driver_version']}, CUDA {snap['cuda_driver_version']}, {g['name']},"
              f" SM {g['sm_clock_mhz']}/{g['sm_clock_max_mhz']} MHz, mem {g['mem_clock_mhz']} MHz,"
              f" power limit {g['power_limit_w']} W (default {g['power_limit_default_w']}),"
              f" PCIe gen {g['pcie_gen']}/{g['pcie_gen_max']} x{g['pcie_width']}/{g['pcie_width_max']}")
    ok = not missing and snap["driver_version"] and snap["cuda_driver_version"]
    machine = {"gpu": g["name"], "driver": snap["driver_version"],
               "cuda_driver": snap["cuda_driver_version"], "sm_clock_max_mhz": g["sm_clock_max_mhz"],
               "power_limit_w": g["power_limit_w"], "fingerprint_keys": sorted(fp)}
    return Step("nvml snapshot", "ok" if ok else "FAIL",
                detail + (f"; missing {missing}" if missing else ""), time.monotonic() - t0,
                {"snapshot": snap, "fingerprint": kept, "machine": machine})


def _under_load(torch_python: str, index: int, seconds: float) -> subprocess.Popen:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
    return subprocess.Popen([torch_python, "-c", LOAD_PY, str(seconds)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _busy_clock(gpu: NvmlGpuControl, load: subprocess.Popen) -> float:
    """The highest SM clock read while the load runs: it said it is busy (a barrier, not a
    guess at how long torch takes to import), then five readings over a second."""
    line = load.stdout.readline() if load.stdout is not None else b""
    if line.strip() != b"busy":
        err = load.stderr.read().decode(errors="replace") if load.stderr is not None else ""
        raise RuntimeError(f"torch load did not start: {(err.strip().splitlines() or ['?'])[-1]}")
    time.sleep(0.5)
    readings = []
    for _ in range(5):
        readings.append(gpu.sample()[0].sm_clock_mhz)
        time.sleep(0.2)
    return max(readings)


def step_telemetry(gpu: NvmlGpuControl, torch_python: str, index: int) -> Step:
    t0 = time.monotonic()
    idle = gpu.sample()[0]
    load = _under_load(torch_python, index, LOAD_SECONDS)
    sampler = TelemetrySampler(gpu, 0.2, lambda: [load.pid]).start()
    try:
        _, err = load.communicate(timeout=LOAD_SECONDS + 120)
    finally:
        summary = sampler.stop()
    took = time.monotonic() - t0
    data = {"idle": vars(idle), "summary": {k: v for k, v in summary.items() if k != "samples"}}
    if load.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return Step("telemetry", "FAIL", f"torch workload exited {load.returncode}: {last}",
                    took, data)
    busy = max(s.utilization_pct for s in sampler.samples)
    power = summary["power_w"]["max"]
    clock_moved = summary["sm_clock_mhz"]["max"] != idle.sm_clock_mhz
    unseen = unseen_pids(summary["foreign_pids"])
    data["load_pid"], data["pids_outside_this_namespace"] = load.pid, unseen
    ok = summary["n_samples"] >= 10 and busy >= 50 and power > idle.power_w
    return Step("telemetry", "ok" if ok else "FAIL",
                f"{summary['n_samples']} samples, SM {summary['sm_clock_mhz']['min']:.0f}-"
                f"{summary['sm_clock_mhz']['max']:.0f} MHz (idle {idle.sm_clock_mhz:.0f},"
                f" {'moved' if clock_moved else 'unchanged'}), power max {power:.0f} W (idle "
                f"{idle.power_w:.0f} W), utilization max {busy:.0f}%, throttle "
                f"{summary['throttle_reasons'] or 'none'}, suspect={summary['suspect']}"
                + (f"; WARNING: NVML names GPU processes {unseen} that this PID namespace does"
                   " not have (a container?): trials will count them as foreign and be marked"
                   " suspect" if unseen else ""), took, data)


def unseen_pids(pids) -> list[int]:
    """NVML process ids with no /proc entry here. In a container NVML reports the host's
    process ids, so even the trial's own server looks foreign to the telemetry (the load's
    own pid is not among `pids`: it was passed as the sampler's own)."""
    return [p for p in pids if not os.path.exists(f"/proc/{p}")]


def step_clock_lock(gpu: NvmlGpuControl, torch_python: str, index: int) -> Step:
    t0 = time.monotonic()
    nv, h = gpu.nv, gpu.handles[index]
    max_mhz = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)
    try:
        mem = nv.nvmlDeviceGetSupportedMemoryClocks(h)[0]
        supported = list(nv.nvmlDeviceGetSupportedGraphicsClocks(h, mem))
    except Exception:
        supported = [int(max_mhz * 0.7)]
    target = pick_lock_clock(supported, max_mhz)
    data: dict = {"max_mhz": max_mhz, "target_mhz": target}
    try:
        token = gpu.apply(ClockPolicy(locked_mhz=target))
    except Exception as exc:
        data["error"] = f"{type(exc).__name__}: {exc}"
        return Step("clock lock", "not permitted" if not_permitted(exc) else "FAIL",
                    f"lock to {target} MHz: {data['error']}", time.monotonic() - t0, data)
    try:
        load = _under_load(torch_python, index, 2.5)
        try:
            locked = _busy_clock(gpu, load)
        finally:
            load.communicate(timeout=120)
    finally:
        gpu.restore(token)
    load = _under_load(torch_python, index, 2.5)
    try:
        after = _busy_clock(gpu, load)
    finally:
        load.communicate(timeout=120)
    data.update(read_locked_mhz=locked, read_restored_mhz=after)
    ok = locked <= target + 30 and after > locked
    return Step("clock lock", "ok" if ok else "FAIL",
                f"locked to {target} MHz: read {locked:.0f} MHz under load; restored:"
                f" {after:.0f} MHz", time.monotonic() - t0, data)


def step_power_limit(gpu: NvmlGpuControl, index: int) -> Step:
    t0 = time.monotonic()
    nv, h = gpu.nv, gpu.handles[index]
    current = nv.nvmlDeviceGetPowerManagementLimit(h) / 1000
    try:
        lo, hi = (x / 1000 for x in nv.nvmlDeviceGetPowerManagementLimitConstraints(h))
    except Exception:
        lo, hi = current * 0.5, current
    target = pick_power_limit(current, lo, hi)
    data: dict = {"current_w": current, "min_w": lo, "max_w": hi, "target_w": target}
    try:
        token = gpu.apply(ClockPolicy(power_w=target))
    except Exception as exc:
        data["error"] = f"{type(exc).__name__}: {exc}"
        return Step("power limit", "not permitted" if not_permitted(exc) else "FAIL",
                    f"set {target} W: {data['error']}", time.monotonic() - t0, data)
    try:
        read = nv.nvmlDeviceGetPowerManagementLimit(h) / 1000
    finally:
        gpu.restore(token)
    back = nv.nvmlDeviceGetPowerManagementLimit(h) / 1000
    data.update(read_w=read, restored_w=back)
    ok = abs(read - target) <= 1 and abs(back - current) <= 1
    return Step("power limit", "ok" if ok else "FAIL",
                f"{current:.0f} W -> set {target} W, read {read:.0f} W -> restored {back:.0f} W",
                time.monotonic() - t0, data)
