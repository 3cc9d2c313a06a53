"""Cross-process locks and names for the worktree cache.

Two Ray actors on one machine may ask for the same commit at the same moment. An advisory
`flock` on a per-worktree lock file serialises them, works between processes and between
threads (each `open` is its own lock owner), and is released by the kernel if a process dies
while holding it, so a crashed trial can never wedge the cache.

Lock files are removed by the holder of an exclusive lock when it is done, so the cache holds
no lock file nobody uses. That is safe because every taker checks, once it holds the lock, that
the path still names the file it locked; if the file was removed meanwhile it starts over on
the new one, so two holders can never sit on two different files of the same name.

Each worktree has two locks: `<key>.lock` (exclusive, while it is built or removed) and
`<key>.use` (shared, for as long as a trial runs in it), so the cache's size cap can remove the
least recently used worktrees without ever removing one a server is running from.
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
# Private bare repositories, one per user repository, whose objects come from the user's
# through `objects/info/alternates`: the worktrees are registered there, never in the user's.
MIRRORS_DIRNAME = ".repos"

# A full SHA-1 or SHA-256 commit id, optionally followed by 16 hex digits of patch-set hash.
_KEY = re.compile(r"(?:[0-9a-f]{40}|[0-9a-f]{64})(?:-[0-9a-f]{16})?")


def acquire(lock_path: Path, mode: int, *, blocking: bool = True) -> int | None:
    """A descriptor holding `flock(mode)` on the file `lock_path` names now (created if
    missing), or None when `blocking` is off and someone else holds a conflicting lock."""
    while True:
        lock_path.parent.mkdir(parents=True, exist_ok=True)
        try:
            descriptor = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        except FileNotFoundError:  # the directory was removed between mkdir and open
            continue
        try:
            fcntl.flock(descriptor, mode | (0 if blocking else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(descriptor)
            return None
        except BaseException:
            os.close(descriptor)
            raise
        try:
            same = os.stat(lock_path).st_ino == os.fstat(descriptor).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return descriptor
        os.close(descriptor)  # removed by its last holder while we waited: take the new one


def release(descriptor: int, lock_path: Path | None = None) -> None:
    """Drop a lock; with `lock_path` (exclusive holders only) remove the file first."""
    try:
        if lock_path is not None:
            lock_path.unlink(missing_ok=True)
    finally:
        os.close(descriptor)  # closing the descriptor releases the flock


@contextmanager
def exclusive_lock(lock_path: Path, *, remove: bool = True) -> Iterator[None]:
    """Hold an exclusive `flock` on `lock_path` for the `with` body; the file is removed
    afterwards unless `remove` is off (see the module docstring for why that is safe)."""
    descriptor = acquire(lock_path, fcntl.LOCK_EX)
    assert descriptor is not None
    try:
        yield
    finally:
        release(descriptor, lock_path if remove else None)


def shared_lock(lock_path: Path) -> int:
    """A descriptor holding a shared lock (a worktree in use); `release` it when done."""
    descriptor = acquire(lock_path, fcntl.LOCK_SH)
    assert descriptor is not None
    return descriptor


def try_exclusive(lock_path: Path) -> int | None:
    """An exclusive lock if nobody holds the file, else None (never waits)."""
    return acquire(lock_path, fcntl.LOCK_EX, blocking=False)


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
