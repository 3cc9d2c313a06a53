"""Build the folder of pure-Python packages the device check carries to the GPU machine.

    .venv/bin/python experiments/gpu_carry.py [--dest build/gpu-carry]

The GPU machine has PyTorch, nvidia-ml-py, numpy, scipy, matplotlib, httpx, rich and pyyaml but
no package registry: what sleuth needs beyond that is copied here from this environment's
installed distributions (their files and their `.dist-info`, so `importlib.metadata` still
names their versions in a fingerprint) and put first on PYTHONPATH there. Ray (about 200 MB)
and Optuna are not carried: the check runs trials in-process and runs no sweep.

Every carried file must be pure Python (a compiled extension built for this machine's Python
could not be trusted on another one); the folder, with the working tree, must stay under the
64 MiB that one call may carry. `MANIFEST.json` in the folder lists each distribution's
version and size, and the totals (docs/gpu.md shows the table).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_DEST = ROOT / "build" / "gpu-carry"
# What the trial path, the bisect command and its configuration import that the image lacks.
CARRIED = ("omegaconf", "hydra-core", "antlr4-python3-runtime", "GitPython", "gitdb", "smmap",
           "prometheus-client")
LIMIT_BYTES = 64 << 20
COMPILED = (".so", ".pyd", ".dylib")


class CarryError(Exception):
    pass


def _files(dist: importlib.metadata.Distribution) -> list[tuple[Path, Path]]:
    """(source, path relative to site-packages) of a distribution's importable files."""
    out = []
    for f in dist.files or []:
        rel = Path(str(f))
        if rel.parts[0] == ".." or "__pycache__" in rel.parts or rel.suffix == ".pyc":
            continue  # console scripts outside site-packages; bytecode is rebuilt there
        src = Path(str(dist.locate_file(f)))
        if src.is_file():
            out.append((src, rel))
    return out


def build(dest: Path = DEFAULT_DEST, names: tuple[str, ...] = CARRIED) -> dict:
    """Copy `names` into `dest` (replacing it); the manifest written beside them."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    dists = []
    for name in names:
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            raise CarryError(f"{name} is not installed in {sys.prefix}: nothing to carry") from None
        files = _files(dist)
        compiled = [str(rel) for _, rel in files if rel.suffix in COMPILED]
        if compiled:
            raise CarryError(f"{name} is not pure Python ({compiled[0]}): it cannot be carried")
        size = 0
        for src, rel in files:
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dest / rel)
            size += src.stat().st_size
        dists.append({"name": name, "version": dist.version, "files": len(files), "bytes": size})
    carried = sum(d["bytes"] for d in dists)
    tree = working_tree_bytes()
    doc = {"distributions": dists, "carried_bytes": carried, "working_tree_bytes": tree,
           "total_bytes": carried + tree, "limit_bytes": LIMIT_BYTES}
    (dest / "MANIFEST.json").write_text(json.dumps(doc, indent=1) + "\n")
    if carried + tree >= LIMIT_BYTES:
        raise CarryError(f"carried {carried} + working tree {tree} bytes exceed the"
                         f" {LIMIT_BYTES >> 20} MiB one call may carry")
    return doc


def working_tree_bytes(root: Path = ROOT) -> int:
    """The tracked and untracked-but-not-ignored files, as the call copies them."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                            cwd=root, capture_output=True, check=True).stdout
    return sum((root / p).stat().st_size for p in listed.decode().split("\0")
               if p and (root / p).is_file())


def table(doc: dict) -> str:
    mib = 1 << 20
    lines = [f"{'distribution':<24} {'version':<9} {'files':>5} {'MiB':>6}"]
    for d in doc["distributions"]:
        lines.append(f"{d['name']:<24} {d['version']:<9} {d['files']:>5} {d['bytes'] / mib:>6.2f}")
    lines.append(f"{'carried':<40} {doc['carried_bytes'] / mib:>6.2f}")
    lines.append(f"{'working tree':<40} {doc['working_tree_bytes'] / mib:>6.2f}")
    lines.append(f"{'total (limit 64)':<40} {doc['total_bytes'] / mib:>6.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dest", default=str(DEFAULT_DEST), help="folder to (re)build")
    a = p.parse_args(argv)
    try:
        doc = build(Path(a.dest))
    except CarryError as exc:
        print(f"gpu_carry: {exc}", file=sys.stderr)
        return 1
    print(table(doc))
    print(f"built {a.dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
