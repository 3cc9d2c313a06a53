"""The sim's installed packages: what it finds on its paths at start, as a real server would.

A simulated node's own site-packages is a JSON file (`<node state>/packages.json`, `name ->
version`, passed as `--sim-packages`). On top of it the sim reads real distribution metadata:

- **Python**: the first `*.dist-info` of a name in a `PYTHONPATH` directory wins over the
  node's file, as `sys.path` order does (only `PYTHONPATH`: sleuth's own environment is not
  the simulated node's);
- **NCCL** is a native library, and torch finds it with the dynamic linker, not with
  `sys.path`: the first `libnccl.so.2` in an `LD_LIBRARY_PATH` directory that belongs to an
  installed distribution (its `RECORD` lists the file: an `nvidia-nccl-cu12` wheel) decides the
  NCCL version; without one, the node's `nvidia-nccl-cu12` (what torch's RUNPATH finds in the
  node's site-packages); without that, the GPU state's system NCCL. A wheel only on
  `PYTHONPATH` therefore does not change NCCL, as on a real node.

The performance model takes the NCCL version from here (`comm.nccl_version_factor`), and the
server reports what it found at `GET /sim/packages`, so a trial can check that an overlay took
effect. Stdlib only.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

NCCL_DISTRIBUTIONS = ("nvidia-nccl-cu12", "nvidia-nccl-cu13")
NCCL_LIBRARY = "libnccl.so.2"
NODE = "node"  # location of a package from the node's own file


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", str(name)).lower()


@dataclass(frozen=True)
class Found:
    version: str
    location: str  # the directory holding its dist-info, or NODE


@dataclass(frozen=True)
class SimPackages:
    """What the server found: its packages, the NCCL library it loads, the NCCL version."""

    packages: Mapping[str, Found] = field(default_factory=dict)
    libraries: Mapping[str, list[str]] = field(default_factory=dict)
    nccl_version: str | None = None  # None: the GPU state's system NCCL

    def report(self) -> dict:
        return {"source": "sim", "nccl_version": self.nccl_version,
                "packages": {n: {"version": f.version, "location": f.location, "modules": {}}
                             for n, f in sorted(self.packages.items())},
                "libraries": {k: list(v) for k, v in self.libraries.items()}}


def _metadata(info: Path) -> tuple[str, str] | None:
    try:
        text = (info / "METADATA").read_text(errors="replace")
    except OSError:
        return None
    fields = {}
    for line in text.splitlines():
        if not line.strip():
            break
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    if not fields.get("Name") or not fields.get("Version"):
        return None
    return canonical(fields["Name"]), fields["Version"]


def distributions(directory: str) -> dict[str, Found]:
    out: dict[str, Found] = {}
    try:
        infos = sorted(Path(directory).glob("*.dist-info"))
    except OSError:
        return out
    for info in infos:
        meta = _metadata(info)
        if meta is not None:
            out.setdefault(meta[0], Found(meta[1], str(Path(directory))))
    return out


def _owner(library: Path, levels: int = 5) -> tuple[str, str, str] | None:
    """(name, version, location) of the distribution whose RECORD lists `library`."""
    for parent in list(library.parents)[:levels]:
        rel = str(library.relative_to(parent))
        for info in sorted(parent.glob("*.dist-info")):
            try:
                record = (info / "RECORD").read_text(errors="replace")
            except OSError:
                continue
            if any(line.split(",", 1)[0] == rel for line in record.splitlines()):
                meta = _metadata(info)
                if meta is not None:
                    return meta[0], meta[1], str(parent)
    return None


def _split(value: str | None) -> list[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def find(env: Mapping[str, str], node: Mapping[str, str] | None = None) -> SimPackages:
    """The packages a server started with `env` finds, over the node's own `node`."""
    found: dict[str, Found] = {}
    for directory in _split(env.get("PYTHONPATH")):
        for name, dist in distributions(directory).items():
            found.setdefault(name, dist)
    node_pkgs = {canonical(k): str(v) for k, v in (node or {}).items()}
    for name, version in node_pkgs.items():
        found.setdefault(name, Found(version, NODE))
    libraries: dict[str, list[str]] = {}
    nccl: str | None = None
    for directory in _split(env.get("LD_LIBRARY_PATH")):
        lib = Path(directory) / NCCL_LIBRARY
        owner = _owner(lib) if lib.is_file() else None
        if owner is not None:
            name, nccl, location = owner
            libraries[NCCL_LIBRARY] = [str(lib)]
            found[name] = Found(nccl, location)  # what the server loaded is what it runs
            break
    else:
        for name in NCCL_DISTRIBUTIONS:
            if name in node_pkgs:
                nccl = node_pkgs[name]
                found[name] = Found(nccl, NODE)  # a PYTHONPATH copy does not load
                break
    return SimPackages(found, libraries, nccl)


def load_node_file(path: str | None) -> dict[str, str]:
    """The node's own packages (`{name: version}` JSON); empty without a file."""
    if not path:
        return {}
    doc = json.loads(Path(path).read_text())
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object of package versions")
    return {str(k): str(v) for k, v in doc.items()}


def nccl_of(packages: Mapping[str, str], fallback: str) -> str:
    """The NCCL version a node with installed `packages` runs (no LD_LIBRARY_PATH override)."""
    pkgs = {canonical(k): v for k, v in packages.items()}
    return next((pkgs[n] for n in NCCL_DISTRIBUTIONS if n in pkgs), fallback)
