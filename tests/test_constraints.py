"""constraints.txt, the versions `make install` (and so `make demo`, `make test` and CI) takes:
every dependency pyproject.toml declares is pinned there, inside the range declared, and this
environment runs exactly those pins (so the suite that passes here tested them)."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    out = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        assert sep and version, f"constraints.txt: {line!r} is not name==version"
        out[canonicalize_name(name)] = version
    return out


def _declared() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"],
                                     *project["optional-dependencies"]["test"]]]


def test_every_declared_dependency_is_pinned_inside_its_declared_range():
    pins = _pins()
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is declared in pyproject.toml but not pinned"
        assert Version(pins[name]) in req.specifier, \
            f"constraints.txt pins {name}=={pins[name]}, outside pyproject's {req}"


def test_this_environment_is_the_pinned_one():
    wrong = []
    for name, version in _pins().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            wrong.append(f"{name}: not installed (pinned {version})")
            continue
        if Version(installed) != Version(version):
            wrong.append(f"{name}: {installed} installed, {version} pinned")
    assert not wrong, ("this environment is not the one constraints.txt pins (make install"
                       " installs it with -c constraints.txt): " + "; ".join(wrong))
