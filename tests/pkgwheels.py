"""Wheels built in the test with `pip wheel`, offline: a minimal `pyproject.toml` whose build
backend lives in the project itself (`backend-path`), so no build requirement is downloaded
and none has to be installed (`--no-index --no-build-isolation`)."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

PYPROJECT = """\
[build-system]
requires = []
build-backend = "backend"
backend-path = ["."]
"""
# The whole build backend: PEP 517's one required hook, writing the wheel from `wheel.json`.
BACKEND = """\
import json, pathlib
from orchestrator.packages.wheels import write_wheel


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    spec = json.loads(pathlib.Path("wheel.json").read_text())
    return write_wheel(pathlib.Path(wheel_directory), spec["name"], spec["version"],
                       spec["files"]).name
"""


def pip_wheel(work: Path, out: Path, name: str, version: str, files: Mapping[str, str]) -> Path:
    """Build `name==version` holding `files` into `out` with pip; the wheel's path."""
    project = work / f"{name}-{version}"
    project.mkdir(parents=True)
    (project / "pyproject.toml").write_text(PYPROJECT)
    (project / "backend.py").write_text(BACKEND)
    (project / "wheel.json").write_text(json.dumps({"name": name, "version": version,
                                                    "files": dict(files)}))
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-index",
                           "--no-build-isolation", "--no-deps", "--disable-pip-version-check",
                           "-w", str(out), str(project)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    wheels = sorted(out.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    assert wheels, done.stdout
    return wheels[0]


SLOW_INIT = "import time\ntime.sleep(0.08)\n__version__ = '2.0'\n"


def build_test_wheels(base: Path) -> Path:
    """The tests' wheel directory: `slowimp` 1.0 and 2.0 (80 ms longer to import), built with
    pip, and a simulated node's NCCL 2.27.5 wheel."""
    from orchestrator.packages.wheels import write_wheel
    from orchestrator.sim_scenarios.side_files import wheel_files

    out = base / "dist"
    pip_wheel(base / "src", out, "slowimp", "1.0", {"slowimp/__init__.py": "__version__ = '1.0'\n"})
    pip_wheel(base / "src", out, "slowimp", "2.0", {"slowimp/__init__.py": SLOW_INIT})
    write_wheel(out, "nvidia-nccl-cu12", "2.27.5", wheel_files("nvidia-nccl-cu12", "2.27.5"))
    return out


def release_line(out: Path, name: str, delays_ms: Mapping[str, float],
                 broken: tuple[str, ...] = ()) -> Path:
    """A wheel directory holding one wheel per release of `name`, each taking its
    `delays_ms[version]` to import (a release line with planted slow ones). A `broken` release
    exists only as a wheel for another interpreter (CPython 2.7, win32): listed by the
    directory, installable by no pip here."""
    from orchestrator.packages.wheels import write_wheel

    for version, ms in delays_ms.items():
        init = f"import time\ntime.sleep({ms / 1000!r})\n__version__ = {version!r}\n"
        path = write_wheel(out, name, version, {f"{name}/__init__.py": init})
        if version in broken:
            path.rename(path.with_name(path.name.replace("py3-none-any", "cp27-cp27m-win32")))
    return out
