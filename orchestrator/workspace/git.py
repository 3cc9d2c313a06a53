"""The user's git repository as seen by the orchestrator: refs, commit ranges, checkouts.

Every trial runs from its own git worktree under a cache directory, keyed by commit SHA and the
hash of the applied patches, so trials never touch the user's working tree, index or HEAD and a
commit measured twice is checked out once. All git calls go through GitPython with argument
lists (never a shell), refs that look like options are refused before they reach git, and
commit text is only ever parsed, never executed.

Nothing is ever written into the user's repository: it is only read (refs, logs). The worktrees
belong to a private bare repository in the cache (`<cache>/.repos/<id>.git`) that borrows the
user's objects through `objects/info/alternates` (as `git clone --shared` does, without copying
refs), so `git worktree list` in the user's repository never changes and a read-only repository
bisects. Objects the worktrees make (a patch's blobs) go to the private repository.

The cache is bounded (`max_bytes`): each worktree's size is measured once when it is made, its
last use is the mtime of its state file, and after a new worktree the least recently used ones
go until the cache fits again; a worktree a trial is running from (`lease`) is never removed.

Size: the one class that talks to git (refs, ranges, worktrees and their verification);
the commit graph's ordering is `commits.py`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import git
from git.exc import GitCommandError, InvalidGitRepositoryError, NoSuchPathError

from orchestrator.errors import UserError
from orchestrator.util.safe_text import printable
from orchestrator.workspace.cache import WorktreeCache, disk_usage
from orchestrator.workspace.commits import LOG_OPTIONS, CommitInfo, parse_log, touches_paths
from orchestrator.workspace.locking import (
    TEMP_PREFIX,
    exclusive_lock,
    key_of_entry,
    release,
    sha256_hex,
    shared_lock,
    worktree_key,
)
from orchestrator.workspace.snapshot import MAX_FILES, Snapshot

# `git log --diff-merges=first-parent` (commits_between) arrived in git 2.31;
# `git rev-parse --end-of-options` (resolve) in 2.30 ("rev-parse: handle --end-of-options").
MIN_GIT_VERSION = (2, 31)

_FULL_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")

# Read-only commands must not rewrite the user's index as a side effect (`git status` refreshes
# it opportunistically otherwise).
_READ_ONLY_ENV = {"GIT_OPTIONAL_LOCKS": "0"}

# Checkouts are measured, so they must be exactly the commit: a user's post-checkout hook that
# rewrites files (or is slow) must not run when a worktree is created.
_NO_HOOKS_ENV = {
    "GIT_CONFIG_COUNT": "1",
    "GIT_CONFIG_KEY_0": "core.hooksPath",
    "GIT_CONFIG_VALUE_0": os.devnull,
}

# Options that make `git diff` output depend on content only, not on the user's diff config.
_STABLE_DIFF_OPTIONS = (
    "--binary",
    "--no-color",
    "--no-ext-diff",
    "--no-textconv",
    "--no-renames",
    "--src-prefix=a/",
    "--dst-prefix=b/",
)


def _first_line(error: GitCommandError) -> str:
    stderr = error.stderr if isinstance(error.stderr, str) else str(error.stderr or "")
    for line in stderr.replace("stderr:", "").splitlines():
        line = line.strip().strip("'").strip()
        if line:
            return line
    return f"git exited with status {error.status}"


class Workspace:
    """One user repository plus the cache directory that holds its trial worktrees."""

    def __init__(self, repo: Path | str, cache_dir: Path | str,
                 max_bytes: int | None = None) -> None:
        repo_path = Path(repo).expanduser()
        try:
            self._repo = git.Repo(repo_path)
        except NoSuchPathError:
            raise UserError(f"repository path {repo_path} does not exist") from None
        except InvalidGitRepositoryError:
            raise UserError(
                f"{repo_path} is not a git repository (give the top level of a git checkout)"
            ) from None
        version = self._repo.git.version_info[:2]
        if version < MIN_GIT_VERSION:
            needed = ".".join(map(str, MIN_GIT_VERSION))
            found = ".".join(map(str, version))
            raise UserError(f"git {needed} or newer is required, found git {found}")
        self.repo_path = Path(self._repo.working_tree_dir or self._repo.git_dir).resolve()
        # Created lazily by checkout(): a Workspace that is only asked about refs (or fails
        # validation) leaves nothing behind.
        self.cache_dir = Path(cache_dir).expanduser().resolve()
        self.max_bytes = max_bytes
        self.cache = WorktreeCache(self.cache_dir, max_bytes)
        self._mirror_repo: git.Repo | None = None
        self._mirror_at: Path | None = None
        # Worktrees this workspace verified, as they were then (see `snapshot.py`), and full
        # SHAs it has resolved (a commit id names the same commit forever): a node that keeps
        # its Workspace does not ask git again about what nothing has changed since.
        self._verified: dict[str, Snapshot] = {}
        self._resolved: dict[str, str] = {}

    # ----------------------------------------------------------------- refs and ranges

    def resolve(self, ref: str) -> str:
        """Full SHA of the commit `ref` names (branch, tag, short SHA, `HEAD~3`, ...)."""
        if not isinstance(ref, str) or not ref.strip():
            raise UserError(f"a git ref must be a non-empty string, got {ref!r}")
        if ref.startswith("-") or any(char in ref for char in "\0\r\n"):
            raise UserError(f"{ref!r} is not a valid git ref (refs may not start with '-')")
        if ref in self._resolved:
            return self._resolved[ref]
        try:
            out = self._repo.git.rev_parse(
                "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}"
            )
        except GitCommandError:
            raise UserError(
                f"unknown git ref {ref!r}: no such commit in {self.repo_path}"
            ) from None
        sha = out.strip()
        if not _FULL_SHA.fullmatch(sha):
            raise UserError(f"git ref {ref!r} does not name a single commit")
        if sha == ref:  # a branch or tag moves; a full commit id does not
            self._resolved[ref] = sha
        return sha

    def commits_between(
        self, good: str, bad: str, *, first_parent: bool = True
    ) -> list[CommitInfo]:
        """Commits from `good` to `bad`, both included, oldest first: the bisect range.

        With `first_parent` the range follows the mainline (a merged branch is one step, its
        files relative to the mainline parent), which is what a "which PR did it" bisect
        wants; without it every commit reachable from `bad` but not `good` is listed in
        topological order.
        """
        good_sha, bad_sha = self.resolve(good), self.resolve(bad)
        if good_sha == bad_sha:
            raise UserError(
                f"good {good!r} and bad {bad!r} are the same commit {good_sha[:12]}; "
                "give two different commits"
            )
        if not self._repo.is_ancestor(good_sha, bad_sha):
            raise UserError(
                f"good {good!r} is not an ancestor of bad {bad!r}, so there is no range to search"
            )
        walk = ["--topo-order", "--reverse"]
        if first_parent:
            walk.append("--first-parent")
        between = self._log(*walk, f"{good_sha}..{bad_sha}")
        if not between:
            raise UserError(f"no commits between good {good!r} and bad {bad!r}")
        if first_parent and between[0].parents[:1] != (good_sha,):
            merge = self._merge_bringing(good_sha, between)
            instead = (f"; the nearest first-parent commit that contains it is {merge.sha[:12]}"
                       f" ({merge.subject[:60]}): use good={merge.sha[:12]}, or"
                       if merge is not None else ";")
            raise UserError(
                f"good {good!r} is not on the first-parent history of bad {bad!r} "
                f"(it came in through a merge){instead} first_parent=false to search every"
                " commit of the range"
            )
        return [*self._log("--no-walk", good_sha), *between]

    def commit_infos(self, shas: Sequence[str]) -> list[CommitInfo]:
        """The records of these commits, in the order given (no history walk)."""
        return self._log("--no-walk=unsorted", *shas) if shas else []

    def _merge_bringing(self, good_sha: str, mainline: list[CommitInfo]) -> CommitInfo | None:
        """The first mainline commit that has `good` as an ancestor (the merge that brought it
        in); ancestry only grows along the first-parent chain, so a binary search finds it."""
        lo, hi = 0, len(mainline) - 1
        if not self._repo.is_ancestor(good_sha, mainline[hi].sha):
            return None
        while lo < hi:
            mid = (lo + hi) // 2
            if self._repo.is_ancestor(good_sha, mainline[mid].sha):
                hi = mid
            else:
                lo = mid + 1
        return mainline[lo]

    def commit_info(self, ref: str) -> CommitInfo:
        """One commit's record (subject, author, files), as `commits_between` lists it."""
        return self._log("--no-walk", self.resolve(ref))[0]

    def _log(self, *rev_args: str) -> list[CommitInfo]:
        raw = self._repo.git.log(
            *LOG_OPTIONS,
            *rev_args,
            stdout_as_string=False,
            strip_newline_in_stdout=False,
            env=_READ_ONLY_ENV,
        )
        # Subjects and author names are other people's text: no terminal escape may ride along
        # into the records, the reports or the terminal.
        return [dataclasses.replace(c, subject=printable(c.subject, newlines=False),
                                    author=printable(c.author, newlines=False))
                for c in parse_log(raw)]

    def touches(self, commit: CommitInfo, paths: Sequence[str]) -> bool:
        """True if `commit` changed any file under any of `paths` (dirs, files or globs)."""
        return touches_paths(commit.files, paths)

    # ----------------------------------------------------------------- checkouts

    def checkout(self, sha: str, patches: Sequence[Path | str] = ()) -> Path:
        """Path of a worktree at `sha` with `patches` applied in order, created if needed.

        Safe to call from several processes at once: a per-worktree lock serialises them, the
        worktree is built under a temporary name and moved into place only when complete, and
        a worktree that is found damaged (other HEAD, edited files) is rebuilt.
        """
        return self._checkout(*self._plan(sha, patches))

    @contextmanager
    def lease(self, sha: str, patches: Sequence[Path | str] = ()) -> Iterator[Path]:
        """`checkout`, held for the `with` body: the size cap never removes a worktree a trial
        is running from. Costs no git call beyond `checkout`'s (one lock file)."""
        plan = self._plan(sha, patches)
        use = shared_lock(self.cache.use_path(plan[2]))
        try:
            yield self._checkout(*plan)
        finally:
            release(use)

    def _plan(self, sha: str, patches: Sequence[Path | str]) -> tuple[str, list[Path], str]:
        patch_files = [self._patch_file(patch) for patch in patches]
        hashes = self.patch_hashes(patch_files)
        if _FULL_SHA.fullmatch(sha):
            # A commit id for which this cache built a worktree was resolved by git then (the
            # state records git's full SHA): no need to ask again on every trial.
            key = worktree_key(sha, hashes)
            if (self.cache.read_state(key) or {}).get("sha") == sha:
                return sha, patch_files, key
        full_sha = self.resolve(sha)
        return full_sha, patch_files, worktree_key(full_sha, hashes)

    def _checkout(self, full_sha: str, patch_files: list[Path], key: str) -> Path:
        final = self.cache_dir / key
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        with exclusive_lock(self.cache.lock_path(key)):
            if self._is_intact(final, full_sha, key):
                self.cache.touch(key)
                return final
            self.cache.forget_snapshot(key)
            self._remove_worktree(final)
            mirror = self._mirror()
            temp = self.cache_dir / f"{TEMP_PREFIX}{key}-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                mirror.git.worktree("add", "--detach", str(temp), full_sha, env=_NO_HOOKS_ENV)
                for patch_file in patch_files:
                    self._apply_patch(temp, patch_file, full_sha)
                self.cache.write_state(key, full_sha, self.dirty_diff_hash(temp), disk_usage(temp))
                mirror.git.worktree("move", str(temp), str(final))
            except BaseException:
                self._remove_worktree(temp)
                raise
        self.cache.evict(key, lambda k: self._remove_worktree(self.cache_dir / k))
        return final

    def check_patches(self, sha: str, patches: Sequence[Path | str]) -> list[Path]:
        """Refuse (UserError) patches that cannot be read or do not apply, in order, to `sha`;
        the resolved paths otherwise. Writes nothing: no cache, no worktree, no object.

        The series is applied with `git apply --cached` to a temporary index read from the
        commit's tree, with a temporary object directory that borrows the user's objects (a
        patch's new blobs go there): a refused patch leaves the cache and the repository as
        they were, and the line names the first patch that does not apply after the ones
        before it (`git apply --check` of several files checks each against the commit)."""
        files: list[Path] = []
        for patch in patches:
            path = self._patch_file(patch)
            try:
                text = path.read_bytes()
            except OSError as exc:
                raise UserError(f"cannot read patch file {patch}: {exc.strerror}") from None
            if not text.strip():
                raise UserError(f"patch file {patch} is empty")
            files.append(path)
        if not files:
            return files
        full_sha = self.resolve(sha)
        with tempfile.TemporaryDirectory(prefix="sleuth-patch-check-") as tmp:
            objects = Path(tmp) / "objects"
            objects.mkdir()
            env = {**_READ_ONLY_ENV, "GIT_INDEX_FILE": str(Path(tmp) / "index"),
                   "GIT_OBJECT_DIRECTORY": str(objects),
                   "GIT_ALTERNATE_OBJECT_DIRECTORIES": str(self._objects_dir())}
            self._repo.git.read_tree(full_sha, env=env)
            for path in files:
                try:
                    self._repo.git.apply("--cached", str(path), env=env)
                except GitCommandError as error:
                    raise UserError(f"patch {path} does not apply to commit {full_sha[:12]}"
                                    f" ({_first_line(error)})") from None
        return files

    def patch_hashes(self, patches: Sequence[Path | str]) -> list[str]:
        """sha256 of each patch file's content, in order: the patch part of a fingerprint."""
        return [sha256_hex(self._patch_file(patch).read_bytes()) for patch in patches]

    def dirty_diff_hash(self, path: Path | str) -> str | None:
        """sha256 of `git diff HEAD` in the checkout at `path`, or None if it has no changes.

        Staged and unstaged changes to tracked files count (patches are applied with `--index`,
        so files they add count too); untracked files such as build outputs do not.
        """
        runner = git.Git(str(path))
        try:
            diff = runner.diff(
                *_STABLE_DIFF_OPTIONS,
                "HEAD",
                stdout_as_string=False,
                env=_READ_ONLY_ENV,
            )
        except GitCommandError:
            raise UserError(f"{path} is not a git checkout with a commit checked out") from None
        return sha256_hex(diff) if diff else None

    def worktree_diff_hash(self, path: Path | str) -> str | None:
        """`dirty_diff_hash` of one of this cache's worktrees: what its verification found, with
        no git call, when nothing has touched it since (`snapshot.py`); git's answer otherwise
        (a build that wrote into it, a worktree this workspace did not verify)."""
        path = Path(path)
        known = self._verified.get(path.name)
        if known is not None and known.worktree == path and known.unchanged(
                self.cache.state_path(path.name)):
            return known.diff_hash
        return self.dirty_diff_hash(path)

    def prune(self) -> None:
        """Remove every worktree under the cache dir and let git forget stale worktrees."""
        if not self.cache_dir.is_dir():
            return
        keys = {key_of_entry(entry.name) for entry in self.cache_dir.iterdir()}
        for path in self._registered_worktrees():
            if path.parent == self.cache_dir:
                keys.add(key_of_entry(path.name))
        for key in sorted(k for k in keys if k):
            with exclusive_lock(self.cache.lock_path(key)):
                for entry in self.cache_dir.glob(f"{TEMP_PREFIX}{key}-*"):
                    self._remove_worktree(entry)
                self._remove_worktree(self.cache_dir / key)
                self.cache.forget_snapshot(key)
                self.cache.state_path(key).unlink(missing_ok=True)
        if self._mirror_path().is_dir():
            self._mirror().git.worktree("prune")

    # ----------------------------------------------------------------- the private repository

    def _objects_dir(self) -> Path:
        """The user's object store (shared by all their worktrees)."""
        return (Path(self._repo.common_dir) / "objects").resolve()

    def _mirror_path(self) -> Path:
        if self._mirror_at is None:
            self._mirror_at = self.cache.mirror_path(self._objects_dir(), self.repo_path.name)
        return self._mirror_at

    def _object_format(self) -> str:
        try:
            fmt = self._repo.git.rev_parse("--show-object-format", env=_READ_ONLY_ENV).strip()
        except GitCommandError:
            fmt = ""
        return fmt or "sha1"

    def _mirror(self) -> git.Repo:
        """The private bare repository the worktrees hang off (see `cache.py`)."""
        if self._mirror_repo is None:
            path = self.cache.ensure_mirror(self._mirror_path(), self._objects_dir(),
                                            self._object_format)
            self._mirror_repo = git.Repo(path)
        return self._mirror_repo

    # ----------------------------------------------------------------- internals

    def _patch_file(self, patch: Path | str) -> Path:
        path = Path(patch).expanduser().resolve()
        if not path.is_file():
            raise UserError(f"patch file {patch} does not exist")
        return path

    def _apply_patch(self, worktree: Path, patch_file: Path, sha: str) -> None:
        """Apply one patch inside `worktree` only: check first, so a failure changes nothing."""
        runner = git.Git(str(worktree))
        try:
            runner.apply("--check", "--index", str(patch_file))
            runner.apply("--index", str(patch_file))
        except GitCommandError as error:
            raise UserError(
                f"patch {patch_file} does not apply to commit {sha[:12]} ({_first_line(error)})"
            ) from None

    def _is_intact(self, path: Path, sha: str, key: str) -> bool:
        """A worktree may be reused only if it is exactly what checkout() would build.

        Git is asked (top level, HEAD, `git diff HEAD`) unless this workspace verified the
        worktree before and its snapshot shows nothing has touched it since."""
        state_file = self.cache.state_path(key)
        try:
            link = (path / ".git").read_text()
            state = json.loads(state_file.read_text())
        except (OSError, ValueError):
            return False
        # One made by an older sleuth hangs off the user's repository: rebuild it here.
        if not link.startswith(f"gitdir: {self._mirror_path()}{os.sep}"):
            return False
        known = self._verified.pop(key, None) or self.cache.read_snapshot(key)
        if (known is not None and known.worktree == path and state.get("sha") == sha
                and known.diff_hash == state.get("diff_hash") and known.unchanged(state_file)):
            self._verified[key] = known
            return True
        stamp = self.cache.stamp(key)  # before anything is looked at: see Snapshot.racy
        runner = git.Git(str(path))
        try:
            # Without this check a worktree whose .git link broke would make git look upwards
            # and report on whatever repository contains the cache dir.
            toplevel = runner.rev_parse("--show-toplevel", env=_READ_ONLY_ENV).strip()
            head = runner.rev_parse("--verify", "HEAD", env=_READ_ONLY_ENV).strip()
        except GitCommandError:
            return False
        if Path(toplevel).resolve() != path.resolve() or head != sha or state.get("sha") != sha:
            return False
        files = self._tracked_files(runner)
        snap = Snapshot.take(path, files or (), state_file)  # before git reads the files
        try:
            diff_hash = self.dirty_diff_hash(path)
        except UserError:
            return False
        if diff_hash != state.get("diff_hash"):
            return False
        if (files is not None and len(files) <= MAX_FILES and stamp is not None
                and not snap.racy(stamp)):
            snap = dataclasses.replace(snap, diff_hash=diff_hash)
            self._verified[key] = snap
            self.cache.write_snapshot(key, snap)
        return True

    @staticmethod
    def _tracked_files(runner: git.Git) -> list[bytes] | None:
        """The worktree's tracked paths (relative, raw bytes), or None if git cannot say."""
        try:
            out = runner.ls_files("-z", stdout_as_string=False, env=_READ_ONLY_ENV)
        except GitCommandError:
            return None
        return [p for p in out.split(b"\0") if p]

    def _registered_worktrees(self) -> list[Path]:
        if not self._mirror_path().is_dir():
            return []
        listing = self._mirror().git.worktree("list", "--porcelain", env=_READ_ONLY_ENV)
        prefix = "worktree "
        return [
            Path(os.path.realpath(line[len(prefix) :]))
            for line in listing.splitlines()
            if line.startswith(prefix)
        ]

    def _remove_worktree(self, path: Path) -> None:
        """Remove a (possibly half-made or already deleted) worktree and git's record of it."""
        if Path(os.path.realpath(path)) in self._registered_worktrees():
            try:
                self._mirror().git.worktree("remove", "--force", "--force", str(path))
            except GitCommandError:
                pass
        if path.exists() or path.is_symlink():
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()

