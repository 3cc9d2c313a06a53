"""The worktree cache's own bookkeeping: state files, the size cap, the private repository.

No git command runs here except `git init` for the private repository (its settings are written
by GitPython's config writer); `git.Workspace` owns the worktrees themselves and calls in for
the rest.

- State: `.state/<key>.json` says what an intact worktree is (its SHA, the hash of its applied
  diff, its size when made); its mtime is the worktree's last use. `.state/<key>.verified.json`
  is the snapshot of its last verification (`snapshot.py`).
- Size cap: past `max_bytes`, the least recently used worktrees go (never the one just made,
  never one a trial holds through its `.use` lock).
- The private repository `.repos/<name>-<id>.git`: a bare repository whose only content is one
  line of `objects/info/alternates` naming the user's object store. Worktrees are registered
  there, so the user's repository is read and never written.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
from collections.abc import Callable
from pathlib import Path

import git

from orchestrator.util import wallclock
from orchestrator.util.files import write_atomic
from orchestrator.workspace.locking import (
    LOCKS_DIRNAME,
    MIRRORS_DIRNAME,
    STATE_DIRNAME,
    TEMP_PREFIX,
    exclusive_lock,
    key_of_entry,
    release,
    sha256_hex,
    try_exclusive,
)
from orchestrator.workspace.snapshot import Snapshot


class WorktreeCache:
    def __init__(self, root: Path, max_bytes: int | None = None):
        self.root = root
        self.max_bytes = max_bytes

    def lock_path(self, key: str) -> Path:
        """Exclusive while the worktree is built or removed."""
        return self.root / LOCKS_DIRNAME / f"{key}.lock"

    def use_path(self, key: str) -> Path:
        """Shared while a trial runs from the worktree."""
        return self.root / LOCKS_DIRNAME / f"{key}.use"

    def state_path(self, key: str) -> Path:
        return self.root / STATE_DIRNAME / f"{key}.json"

    def snapshot_path(self, key: str) -> Path:
        return self.root / STATE_DIRNAME / f"{key}.verified.json"

    def read_snapshot(self, key: str) -> Snapshot | None:
        """The snapshot of the worktree's last verification (`snapshot.py`), if one is kept."""
        try:
            return Snapshot.from_json(json.loads(self.snapshot_path(key).read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write_snapshot(self, key: str, snap: Snapshot) -> None:
        """Keep a verification's snapshot, atomically; best effort (a full disk or a read-only
        cache only means the next verification asks git)."""
        try:
            write_atomic(self.snapshot_path(key), json.dumps(snap.to_json()))
        except OSError:
            pass

    def forget_snapshot(self, key: str) -> None:
        try:
            self.snapshot_path(key).unlink(missing_ok=True)
        except OSError:
            pass

    def read_state(self, key: str) -> dict | None:
        try:
            doc = json.loads(self.state_path(key).read_text())
        except (OSError, ValueError):
            return None
        return doc if isinstance(doc, dict) else None

    def write_state(self, key: str, sha: str, diff_hash: str | None, size: int) -> None:
        """Record what an intact worktree looks like, atomically (temp file + rename)."""
        state_path = self.state_path(key)
        state_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(state_path, json.dumps({"sha": sha, "diff_hash": diff_hash,
                                             "size_bytes": size, "made_at": wallclock.now()}))

    def stamp(self, key: str) -> int | None:
        """Mark the worktree used now and return "now" in this filesystem's own clock (the
        state file's new mtime, ns): what a snapshot of the worktree is compared with."""
        path = self.state_path(key)
        try:
            os.utime(path)
            return os.stat(path).st_mtime_ns
        except OSError:
            return None

    def touch(self, key: str) -> None:
        """Mark a worktree used now (the size cap removes the least recently used first)."""
        try:
            os.utime(self.state_path(key))
        except OSError:
            pass

    def entries(self) -> list[tuple[float, str, int]]:
        """(last use, key, bytes) of every finished worktree in the cache."""
        out: list[tuple[float, str, int]] = []
        if not self.root.is_dir():
            return out
        for entry in self.root.iterdir():
            key = key_of_entry(entry.name)
            if key is None or entry.name != key:  # temporary entries are someone's build
                continue
            try:
                used = self.state_path(key).stat().st_mtime
            except OSError:
                used = 0.0
            size = int((self.read_state(key) or {}).get("size_bytes") or 0)
            out.append((used, key, size or disk_usage(entry)))
        return out

    def usage(self) -> int:
        return sum(size for _, _, size in self.entries())

    def evict(self, keep: str, remove: Callable[[str], None]) -> None:
        """Remove least recently used worktrees (`remove(key)`) until the cache fits."""
        if self.max_bytes is None:
            return
        entries = sorted(self.entries())
        total = sum(size for _, _, size in entries)
        for _, key, size in entries:
            if total <= self.max_bytes:
                break
            if key == keep:
                continue
            use = try_exclusive(self.use_path(key))
            if use is None:
                continue  # a trial runs from it
            try:
                with exclusive_lock(self.lock_path(key)):
                    remove(key)
                    self.forget_snapshot(key)
                    self.state_path(key).unlink(missing_ok=True)
            finally:
                release(use, self.use_path(key))
            total -= size

    # -- the private repository ----------------------------------------------------------------
    def mirror_path(self, objects_dir: Path, repo_name: str) -> Path:
        key = sha256_hex(str(objects_dir).encode())[:16]
        return self.root / MIRRORS_DIRNAME / f"{repo_name[:40]}-{key}.git"

    def ensure_mirror(self, path: Path, objects_dir: Path, object_format: Callable[[], str]
                      ) -> Path:
        """The private repository at `path`, made once (under a lock, built aside and moved
        into place, so a crash never leaves half of one)."""
        alternates = path / "objects" / "info" / "alternates"
        if alternates.is_file():
            return path
        with exclusive_lock(self.root / LOCKS_DIRNAME / f"{path.name}.lock"):
            if alternates.is_file():
                return path
            temp = path.with_name(f"{TEMP_PREFIX}{path.name}-{secrets.token_hex(4)}")
            try:
                # `git init` in `temp` (made here), then its own config through GitPython's
                # config writer (the file is written when the block ends).
                mirror = git.Repo.init(temp, bare=True, quiet=True,
                                       object_format=object_format())
                with mirror.config_writer() as config:
                    # Never gc here (the objects are borrowed) and never run a hook.
                    config.set_value("gc", "auto", 0)
                    config.set_value("core", "hooksPath", os.devnull)
                mirror.close()
                (temp / "objects" / "info").mkdir(parents=True, exist_ok=True)
                (temp / "objects" / "info" / "alternates").write_text(f"{objects_dir}\n")
                path.parent.mkdir(parents=True, exist_ok=True)
                shutil.rmtree(path, ignore_errors=True)  # a half-made one from a crash
                os.replace(temp, path)
            except BaseException:
                shutil.rmtree(temp, ignore_errors=True)
                raise
        return path


def disk_usage(path: Path) -> int:
    """Bytes of disk the files under `path` take (what the cache cap counts)."""
    total = 0
    stack = [str(path)]
    while stack:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        else:
                            total += entry.stat(follow_symlinks=False).st_blocks * 512
                    except OSError:
                        continue
        except OSError:
            continue
    return total
