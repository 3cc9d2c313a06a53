"""Cross-process locks and names for the worktree cache.

Two Ray actors on one machine may ask for the same commit at the same moment. An advisory
`flock` on a per-worktree lock file serialises them, works between processes and between
threads (each `open` is its own lock owner), and is released by the kernel if a process dies
while holding it, so a crashed trial can never wedge the cache.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

LOCKS_DIRNAME = ".locks"
STATE_DIRNAME = ".state"
TEMP_PREFIX = ".tmp-"

# A full SHA-1 or SHA-256 commit id, optionally followed by 16 hex digits of patch-set hash.
_KEY = re.compile(r"(?:[0-9a-f]{40}|[0-9a-f]{64})(?:-[0-9a-f]{16})?")


@contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` (created if missing) for the `with` body.

    Lock files are left in place on purpose: deleting one while another process waits on it
    would let a third process lock a fresh inode and run concurrently with the waiter.
    """
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)  # closing the descriptor releases the flock


def sha256_hex(content: bytes) -> str:
    return hashlib.sha256(content).hexdigest()


def worktree_key(sha: str, patch_hashes: Sequence[str]) -> str:
    """Directory name for a checkout of `sha` with patches applied in the given order.

    Named by content only (SHA and patch hashes), never by ref or file names, so a ref like
    `../../x` can never steer a path and the same patch under another name reuses the worktree.
    """
    if not patch_hashes:
        return sha
    patchset = sha256_hex("\n".join(patch_hashes).encode("ascii"))
    return f"{sha}-{patchset[:16]}"


def key_of_entry(name: str) -> str | None:
    """The worktree key a cache entry belongs to (final or temporary dir), or None.

    Only names checkout() itself creates qualify, so pruning a cache dir that was pointed at
    a directory with other content never deletes anything it did not make.
    """
    if name.startswith(TEMP_PREFIX):
        # .tmp-<key>-<pid>-<random>
        parts = name[len(TEMP_PREFIX) :].rsplit("-", 2)
        name = parts[0] if len(parts) == 3 else ""
    return name if _KEY.fullmatch(name) else None
