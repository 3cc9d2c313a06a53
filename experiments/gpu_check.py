"""A short check of sleuth's GPU path on one machine with an NVIDIA GPU and PyTorch, no SGLang,
no Ray, no package registry (the machine this project can borrow; docs/gpu.md).

    PYTHONPATH=build/gpu-carry:. python3 experiments/gpu_check.py [--out DIR] [--gpu 0]
        [--torch-python PYTHON] [--budget-s 420] [--keep DIR]

`build/gpu-carry` (made here by experiments/gpu_carry.py) holds the pure-Python packages the
image lacks. Every step prints one line and is recorded, with its timings, in
`$OUT/gpu_check.json` (`--out`, else the `OUT` variable, else the working directory), which
is rewritten after each step so a run cut short still leaves what it did:

0. setup (no GPU): the interpreter, `git`, the carried packages; the bisect's repository built
   and its configuration composed and planned by the real `sleuth bisect` code.
1. nvml snapshot (`gpu.nvml.NvmlGpuControl`) and a trial fingerprint of the machine.
2. telemetry under a torch matmul load (`runner.telemetry.TelemetrySampler`): SM clock, power
   and utilisation must move off idle.
3. clock lock and 4. power limit through `NvmlGpuControl.apply` / `restore`; a refusal (a VM,
   no root) is "not permitted", not a failure, and the later steps run at the default clocks.
5. stand-in server: a tiny random-weight transformer on the GPU (experiments/gpu_standin.py)
   launched and measured by the real trial runner and SGLang adapter (built-in client,
   `/metrics` deltas, decode-log lines), two restarts.
6. bisect: `sleuth bisect target=command` of a torch matmul benchmark over a generated
   repository whose commit 8 of 12 multiplies larger matrices (~2.8x the work), run by the
   bisect command's own `execute` on an in-process node (experiments/gpu_local.py) instead of
   Ray: trial runner, worktrees, NVML telemetry and fingerprints, store, strategy, findings.
   It must name the planted commit at P >= 0.99.

Exit 0 when every step passed or was not permitted, 1 when one failed or the machine has no
usable GPU (one line on stderr: the first GPU call that failed). Not yet run on a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if sys.version_info < (3, 11):  # noqa: UP036 - the machine's python3 is not ours to choose
    print(f"gpu_check: cannot run here: python {platform.python_version()} is older than the 3.11"
          " sleuth needs", file=sys.stderr)
    sys.exit(1)
if shutil.which("git") is None:
    # GitPython looks for the git binary when imported and refuses to import without one
    # unless told to stay quiet; the check then bisects directories instead (gpu_bisect).
    os.environ.setdefault("GIT_PYTHON_REFRESH", "quiet")

# Everything a step uses is imported here, before the first GPU call: a module the machine
# lacks fails now, in the rehearsal without a GPU too, not after minutes of GPU time.
from experiments import gpu_bisect, gpu_standin_step  # noqa: E402
from experiments.gpu_steps import (  # noqa: E402
    NoGpu,
    Step,
    find_torch_python,
    open_nvml,
    step_clock_lock,
    step_power_limit,
    step_snapshot,
    step_telemetry,
)

DEFAULT_BUDGET_S = 420.0  # the whole check; the borrowed machine allows 10 minutes a call
MANIFEST = "MANIFEST.json"  # written by experiments/gpu_carry.py into the carried folder


def carried_manifest() -> dict | None:
    """The carried folder's manifest, from wherever that folder is on the import path."""
    for entry in sys.path:
        path = Path(entry or ".") / MANIFEST
        if path.is_file():
            return json.loads(path.read_text())
    return None


class Report:
    """The JSON record of the run, rewritten after every step."""

    def __init__(self, path: Path):
        self.path = path
        self.doc: dict = {"check": "gpu_check", "started": time.time(), "machine": {},
                          "steps": [], "result": "running"}
        self.write()

    def add(self, step: Step) -> Step:
        self.doc["steps"].append(step.to_json())
        self.write()
        print(step.line(), flush=True)
        return step

    def write(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.doc, indent=1, default=str) + "\n")
        tmp.replace(self.path)


