"""Has anything touched this worktree since it was verified? Answered from `lstat`, not git.

Verifying a cached worktree before a trial (`Workspace._is_intact`: its top level, its HEAD,
`git diff HEAD` against the recorded hash) takes three git processes, and the fingerprint's
dirty-diff hash a fourth: most of a fast bench's per-trial cost. A node reuses the same worktree
trial after trial, and between two of them only that node's trials run in it, though a trial's
bench or build may write there. So after a full verification the workspace keeps a
:class:`Snapshot`: the `lstat` of every tracked file and of git's records for the worktree (its
`.git` link, HEAD, index and config) plus the identity of the worktree and of its state file.
An unchanged snapshot proves the worktree is as verified; any difference sends it back to git.
The snapshot is also written beside the worktree's state (`.state/<key>.verified.json`), so a
later node or run that finds the worktree untouched does not ask git either: the stat data
says the same thing whoever took it.

Why stat data is enough: any write, truncation, chmod, rename over or replacement of a file
changes its ctime (which no process can set back) or its inode, and adding or removing a
tracked file goes through the index. What it cannot see is a write in the same timestamp tick
as the verification itself (git calls such entries "racy"), so a snapshot in which any entry
was changed at or after the moment it was taken (the `stamp`, read back from a file written on
the same filesystem just before) is not kept. A tree too large to stat faster than git does it
(`MAX_FILES`) is not kept either.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

# Beyond this many tracked files, `lstat` from Python is no cheaper than `git diff` (which
# reads the index's stat cache in C): such worktrees are verified by git every time.
MAX_FILES = 20_000

Stat = tuple[int, int, int, int, int, int] | None


def stat_of(path: str | Path) -> Stat:
    """(device, inode, mode, size, mtime, ctime) of `path` itself (links not followed)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def identity(path: str | Path) -> tuple[int, int] | None:
    """(device, inode): the same file, whatever its timestamps (a state file is touched on
    every use, which must not count as a change)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_dev, st.st_ino)


def git_records(worktree: Path) -> list[Path]:
    """The files git reads to answer for this worktree: its `.git` link, and in the gitdir it
    names its HEAD and index, and the repository's config (diff settings)."""
    link = worktree / ".git"
    records = [link]
    try:
        text = link.read_text().strip()
    except OSError:
        return records
    if text.startswith("gitdir: "):
        gitdir = Path(text[len("gitdir: "):])
        records += [gitdir / "HEAD", gitdir / "index", gitdir.parent.parent / "config"]
    return records


@dataclass(frozen=True)
class Snapshot:
    """What a verified worktree looked like, and the dirty-diff hash git found for it."""

    worktree: Path
    files: tuple[bytes, ...]  # tracked paths, relative, as `git ls-files -z` lists them
    stats: tuple[Stat, ...]
    # Identities of the worktree directory (rebuilt = another inode; its timestamps change
    # with untracked files, which do not count) and of the cache's state file for it.
    identities: tuple[tuple[int, int] | None, ...]
    diff_hash: str | None

    @classmethod
    def take(cls, worktree: Path, files: Sequence[bytes], state_file: Path,
             diff_hash: str | None = None) -> Snapshot:
        return cls(worktree, tuple(files), _stats(worktree, files),
                   _identities(worktree, state_file), diff_hash)

    def racy(self, stamp_ns: int) -> bool:
        """True when an entry changed at or after `stamp_ns` (or is missing): a later write in
        the same tick would not show, so this snapshot must not be trusted."""
        if None in self.identities:
            return True
        for st in self.stats:
            if st is None or st[4] >= stamp_ns or st[5] >= stamp_ns:
                return True
        return False

    def to_json(self) -> dict:
        return {"worktree": str(self.worktree),
                "files": [os.fsdecode(f) for f in self.files],
                "stats": [list(st) if st is not None else None for st in self.stats],
                "identities": [list(i) if i is not None else None for i in self.identities],
                "diff_hash": self.diff_hash}

    @classmethod
    def from_json(cls, doc: dict) -> Snapshot:
        """The snapshot a verification wrote down; ValueError (or KeyError / TypeError) if the
        document is not one."""
        def opt(value, n):
            if value is None:
                return None
            if not isinstance(value, list) or len(value) != n:
                raise ValueError("malformed snapshot entry")
            return tuple(int(x) for x in value)

        diff_hash = doc["diff_hash"]
        if diff_hash is not None and not isinstance(diff_hash, str):
            raise ValueError("malformed snapshot diff hash")
        return cls(Path(doc["worktree"]), tuple(os.fsencode(f) for f in doc["files"]),
                   tuple(opt(st, 6) for st in doc["stats"]),
                   tuple(opt(i, 2) for i in doc["identities"]), diff_hash)

    def unchanged(self, state_file: Path) -> bool:
        """The worktree is exactly as when this was taken (no git call)."""
        return (_identities(self.worktree, state_file) == self.identities
                and _stats(self.worktree, self.files) == self.stats)


def _identities(worktree: Path, state_file: Path) -> tuple[tuple[int, int] | None, ...]:
    return (identity(worktree), identity(state_file))


def _stats(worktree: Path, files: Sequence[bytes]) -> tuple[Stat, ...]:
    root = os.fsencode(worktree)
    tracked = [stat_of(os.path.join(root, rel)) for rel in files]
    return (*[stat_of(p) for p in git_records(worktree)], *tracked)
