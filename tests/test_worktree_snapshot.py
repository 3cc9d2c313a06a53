"""A cached worktree verified once is not verified by git again until something touches it.

Real repositories in temp dirs; git calls are counted by wrapping GitPython's `execute`, so
"no git call" is observed, not assumed. Every change a trial could make to a worktree (a
tracked file edited, chmod-ed, deleted, staged; HEAD moved) must still send it back to git and
get it rebuilt; an untracked build output must not.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import git as gitpython
import pytest

from orchestrator.workspace import Workspace
from orchestrator.workspace.snapshot import Snapshot

ENV = {"GIT_AUTHOR_NAME": "T", "GIT_AUTHOR_EMAIL": "t@example.com",
       "GIT_COMMITTER_NAME": "T", "GIT_COMMITTER_EMAIL": "t@example.com"}


def run_git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, env={**os.environ, **ENV}, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture()
def repo(tmp_path: Path) -> tuple[Path, list[str]]:
    path = tmp_path / "repo"
    path.mkdir()
    run_git(path, "init", "-q", "-b", "main")
    shas = []
    for i in range(2):
        (path / "bench.sh").write_text(f"#!/bin/sh\necho {i}\n")
        (path / "lib").mkdir(exist_ok=True)
        (path / "lib" / "kernel.py").write_text(f"speed = {i}\n")
        run_git(path, "add", "-A")
        run_git(path, "commit", "-q", "-m", f"c{i}")
        shas.append(run_git(path, "rev-parse", "HEAD"))
    return path, shas


@pytest.fixture()
def git_calls(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    original = gitpython.cmd.Git.execute

    def counted(self, command, *args, **kwargs):
        calls.append(tuple(command))
        return original(self, command, *args, **kwargs)

    monkeypatch.setattr(gitpython.cmd.Git, "execute", counted)
    return calls


def verified(ws: Workspace, sha: str) -> Path:
    """Check out, then verify once by git after the files' timestamps are in the past (a
    snapshot taken in the same tick as a write is not kept: see Snapshot.racy)."""
    path = ws.checkout(sha)
    time.sleep(0.05)
    assert ws.checkout(sha) == path
    return path


def test_a_verified_untouched_worktree_costs_no_git_call(repo, tmp_path, git_calls):
    path_repo, shas = repo
    ws = Workspace(path_repo, tmp_path / "cache")
    path = verified(ws, shas[1])
    git_calls.clear()
    with ws.lease(shas[1]) as leased:
        assert leased == path
        assert ws.worktree_diff_hash(leased) is None
    (path / "results.json").write_text("{}")  # an untracked output of the bench: not a change
    assert ws.checkout(shas[1]) == path
    assert git_calls == []
    assert (path / "results.json").exists()  # reused, not rebuilt


def test_another_workspace_reuses_the_written_snapshot(repo, tmp_path, git_calls):
    path_repo, shas = repo
    path = verified(Workspace(path_repo, tmp_path / "cache"), shas[0])
    other = Workspace(path_repo, tmp_path / "cache")  # another node, or the next run
    git_calls.clear()
    assert other.checkout(shas[0]) == path
    assert other.worktree_diff_hash(path) is None
    assert git_calls == []


@pytest.mark.parametrize("touch", ["edit", "same_size_edit", "chmod", "delete", "stage", "head"])
def test_anything_that_touched_a_tracked_file_sends_it_back_to_git(repo, tmp_path, git_calls,
                                                                   touch):
    path_repo, shas = repo
    ws = Workspace(path_repo, tmp_path / "cache")
    path = verified(ws, shas[1])
    kernel = path / "lib" / "kernel.py"
    if touch == "edit":
        kernel.write_text("speed = 1000  # tuned by hand\n")
    elif touch == "same_size_edit":
        kernel.write_text("speed = 7\n")  # the same length as "speed = 1": size cannot tell
    elif touch == "chmod":
        kernel.chmod(0o755)
    elif touch == "delete":
        kernel.unlink()
    elif touch == "stage":
        kernel.write_text("speed = 9\n")
        run_git(path, "add", "lib/kernel.py")
        run_git(path, "checkout", "--", "lib/kernel.py")
    elif touch == "head":
        run_git(path, "checkout", "-q", "--detach", shas[0])
    git_calls.clear()
    assert ws.checkout(shas[1]) == path
    assert git_calls, "a touched worktree must be verified by git"
    assert kernel.read_text() == "speed = 1\n"  # rebuilt as the commit has it
    assert os.stat(kernel).st_mode & 0o111 == 0
    assert run_git(path, "rev-parse", "HEAD") == shas[1]
    assert run_git(path, "status", "--porcelain", "--untracked-files=no") == ""


def test_the_fingerprints_diff_hash_sees_a_build_that_wrote_a_tracked_file(repo, tmp_path):
    path_repo, shas = repo
    ws = Workspace(path_repo, tmp_path / "cache")
    path = verified(ws, shas[1])
    assert ws.worktree_diff_hash(path) is None
    (path / "bench.sh").write_text("#!/bin/sh\necho generated\n")  # e.g. a build step
    assert ws.worktree_diff_hash(path) == ws.dirty_diff_hash(path) is not None


def test_a_snapshot_taken_in_the_tick_of_a_write_is_not_kept(repo, tmp_path, git_calls):
    path_repo, shas = repo
    ws = Workspace(path_repo, tmp_path / "cache")
    path = ws.checkout(shas[0])
    files = [b"bench.sh", b"lib/kernel.py"]
    state = ws.cache.state_path(path.name)
    snap = Snapshot.take(path, files, state)
    newest = max(max(st[4], st[5]) for st in snap.stats if st is not None)
    assert snap.racy(newest)  # written in the stamp's tick: a later write may not show
    assert not snap.racy(newest + 1)
    kernel = path / "lib" / "kernel.py"
    os.utime(kernel, ns=(time.time_ns() + 10**9, time.time_ns() + 10**9))  # mtime set ahead
    assert Snapshot.take(path, files, state).racy(time.time_ns())


def test_a_damaged_snapshot_file_means_git_decides(repo, tmp_path, git_calls):
    path_repo, shas = repo
    path = verified(Workspace(path_repo, tmp_path / "cache"), shas[0])
    snap_file = tmp_path / "cache" / ".state" / f"{path.name}.verified.json"
    doc = json.loads(snap_file.read_text())
    assert doc["files"] == ["bench.sh", "lib/kernel.py"]
    snap_file.write_text('{"files": [1, 2]')  # cut short
    other = Workspace(path_repo, tmp_path / "cache")
    git_calls.clear()
    assert other.checkout(shas[0]) == path
    assert any("diff" in c for c in git_calls)
    assert json.loads(snap_file.read_text())["files"] == ["bench.sh", "lib/kernel.py"]


def test_a_full_sha_already_built_is_not_resolved_again(repo, tmp_path, git_calls):
    path_repo, shas = repo
    ws = Workspace(path_repo, tmp_path / "cache")
    verified(ws, shas[0])
    git_calls.clear()
    Workspace(path_repo, tmp_path / "cache").checkout(shas[0])
    assert not any("rev-parse" in c for c in git_calls)
    with pytest.raises(Exception, match="unknown git ref"):
        ws.checkout("f" * 40)  # never built: git is asked, and says no


def test_eviction_and_prune_remove_the_snapshot_too(repo, tmp_path):
    path_repo, shas = repo
    ws = Workspace(path_repo, tmp_path / "cache")
    path = verified(ws, shas[0])
    snap_file = ws.cache.snapshot_path(path.name)
    assert snap_file.exists()
    ws.prune()
    assert not snap_file.exists() and not path.exists()
