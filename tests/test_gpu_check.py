"""The device check (experiments/gpu_check.py) rehearsed without a GPU, on the GPU machine's
image as `experiments/device_image/sitecustomize.py` imitates it: only the image's packages
and the carried folder (built here by experiments/gpu_carry.py) can be imported.

torch is on that image but not here: the check never imports it in its own process (the
workload, the benchmark and the stand-in server are child processes of `--torch-python`), so
the rehearsal needs none and stops at the first GPU call, NVML. The bisect's in-process path
is rehearsed on the CPU with a pure-Python benchmark in place of the matmul (the only part
mocked is the GPU); the stand-in server runs on the CPU when an interpreter with torch is
named by SLEUTH_TEST_TORCH_PYTHON.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import gpu_bisect, gpu_carry, gpu_steps
from orchestrator.gpu.nvml import nvml_available

ROOT = Path(__file__).resolve().parents[1]
IMAGE = ROOT / "experiments" / "device_image"

# The bisect rehearsed on the CPU: CPU seconds of a loop whose length the planted commit
# doubles (CPU time, not wall time: other work on the machine barely moves it).
CPU_BENCH = '''import json, time
n = json.load(open("kernel.json"))["n"]
t = time.process_time()
s = 0
for i in range(n * n // 8):
    s += i
print(json.dumps({"value": (time.process_time() - t) * 1000}))
'''
CPU_SIZES = {"commits": 6, "culprit": 4, "base_n": 400, "slow_n": 566}


@pytest.fixture(scope="module")
def carried(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("carry") / "gpu-carry"
    gpu_carry.build(dest)
    return dest


def image_env(carried: Path, tree: Path = ROOT, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OUT")}
    env["PYTHONPATH"] = os.pathsep.join([str(IMAGE), str(carried), str(tree)])
    return {**env, **extra}


def test_carried_folder_is_pure_python_and_fits(carried):
    doc = json.loads((carried / "MANIFEST.json").read_text())
    assert [d["name"] for d in doc["distributions"]] == list(gpu_carry.CARRIED)
    assert doc["total_bytes"] == doc["carried_bytes"] + doc["working_tree_bytes"]
    assert doc["total_bytes"] < gpu_carry.LIMIT_BYTES
    assert not [p for p in carried.rglob("*") if p.suffix in gpu_carry.COMPILED]
    assert (carried / "omegaconf" / "__init__.py").is_file()


def test_the_image_refuses_what_it_lacks(carried):
    code = ("import importlib\nfor name in ('ray', 'optuna', 'sqlalchemy', 'omegaconf', 'git'):\n"
            "    try:\n        m = importlib.import_module(name)\n    except ImportError as e:\n"
            "        print(name, 'refused', e)\n    else:\n        print(name, 'from', m.__file__)\n")
    run = subprocess.run([sys.executable, "-c", code], env=image_env(carried), cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    for name in ("ray", "optuna", "sqlalchemy"):
        assert lines[name].startswith("refused No module named"), lines[name]
    for name in ("omegaconf", "git"):  # from the carried folder, not from this venv
        assert lines[name].startswith(f"from {carried}"), lines[name]


@pytest.mark.skipif(nvml_available(), reason="this machine has an NVIDIA driver")
def test_rehearsal_stops_at_the_first_gpu_call_with_one_line(carried, tmp_path):
    out = tmp_path / "out"
    run = subprocess.run([sys.executable, str(ROOT / "experiments" / "gpu_check.py")],
                         env=image_env(carried, OUT=str(out)), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith("gpu_check: cannot run here: NVML cannot open GPU 0")
    (setup,) = run.stdout.strip().splitlines()
    assert setup.startswith("setup") and " ok " in setup
    doc = json.loads((out / "gpu_check.json").read_text())
    assert doc["result"].startswith("cannot run here: NVML cannot open GPU 0")
    (step,) = doc["steps"]
    assert step["name"] == "setup" and step["status"] == "ok"
    assert step["data"]["bisect_repo"]["revisions"] == gpu_bisect.COMMITS
    carried_names = [d["name"] for d in doc["machine"]["carried"]["distributions"]]
    assert carried_names == list(gpu_carry.CARRIED)


@pytest.mark.skipif(nvml_available(), reason="this machine has an NVIDIA driver")
def test_a_ray_import_on_the_trial_path_fails_the_rehearsal(carried, tmp_path):
    """Packaging drift: a copy of the tree whose trial runner imports Ray at the top."""
    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for part in ("orchestrator", "experiments", "conf"):
        shutil.copytree(ROOT / part, tree / part, ignore=ignore)
    trial = tree / "orchestrator" / "runner" / "trial.py"
    text = trial.read_text()
    assert "\nimport json\n" in text
    trial.write_text(text.replace("\nimport json\n", "\nimport json\n\nimport ray\n", 1))
    run = subprocess.run([sys.executable, str(tree / "experiments" / "gpu_check.py")],
                         env=image_env(carried, tree, OUT=str(tmp_path / "out")), cwd=tmp_path,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "No module named 'ray' (not on the GPU machine's image" in run.stderr
    assert "NVML" not in run.stderr and "setup" not in run.stdout  # it never got that far


def _cpu_bisect(carried: Path, tmp_path: Path, env_extra: dict[str, str], use_git: bool) -> dict:
    script = (
        "import json, sys\nfrom pathlib import Path\nfrom experiments import gpu_bisect\n"
        f"bench = {CPU_BENCH!r}\nwork = Path(sys.argv[1])\n"
        f"prep = gpu_bisect.prepare(work, use_git={use_git}, bench=bench, **{CPU_SIZES!r})\n"
        "step = gpu_bisect.run(prep, sys.executable, 0, 40 * gpu_bisect.SECONDS_PER_TRIAL,"
        " work / 'out')\n"
        "print(json.dumps(step.to_json()))\n")
    run = subprocess.run([sys.executable, "-c", script, str(tmp_path / "work")],
                         env=image_env(carried, **env_extra), cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_in_process_bisect_names_the_planted_commit_without_ray(carried, tmp_path):
    step = _cpu_bisect(carried, tmp_path, {}, use_git=True)
    data = step["data"]
    assert step["status"] == "ok", step["detail"]
    assert data["named"] == data["planted"] and data["probability"] >= 0.99
    assert data["effect"]["ci"][0] > 0  # the doubled loop is slower, with an interval
    assert (tmp_path / "work" / "out" / "bisect" / "findings.json").is_file()


def test_without_git_the_bisect_runs_over_directories(carried, tmp_path):
    """A PATH without git: GitPython stays quiet, revisions are directories."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for d in os.environ.get("PATH", "").split(os.pathsep):
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name != "git" and not (bin_dir / name).exists():
                (bin_dir / name).symlink_to(Path(d) / name)
    step = _cpu_bisect(carried, tmp_path, {"PATH": str(bin_dir), "GIT_PYTHON_REFRESH": "quiet"},
                       use_git=False)
    assert step["status"] == "ok", step["detail"]
    assert step["data"]["named"] == "r04"