def step_setup(work: Path) -> tuple[Step, dict]:
    """Without a GPU: what is there, and the bisect's repository, config and plan."""
    t0 = time.monotonic()
    git = shutil.which("git")
    git_version = (subprocess.run([git, "--version"], capture_output=True, text=True).stdout.strip()
                   if git else None)
    info = {"python": sys.version.split()[0], "executable": sys.executable,
            "platform": platform.platform(), "git": git_version or "absent",
            "carried": carried_manifest()}
    prepared = gpu_bisect.prepare(work, use_git=bool(git))
    info["bisect_repo"] = prepared.describe()
    detail = (f"python {info['python']}, {git_version or 'no git: revisions are directories'},"
              f" carried {'yes' if info['carried'] else 'no (not built)'}, bisect plan of"
              f" {len(prepared.commits)} revisions")
    return Step("setup", "ok", detail, time.monotonic() - t0, info), {"bisect": prepared}


def guarded(name: str, fn, *args) -> Step:
    """A step that raised is recorded as failed (with where), and the later steps still run:
    one bug must not waste the rest of the borrowed machine's time."""
    t0 = time.monotonic()
    try:
        return fn(*args)
    except Exception as exc:
        return failed_step(name, exc, t0)


def failed_step(name: str, exc: Exception, t0: float) -> Step:
    where = traceback.extract_tb(exc.__traceback__)[-1]
    return Step(name, "FAIL", f"{type(exc).__name__}: {str(exc)[:300]} (at"
                f" {Path(where.filename).name}:{where.lineno})", time.monotonic() - t0,
                {"traceback": traceback.format_exc()[-4000:]})


def bisect_step(state: dict, torch_python: str, gpu: int, seconds_left: float, out: Path) -> Step:
    if "bisect" not in state:
        return Step("bisect", "FAIL", "not run: the setup step failed before planning it")
    return gpu_bisect.run(state["bisect"], torch_python, gpu, seconds_left, out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=os.environ.get("OUT") or ".",
                   help="folder for gpu_check.json (default: $OUT, else here)")
    p.add_argument("--gpu", type=int, default=0, help="NVML / CUDA index of the GPU to use")
    p.add_argument("--torch-python", help="interpreter with CUDA torch (default: search)")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help="wall seconds for the whole check (the bisect gets what is left)")
    p.add_argument("--keep", help="keep the generated repository and run directory here")
    a = p.parse_args(argv)
    deadline = time.monotonic() + a.budget_s
    report = Report(Path(a.out) / "gpu_check.json")
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="sleuth-gpu-check-"))
    try:
        t0 = time.monotonic()
        try:
            setup, state = step_setup(work)
        except Exception as exc:  # the GPU steps can still tell something
            setup, state = failed_step("setup", exc, t0), {}
        report.doc["machine"].update(setup.data)
        report.add(setup)
        try:
            gpu = open_nvml(a.gpu)
            torch_python = find_torch_python(a.torch_python)
        except NoGpu as exc:
            report.doc["result"] = f"cannot run here: {exc}"
            report.write()
            print(f"gpu_check: cannot run here: {exc}", file=sys.stderr)
            return 1
        report.doc["machine"]["torch_python"] = torch_python
        snap = report.add(guarded("nvml snapshot", step_snapshot, gpu))
        report.doc["machine"].update(snap.data.get("machine", {}))
        report.write()
        report.add(guarded("telemetry", step_telemetry, gpu, torch_python, a.gpu))
        report.add(guarded("clock lock", step_clock_lock, gpu, torch_python, a.gpu))
        report.add(guarded("power limit", step_power_limit, gpu, a.gpu))
        gpu.close()
        report.add(guarded("standin server", gpu_standin_step.run, torch_python, a.gpu, work,
                           gpu_standin_step.RESTARTS, None, Path(a.out)))
        report.add(guarded("bisect", bisect_step, state, torch_python, a.gpu,
                           deadline - time.monotonic(), Path(a.out)))
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    failed = [s["name"] for s in report.doc["steps"] if s["status"] == "FAIL"]
    report.doc["result"] = "FAILED: " + ", ".join(failed) if failed else "all steps passed"
    report.doc["seconds"] = time.time() - report.doc["started"]
    report.write()
    print(f"gpu_check: {report.doc['result']} in {report.doc['seconds']:.0f} s"
          f" (torch from {torch_python}); {report.path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
