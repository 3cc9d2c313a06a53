"""A short check of sleuth's GPU path on a machine with an NVIDIA GPU and PyTorch (no SGLang).

    .venv/bin/python experiments/gpu_check.py [--torch-python PYTHON] [--gpu 0] [--keep DIR]

sleuth's venv has no torch; the workload runs in `--torch-python` (default: the first of this
interpreter and `python3` on PATH that imports torch with CUDA). Steps, one line each:

1. NVML snapshot (sleuth's `NvmlGpuControl`): driver, CUDA driver version, GPU name, SM and
   memory clocks, power limit (current and default), PCIe generation and width.
2. Telemetry under load: a torch matmul loop on the GPU for a few seconds while sleuth's
   `TelemetrySampler` samples it; the SM clock, power and utilization must move off idle.
3. Clock lock: lock the SM clock to a supported value near 70% of the maximum under load, read
   it back, restore (unlock) and read again. Refused -> "not permitted" (needs root or
   `nvidia-smi -acp UNRESTRICTED`), not a failure.
4. Power limit: set it ~15% below the current one (within the board's constraints), read back,
   restore the saved limit and read again. Refused -> "not permitted".
5. Bisect on the GPU: a generated git repo of 12 commits whose `kernel.json` holds a matmul
   size; commit 8 makes it larger (~2.8x the work). `sleuth bisect target=command` with
   `bench.py` (torch, CUDA events) must name that commit; trials take telemetry and a
   fingerprint through NVML like any real trial.

Exit 0 when every step passed or was not permitted, 1 when one failed; on a machine without an
NVIDIA GPU (or without CUDA torch) it prints one line saying so and exits 1. It has not yet run
on a GPU (see docs/sglang.md).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

BASE_N, SLOW_N, COMMITS, CULPRIT = 2048, 2896, 12, 8
LOAD_SECONDS = 6.0

BENCH_PY = '''"""One repetition: mean ms of an n x n bf16 matmul on the GPU (n from kernel.json)."""
import json
import torch

n = json.load(open("kernel.json"))["n"]
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(5):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
iters = 50
start.record()
for _ in range(iters):
    a @ b
end.record()
torch.cuda.synchronize()
print(json.dumps({"value": start.elapsed_time(end) / iters, "n": n}))
'''

LOAD_PY = '''import sys, time, torch
n, until = 8192, time.time() + float(sys.argv[1])
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
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

    def line(self) -> str:
        return f"{self.name:<16} {self.status:<14} {self.detail}"


class NoGpu(Exception):
    pass


# -- pure helpers (tested without a GPU) ---------------------------------------------------------
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


def make_kernel_repo(path: Path, commits: int = COMMITS, culprit: int = CULPRIT,
                     base_n: int = BASE_N, slow_n: int = SLOW_N) -> list[str]:
    """A git repo whose commit `culprit` (and every later one) multiplies larger matrices."""
    path.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "GIT_AUTHOR_NAME": "gpu-check", "GIT_AUTHOR_EMAIL": "gpu-check@example.com",
           "GIT_COMMITTER_NAME": "gpu-check", "GIT_COMMITTER_EMAIL": "gpu-check@example.com"}

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=path, env=env, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q", "-b", "main")
    (path / "bench.py").write_text(BENCH_PY)
    shas = []
    for i in range(commits):
        n = slow_n if i >= culprit else base_n
        (path / "kernel.json").write_text(json.dumps({"n": n}) + "\n")
        (path / "NOTES").write_text(f"revision {i}\n")
        git("add", "-A")
        git("commit", "-q", "-m", f"revision {i}" + (" (larger kernel)" if i == culprit else ""))
        shas.append(git("rev-parse", "HEAD"))
    return shas


def find_torch_python(explicit: str | None) -> str:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 3)"
    for python in [explicit] if explicit else [sys.executable, shutil.which("python3") or ""]:
        if not python:
            continue
        try:
            rc = subprocess.run([python, "-c", code], capture_output=True, timeout=120).returncode
        except (OSError, subprocess.TimeoutExpired):
            continue
        if rc == 0:
            return python
    raise NoGpu("no Python with CUDA-enabled torch found (give --torch-python)")


# -- the steps --------------------------------------------------------------------------------------
def open_nvml(index: int):
    try:
        from orchestrator.gpu.nvml import NvmlGpuControl

        return NvmlGpuControl([index])
    except Exception as exc:  # no driver, no libnvidia-ml, no GPU with that index
        raise NoGpu(f"NVML cannot open GPU {index}: {type(exc).__name__}: {exc}") from None


def step_snapshot(gpu) -> Step:
    snap = gpu.snapshot()
    g = snap["gpus"][0]
    need = ("name", "sm_clock_max_mhz", "power_limit_w", "pcie_gen", "pcie_width")
    missing = [k for k in need if g.get(k) in (None, "")]
    detail = (f"driver {snap['driver_version']}, CUDA {snap['cuda_driver_version']}, {g['name']},"
              f" SM {g['sm_clock_mhz']}/{g['sm_clock_max_mhz']} MHz, mem {g['mem_clock_mhz']} MHz,"
              f" power limit {g['power_limit_w']} W (default {g['power_limit_default_w']}),"
              f" PCIe gen {g['pcie_gen']}/{g['pcie_gen_max']} x{g['pcie_width']}/{g['pcie_width_max']}")
    ok = not missing and snap["driver_version"] and snap["cuda_driver_version"]
    return Step("nvml snapshot", "ok" if ok else "FAIL",
                detail + (f"; missing {missing}" if missing else ""))


def _under_load(torch_python: str, index: int, seconds: float):
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(index)}
    return subprocess.Popen([torch_python, "-c", LOAD_PY, str(seconds)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def step_telemetry(gpu, torch_python: str, index: int) -> Step:
    from orchestrator.runner.telemetry import TelemetrySampler

    idle = gpu.sample()[0]
    load = _under_load(torch_python, index, LOAD_SECONDS)
    sampler = TelemetrySampler(gpu, 0.2, lambda: [load.pid]).start()
    _, err = load.communicate(timeout=LOAD_SECONDS + 120)
    summary = sampler.stop()
    if load.returncode != 0:
        last = (err.decode(errors="replace").strip().splitlines() or ["no output"])[-1]
        return Step("telemetry", "FAIL", f"torch workload exited {load.returncode}: {last}")
    busy = max(s.utilization_pct for s in sampler.samples)
    power = summary["power_w"]["max"]
    ok = summary["n_samples"] >= 10 and busy >= 50 and power > idle.power_w
    return Step("telemetry", "ok" if ok else "FAIL",
                f"{summary['n_samples']} samples, SM {summary['sm_clock_mhz']['min']:.0f}-"
                f"{summary['sm_clock_mhz']['max']:.0f} MHz, power max {power:.0f} W (idle "
                f"{idle.power_w:.0f} W), utilization max {busy:.0f}%, throttle "
                f"{summary['throttle_reasons'] or 'none'}, suspect={summary['suspect']}")


def step_clock_lock(gpu, torch_python: str, index: int) -> Step:
    from orchestrator.gpu.base import ClockPolicy

    nv, h = gpu.nv, gpu.handles[index]
    max_mhz = nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM)
    try:
        mem = nv.nvmlDeviceGetSupportedMemoryClocks(h)[0]
        supported = list(nv.nvmlDeviceGetSupportedGraphicsClocks(h, mem))
    except Exception:
        supported = [int(max_mhz * 0.7)]
    target = pick_lock_clock(supported, max_mhz)
    try:
        token = gpu.apply(ClockPolicy(locked_mhz=target))
    except Exception as exc:
        return Step("clock lock", "not permitted" if not_permitted(exc) else "FAIL",
                    f"lock to {target} MHz: {type(exc).__name__}: {exc}")
    try:
        load = _under_load(torch_python, index, 3.0)
        time.sleep(2.0)
        locked = gpu.sample()[0].sm_clock_mhz
        load.wait(timeout=120)
    finally:
        gpu.restore(token)
    load = _under_load(torch_python, index, 3.0)
    time.sleep(2.0)
    after = gpu.sample()[0].sm_clock_mhz
    load.wait(timeout=120)
    ok = locked <= target + 30 and after > locked
    return Step("clock lock", "ok" if ok else "FAIL",
                f"locked to {target} MHz: read {locked:.0f} MHz under load; restored: {after:.0f} MHz")


def step_power_limit(gpu, index: int) -> Step:
    from orchestrator.gpu.base import ClockPolicy

    nv, h = gpu.nv, gpu.handles[index]
    current = nv.nvmlDeviceGetPowerManagementLimit(h) / 1000
    try:
        lo, hi = (x / 1000 for x in nv.nvmlDeviceGetPowerManagementLimitConstraints(h))
    except Exception:
        lo, hi = current * 0.5, current
    target = pick_power_limit(current, lo, hi)
    try:
        token = gpu.apply(ClockPolicy(power_w=target))
    except Exception as exc:
        return Step("power limit", "not permitted" if not_permitted(exc) else "FAIL",
                    f"set {target} W: {type(exc).__name__}: {exc}")
    try:
        read = nv.nvmlDeviceGetPowerManagementLimit(h) / 1000
    finally:
        gpu.restore(token)
    back = nv.nvmlDeviceGetPowerManagementLimit(h) / 1000
    ok = abs(read - target) <= 1 and abs(back - current) <= 1
    return Step("power limit", "ok" if ok else "FAIL",
                f"{current:.0f} W -> set {target} W, read {read:.0f} W -> restored {back:.0f} W")


def step_bisect(torch_python: str, index: int, work: Path) -> Step:
    shas = make_kernel_repo(work / "repo")
    runs = work / "runs"
    argv = [sys.executable, "-m", "orchestrator", "bisect", "target=command", f"repo={work / 'repo'}",
            f"runs_dir={runs}", f"good={shas[0]}", f"bad={shas[-1]}",
            f"target.bench={torch_python} bench.py", "metric=value", "bench.repetitions=3",
            "bench.warmup_requests=0", "trial.retries=0", "nodes=1",
            f"target.env.CUDA_VISIBLE_DEVICES={index}"]
    t0 = time.time()
    run = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=1800)
    found = [p for p in runs.iterdir() if (p / "findings.json").exists()] if runs.exists() else []
    if run.returncode != 0 or not found:
        tail = (run.stderr.strip() or run.stdout.strip()).splitlines()[-1:] or ["no output"]
        return Step("bisect", "FAIL", f"sleuth bisect exited {run.returncode}: {tail[0]}")
    doc = json.loads((found[0] / "findings.json").read_text())
    top = doc["findings"][0] if doc.get("findings") else {}
    ok = top.get("id") == shas[CULPRIT]
    effect = top.get("effect", {}).get("value", {})
    return Step("bisect", "ok" if ok else "FAIL",
                f"named {str(top.get('id'))[:10]} (planted {shas[CULPRIT][:10]}), p="
                f"{top.get('probability')}, effect {effect.get('pct')}% {effect.get('ci')},"
                f" {time.time() - t0:.0f} s, run {found[0].name}")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--torch-python", help="interpreter with CUDA torch (default: search)")
    p.add_argument("--gpu", type=int, default=0, help="NVML / CUDA index of the GPU to use")
    p.add_argument("--keep", help="keep the generated repo and run directory here")
    p.add_argument("--skip-bisect", action="store_true")
    a = p.parse_args(argv)
    try:
        gpu = open_nvml(a.gpu)
        torch_python = find_torch_python(a.torch_python)
    except NoGpu as exc:
        print(f"gpu_check: cannot run here: {exc}", file=sys.stderr)
        return 1
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="sleuth-gpu-check-"))
    steps = [step_snapshot(gpu), step_telemetry(gpu, torch_python, a.gpu),
             step_clock_lock(gpu, torch_python, a.gpu), step_power_limit(gpu, a.gpu)]
    for step in steps:
        print(step.line(), flush=True)
    gpu.close()
    if not a.skip_bisect:
        steps.append(step_bisect(torch_python, a.gpu, work))
        print(steps[-1].line(), flush=True)
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    failed = [s.name for s in steps if s.status == "FAIL"]
    print(f"gpu_check: {'FAILED: ' + ', '.join(failed) if failed else 'all steps passed'}"
          f" (torch from {torch_python})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
