"""`sleuth doctor`: can this machine run trials, and which targets?

Each check prints one line: ok / warn / slow / FAIL. Only what stops every target is a failure
(git, Ray, a writable runs directory); a missing GPU driver just means only the sim target can
run, and a Ray that starts slowly (or runs out of its own start-up time) on a loaded machine is
"slow": it works, later.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable

from orchestrator.config.settings import RunSettings

Check = tuple[str, str, str]  # (status, name, detail)


def check_git() -> Check:
    if not shutil.which("git"):
        return "FAIL", "git", "git is not on PATH"
    import git

    # GitPython's parse of `git version` (the one `Workspace` checks its minimum against):
    # numbers only, so a vendor suffix ("2.39.5 (Apple Git-154)") is not read as the version.
    numbers = git.Git().version_info
    version = ".".join(map(str, numbers))
    from orchestrator.workspace.git import MIN_GIT_VERSION

    if tuple(numbers[:2]) < MIN_GIT_VERSION:  # the minimum every command checks, one constant
        need = ".".join(map(str, MIN_GIT_VERSION))
        return "FAIL", "git", (f"git {version} is too old (need >= {need}: commit ranges use"
                               " `git log --diff-merges`)")
    return "ok", "git", version


# A local start slower than this is worth a line: every command waits that long before its
# first trial. It is a busy machine, not a broken one, so it is "slow", never "FAIL".
SLOW_START_S = 15.0


def check_ray(slow_s: float = SLOW_START_S, seen: dict | None = None) -> Check:
    """Ray starts and runs a task; with `seen`, also what an actor that asks for no GPU (a
    node actor) finds in CUDA_VISIBLE_DEVICES there (`seen["actor"]`)."""
    import ray

    if ray.is_initialized():
        return "ok", "ray", f"{ray.__version__} (already running in this process)"
    from orchestrator.control.ray_cluster import load_note, start_local, start_timed_out
    from orchestrator.errors import RayStartFailed

    started = time.monotonic()
    try:
        start_local(num_cpus=1, log_to_driver=False, logging_level=logging.WARNING,
                    namespace="sleuth-doctor")

        @ray.remote(num_cpus=0)
        def ping() -> str:
            return "pong"

        answer = ray.get(ping.remote(), timeout=120)
        if seen is not None:
            class Probe:
                def visible(self) -> str | None:
                    return os.environ.get("CUDA_VISIBLE_DEVICES")

            probe = ray.remote(Probe).options(num_cpus=0).remote()
            seen["actor"] = ray.get(probe.visible.remote(), timeout=120)
    except RayStartFailed as exc:
        if exc.__cause__ is not None and start_timed_out(exc.__cause__):
            return ("slow", "ray", f"{ray.__version__}: a local instance did not finish starting"
                    f" within Ray's own time limit ({load_note()}): a busy machine, not a broken"
                    " install; commands try twice, or run when it is quieter")
        return "FAIL", "ray", f"a local Ray instance did not start: {exc}"
    except ray.exceptions.GetTimeoutError:
        return ("slow", "ray", f"{ray.__version__}: started, but a first task took over 120 s"
                f" ({load_note()})")
    except Exception as exc:
        return "FAIL", "ray", f"a local Ray instance did not work: {type(exc).__name__}: {exc}"
    finally:
        ray.shutdown()
    took = time.monotonic() - started
    if answer != "pong":
        return "FAIL", "ray", f"{ray.__version__}: a first task answered {answer!r}"
    if took > slow_s:
        return ("slow", "ray", f"{ray.__version__}: a local start took {took:.0f} s"
                f" ({load_note()}); every command waits that long before its first trial")
    return "ok", "ray", f"{ray.__version__}: local start/stop works ({took:.1f} s)"


def check_ray_gpus(seen: dict) -> Check:
    """What the installed Ray does to the GPUs an actor that asks for none sees, and what
    sleuth's node actors see here (measured in `check_ray`'s local instance)."""
    import ray

    from orchestrator.runner.visibility import VAR, ray_note

    note = f"Ray {ray.__version__} {ray_note(ray.__version__)}"
    if "actor" not in seen:
        return "warn", "gpus", f"{note} (not measured: Ray did not start)"
    actor, shell = seen["actor"], os.environ.get(VAR)
    if actor != shell:
        return ("FAIL", "gpus", f"{note}; but a node actor here sees {VAR}={actor!r} where this"
                f" shell has {shell!r}: its servers would run on other GPUs")
    shown = "unset: every GPU" if shell is None else repr(shell)
    return "ok", "gpus", f"{note}; measured: a node actor sees {VAR} as this shell does ({shown})"


def check_nvml() -> Check:
    try:
        import pynvml
    except ImportError:
        return "warn", "nvml", "nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return "warn", "nvml", "no NVIDIA driver: only the sim target can run here"
    try:
        driver = pynvml.nvmlSystemGetDriverVersion()
        count = pynvml.nvmlDeviceGetCount()
        names = {pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)}
    finally:
        pynvml.nvmlShutdown()
    return "ok", "nvml", f"{count} GPU(s) {', '.join(sorted(map(str, names)))}; driver {driver}"


def check_sglang() -> Check:
    if importlib.util.find_spec("sglang") is None:
        return "warn", "sglang", "not installed (install the `sglang` extra on GPU nodes)"
    return "ok", "sglang", importlib.metadata.version("sglang")


def check_runs(cfg: RunSettings) -> Check:
    root = cfg.runs_root
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=root, prefix=".doctor-"):
            pass
    except OSError as exc:
        return "FAIL", "runs", f"{root} is not writable: {exc.strerror}"
    free_gb = shutil.disk_usage(root).free / 1e9
    status = "ok" if free_gb >= 1.0 else "warn"
    return status, "runs", f"{root} writable, {free_gb:.1f} GB free"


def run(cfg: RunSettings, *, emit: Callable[[str], None] = print) -> int:
    seen: dict = {}
    checks: list[Check] = [check_git(), check_runs(cfg), check_ray(seen=seen),
                           check_ray_gpus(seen), check_nvml(), check_sglang()]
    for status, name, detail in checks:
        emit(f"{status:>4}  {name:<7} {detail}")
    return 1 if any(status == "FAIL" for status, _, _ in checks) else 0
