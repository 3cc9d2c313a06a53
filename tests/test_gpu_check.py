"""experiments/gpu_check.py without a GPU: what can be checked here is that it refuses cleanly,
that its generated repo plants exactly one change, and its pure choices. The GPU steps
themselves (NVML, torch load, clock lock, power limit, bisect on the GPU) need the machine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import gpu_check
from orchestrator.gpu.nvml import nvml_available

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(nvml_available(), reason="this machine has an NVIDIA driver")
def test_without_a_gpu_it_says_so_in_one_line():
    run = subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu_check.py")],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert run.returncode == 1 and run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("gpu_check: cannot run here: NVML cannot open GPU 0")


def test_generated_repo_plants_one_larger_kernel(tmp_path):
    shas = gpu_check.make_kernel_repo(tmp_path / "repo", commits=6, culprit=4)
    assert len(set(shas)) == 6
    sizes = []
    for sha in shas:
        text = subprocess.run(["git", "show", f"{sha}:kernel.json"], cwd=tmp_path / "repo",
                              capture_output=True, text=True, check=True).stdout
        sizes.append(json.loads(text)["n"])
    assert sizes == [gpu_check.BASE_N] * 4 + [gpu_check.SLOW_N] * 2
    assert (gpu_check.SLOW_N / gpu_check.BASE_N) ** 3 > 2.5  # a clear step in matmul work
    bench = (tmp_path / "repo" / "bench.py").read_text()
    compile(bench, "bench.py", "exec")  # runs on the GPU machine; here it must at least parse
    assert '"value"' in bench and "torch.cuda.Event" in bench
    compile(gpu_check.LOAD_PY, "load.py", "exec")


def test_pure_choices():
    assert gpu_check.pick_lock_clock([1980, 1755, 1410, 1200, 810], 1980) == 1410
    assert gpu_check.pick_lock_clock([1980], 1980) == 1980  # nothing lower: the only one
    assert gpu_check.pick_power_limit(700, 200, 700) == 595
    assert gpu_check.pick_power_limit(250, 240, 300) == 240  # clamped to the board's minimum

    class NVMLError_NoPermission(Exception):  # noqa: N801 - pynvml's naming
        pass

    assert gpu_check.not_permitted(NVMLError_NoPermission("Insufficient Permissions"))
    assert not gpu_check.not_permitted(RuntimeError("GPU is lost"))
