"""Is a cached overlay still what pip installed? Checked each time one is reused.

An overlay lives in a cache shared by runs and nodes, for weeks: a disk error, a cleanup
script, a person "fixing" a module by hand, another tool writing into it. A damaged overlay
that is reused measures something other than the pin: with its `*.dist-info` gone the server
imports the node's own version (every trial `env_mismatch`, pointing nowhere); with its code
swapped the run measures the swapped code under the pin's name and says exit 0.

The reference for "intact" is the wheel's own `RECORD` (PEP 376/627): every installed file
with its sha256 and size. Hashing every file of every overlay on every trial would cost
seconds for a large wheel, so reuse compares a cheap **signature** first: each file's path,
size, modification and change times and inode. The change time (`st_ctime`) cannot be set
from user space: an edit, a copy over, a rename or a `touch -r` that restores the mtime all
move it. Only when the signature differs is the full RECORD check run; an overlay that passes
it gets the new signature (a cache copied elsewhere, a `.pyc` Python added), one that fails is
rebuilt.

Pure file reading; no pip, no locks (the cache takes those).
"""

from __future__ import annotations

import base64
import csv
import hashlib
import os
from pathlib import Path

from orchestrator.util.pins import canonical


def _files(root: Path) -> list[str]:
    """Every regular file under `root`, as sorted paths relative to it (links not followed)."""
    out = []
    for directory, subdirs, files in os.walk(root):
        subdirs.sort()
        rel = os.path.relpath(directory, root)
        for f in files:
            out.append(f if rel == "." else os.path.join(rel, f))
    return sorted(out)


def signature(root: Path) -> str:
    """A hash of each file's path, size, mtime, ctime and inode: cheap (one `stat` a file),
    and changed by any edit, copy, rename or added/removed file."""
    digest = hashlib.sha256()
    for rel in _files(root):
        try:
            st = os.lstat(root / rel)
        except OSError:
            continue
        digest.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0"
                      f"{st.st_ino}\n".encode())
    return digest.hexdigest()


def _dist_info(root: Path, name: str) -> Path | None:
    for info in sorted(root.glob("*.dist-info")):
        try:
            text = (info / "METADATA").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            if not line.strip():
                break
            key, _, value = line.partition(":")
            if key.strip() == "Name" and canonical(value.strip()) == name:
                return info
    return None


def _hash_b64(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()


def _unexpected(rel: str) -> bool:
    """A file RECORD does not list that counts as damage: anything but bytecode Python may
    write itself, and scripts pip puts in `bin/` (RECORD names them outside the overlay)."""
    parts = rel.split(os.sep)
    return not ((len(parts) > 1 and parts[-2] == "__pycache__" and rel.endswith(".pyc"))
                or parts[0] == "bin")


def check(root: Path, name: str) -> str:
    """Why the overlay at `root` is not the distribution `name` pip installed there (one
    line), or "" when every file RECORD lists is there with its hash and size, and nothing
    else is."""
    info = _dist_info(root, name)
    if info is None:
        return f"no {name} *.dist-info in it"
    record = info / "RECORD"
    try:
        rows = list(csv.reader(record.read_text(errors="replace").splitlines()))
    except OSError:
        return f"{info.name}/RECORD is missing"
    listed: set[str] = set()
    top = os.path.realpath(root)
    for row in rows:
        if not row or not row[0]:
            continue
        rel = os.path.normpath(row[0])
        full = os.path.realpath(os.path.join(root, rel))
        if full != top and not full.startswith(top + os.sep):
            continue  # a script pip placed beside the library directory
        listed.add(os.path.relpath(full, top))
        digest = row[1] if len(row) > 1 else ""
        if not digest:
            continue  # RECORD itself, bytecode: no hash to hold them to
        algorithm, _, expected = digest.partition("=")
        if algorithm != "sha256":
            continue
        path = Path(full)
        try:
            size = path.stat().st_size
        except OSError:
            return f"{rel} is missing"
        if len(row) > 2 and row[2].isdigit() and int(row[2]) != size:
            return f"{rel} is {size} bytes, RECORD says {row[2]}"
        if _hash_b64(path) != expected:
            return f"{rel} does not match its RECORD hash"
    for rel in _files(root):
        if rel not in listed and _unexpected(rel):
            return f"{rel} is not one of the files pip installed"
    return ""