def test_generated_repo_plants_one_larger_kernel(tmp_path):
    shas = gpu_bisect.make_kernel_repo(tmp_path / "repo", commits=6, culprit=4)
    assert len(set(shas)) == 6
    sizes = []
    for sha in shas:
        text = subprocess.run(["git", "show", f"{sha}:kernel.json"], cwd=tmp_path / "repo",
                              capture_output=True, text=True, check=True).stdout
        sizes.append(json.loads(text)["n"])
    assert sizes == [gpu_bisect.BASE_N] * 4 + [gpu_bisect.SLOW_N] * 2
    assert (gpu_bisect.SLOW_N / gpu_bisect.BASE_N) ** 3 > 2.5  # a clear step in matmul work
    bench = (tmp_path / "repo" / "bench.py").read_text()
    compile(bench, "bench.py", "exec")  # runs on the GPU machine; here it must at least parse
    assert '"value"' in bench and "torch.cuda.Event" in bench
    compile(gpu_steps.LOAD_PY, "load.py", "exec")


def test_pure_choices():
    assert gpu_steps.pick_lock_clock([1980, 1755, 1410, 1200, 810], 1980) == 1410
    assert gpu_steps.pick_lock_clock([1980], 1980) == 1980  # nothing lower: the only one
    assert gpu_steps.pick_power_limit(700, 200, 700) == 595
    assert gpu_steps.pick_power_limit(250, 240, 300) == 240  # clamped to the board's minimum

    import pynvml  # nvidia-ml-py: NVML's own error classes, as a refusal raises them

    assert gpu_steps.not_permitted(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION))
    assert gpu_steps.not_permitted(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED))
    assert not gpu_steps.not_permitted(pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT))
    assert not gpu_steps.not_permitted(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST))


def test_standin_takes_the_adapters_flags_without_torch():
    from experiments import gpu_standin, gpu_standin_step
    from orchestrator.targets.base import NodeContext

    target = gpu_standin_step.StandinTarget(gpu_standin_step.target_conf("python3", 0),
                                            gpu_standin_step.BENCH, NodeContext("n", ROOT))
    argv = target.command(ROOT, 31234)
    assert argv[:2] == ["python3", str(gpu_standin_step.STANDIN)]
    args = gpu_standin.parse_args(argv[2:])  # every flag the adapter passes is accepted
    assert (args.port, args.enable_metrics, args.standin_layers) == (31234, True, 8)


@pytest.mark.skipif(not os.environ.get("SLEUTH_TEST_TORCH_PYTHON"),
                    reason="needs SLEUTH_TEST_TORCH_PYTHON: an interpreter with torch")
def test_standin_server_measured_through_the_sglang_adapter_on_cpu(tmp_path):
    from experiments import gpu_standin_step

    python = os.environ["SLEUTH_TEST_TORCH_PYTHON"]
    conf = gpu_standin_step.target_conf(python, 0)
    conf["extra_args"] = ["--device", "cpu", "--standin-layers", "2", "--standin-hidden", "256"]
    step = gpu_standin_step.run(python, 0, tmp_path, restarts=1, conf=conf)
    assert step.status == "ok", step.detail
    metrics = step.data["trials"][0]["metrics"]
    assert all(v > 0 for v in metrics["decode_ms"]) and all(v > 0 for v in metrics["ttft_ms_p50"])
    assert metrics["cuda_graph_share"] == [0.0, 0.0, 0.0]  # the stand-in has no CUDA graphs


def test_every_step_is_recorded_and_a_raising_one_does_not_stop_the_rest(tmp_path, monkeypatch):
    """The check's own flow, with the GPU calls replaced (the only part mocked): a bug in one
    step must cost that step, not the rest of the borrowed machine's time."""
    from experiments import gpu_check
    from experiments.gpu_steps import Step

    class Gpu:
        closed = False

        def close(self) -> None:
            Gpu.closed = True

    def ok(name):
        return lambda *a: Step(name, "ok", "fine", 0.1, {"machine": {"gpu": "stub"}})

    def boom(*a):
        raise RuntimeError("bug in a step")

    monkeypatch.setattr(gpu_check, "open_nvml", lambda index: Gpu())
    monkeypatch.setattr(gpu_check, "find_torch_python", lambda explicit: "python-with-torch")
    monkeypatch.setattr(gpu_check, "step_snapshot", ok("nvml snapshot"))
    monkeypatch.setattr(gpu_check, "step_telemetry", ok("telemetry"))
    monkeypatch.setattr(gpu_check, "step_clock_lock",
                        lambda *a: Step("clock lock", "not permitted", "NoPermission"))
    monkeypatch.setattr(gpu_check, "step_power_limit", boom)
    monkeypatch.setattr(gpu_check.gpu_standin_step, "run", ok("standin server"))
    monkeypatch.setattr(gpu_check.gpu_bisect, "run", ok("bisect"))
    assert gpu_check.main(["--out", str(tmp_path)]) == 1
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    statuses = {s["name"]: s["status"] for s in doc["steps"]}
    assert statuses == {"setup": "ok", "nvml snapshot": "ok", "telemetry": "ok",
                        "clock lock": "not permitted", "power limit": "FAIL",
                        "standin server": "ok", "bisect": "ok"}
    failed = next(s for s in doc["steps"] if s["name"] == "power limit")
    assert failed["detail"].startswith("RuntimeError: bug in a step (at test_gpu_check.py:")
    assert doc["result"] == "FAILED: power limit" and Gpu.closed
    assert doc["machine"]["gpu"] == "stub" and doc["machine"]["torch_python"] == "python-with-torch"


def test_past_its_deadline_the_bisect_starts_no_trial_and_still_writes_findings(tmp_path):
    """Out of time on the machine: the in-process node refuses new trials, the drive loop ends
    with the verdict it has, and the step fails with that status instead of hanging."""
    prep = gpu_bisect.prepare(tmp_path / "work", use_git=True, bench=CPU_BENCH, **CPU_SIZES)
    step = gpu_bisect.run(prep, sys.executable, 0, 0.0, tmp_path / "out")
    assert step.status == "FAIL" and step.data["trials"] == 0
    assert step.data["status"] == "reproducing" and step.data["named"] is None
    assert (tmp_path / "out" / "bisect" / "findings.json").is_file()


def test_nvml_process_ids_with_no_proc_entry_are_told_apart():
    assert gpu_steps.unseen_pids([os.getpid()]) == []
    assert gpu_steps.unseen_pids([os.getpid(), 2**22 + 7]) == [2**22 + 7]  # above pid_max


def test_clocks_are_read_only_once_the_load_says_it_is_busy():
    """The clock-lock step reads the SM clock under load: after the load's own "busy" line
    (torch's import can take longer than any fixed sleep), never before."""
    from types import SimpleNamespace

    class Gpu:  # the only part mocked: NVML's readings
        reads = 0

        def sample(self):
            Gpu.reads += 1
            return [SimpleNamespace(sm_clock_mhz=1000.0 + Gpu.reads)]

    code = "import sys, time; print('busy', flush=True); time.sleep(3)"
    load = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert gpu_steps._busy_clock(Gpu(), load) == 1005.0  # the highest of five readings
    finally:
        load.kill()
        load.communicate()
    broken = subprocess.Popen([sys.executable, "-c", "raise SystemExit('no CUDA here')"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    with pytest.raises(RuntimeError, match="torch load did not start: no CUDA here"):
        gpu_steps._busy_clock(Gpu(), broken)
    broken.communicate()
    assert Gpu.reads == 5  # nothing read from the broken one
