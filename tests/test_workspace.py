"""Workspace against real git repositories built in temporary directories."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from git.cmd import Git as GitCommand

from orchestrator.errors import UserError
from orchestrator.workspace import CommitInfo, Workspace, path_matches
from tests.conftest import read_only_view

GIT_ENV = {
    "GIT_AUTHOR_NAME": "Ada Tester",
    "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada Tester",
    "GIT_COMMITTER_EMAIL": "ada@example.com",
}


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    result = subprocess.run(
        ["git", "-c", "commit.gpgsign=false", "-c", "tag.gpgsign=false", *args],
        cwd=repo,
        env={**os.environ, **GIT_ENV},
        input=stdin,
        capture_output=True,
        check=True,
    )
    return result.stdout.decode().strip()


def commit_files(repo: Path, message: str, files: dict[str, str]) -> str:
    for name, content in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        git(repo, "add", name)
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


EAGLE = "python/sglang/srt/speculative/eagle_worker.py"
ATTN = "python/sglang/srt/layers/attention.py"


@pytest.fixture()
def history(tmp_path: Path) -> dict[str, str]:
    """main: root, eagle, attn (tag v1), docs, readme, merge(feature: k1, k2), pwned, tip."""
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas: dict[str, str] = {}
    shas["root"] = commit_files(
        repo, "root", {"README.md": "hello\n", EAGLE: "verify = 1\n", ATTN: "backend = 'fa3'\n"}
    )
    shas["eagle"] = commit_files(repo, "tune eagle verify", {EAGLE: "verify = 2\n"})
    shas["attn"] = commit_files(repo, "switch attention backend", {ATTN: "backend = 'fi'\n"})
    git(repo, "tag", "-a", "v1", "-m", "release v1")
    shas["docs"] = commit_files(repo, "docs", {"docs/usage.md": "use it\n"})
    git(repo, "checkout", "-q", "-b", "feature")
    shas["k1"] = commit_files(repo, "kernel one", {"sgl-kernel/a.cu": "a\n"})
    shas["k2"] = commit_files(repo, "kernel two", {"sgl-kernel/b.cu": "b\n"})
    git(repo, "checkout", "-q", "main")
    shas["readme"] = commit_files(repo, "readme", {"README.md": "hello again\n"})
    git(repo, "merge", "-q", "--no-ff", "feature", "-m", "Merge feature")
    shas["merge"] = git(repo, "rev-parse", "HEAD")
    shas["pwned"] = commit_files(
        repo, "tweak $(touch pwned) `touch pwned2`; touch pwned3", {"README.md": "x\n"}
    )
    shas["tip"] = commit_files(repo, "tip", {EAGLE: "verify = 3\n"})
    return shas


@pytest.fixture()
def repo(tmp_path: Path, history: dict[str, str]) -> Path:
    return tmp_path / "repo"


@pytest.fixture()
def workspace(repo: Path, tmp_path: Path) -> Workspace:
    return Workspace(repo, tmp_path / "cache")


def write_patch(path: Path, old: str, new: str, target: str = EAGLE) -> Path:
    path.write_text(
        f"diff --git a/{target} b/{target}\n--- a/{target}\n+++ b/{target}\n"
        f"@@ -1 +1 @@\n-{old}\n+{new}\n"
    )
    return path


def add_file_patch(path: Path, name: str, line: str) -> Path:
    path.write_text(
        f"diff --git a/{name} b/{name}\nnew file mode 100644\n--- /dev/null\n+++ b/{name}\n"
        f"@@ -0,0 +1 @@\n+{line}\n"
    )
    return path


def worktree_paths(repo: Path) -> list[str]:
    listing = git(repo, "worktree", "list", "--porcelain")
    return [line.split(" ", 1)[1] for line in listing.splitlines() if line.startswith("worktree ")]


# ----------------------------------------------------------------------- construction


def test_rejects_missing_and_non_git_paths_without_creating_cache(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    with pytest.raises(UserError, match="does not exist"):
        Workspace(tmp_path / "nope", cache)
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(UserError, match="not a git repository"):
        Workspace(plain, cache)
    assert not cache.exists()


# ----------------------------------------------------------------------- resolve


def test_resolve_branch_tag_short_sha_and_relative(
    workspace: Workspace, history: dict[str, str]
) -> None:
    assert workspace.resolve("main") == history["tip"]
    assert workspace.resolve("feature") == history["k2"]
    assert workspace.resolve("v1") == history["attn"]  # annotated tag peeled to its commit
    assert workspace.resolve(history["eagle"][:8]) == history["eagle"]
    assert workspace.resolve("HEAD~3") == history["readme"]  # tip, pwned, merge, readme
    assert workspace.resolve("HEAD~2^2") == history["k2"]


def test_resolve_unknown_ref(workspace: Workspace) -> None:
    with pytest.raises(UserError, match="unknown git ref 'no-such-branch'"):
        workspace.resolve("no-such-branch")
    with pytest.raises(UserError):
        workspace.resolve("HEAD^{tree}")  # exists, but is not a commit


def test_resolve_refuses_option_like_refs(workspace: Workspace, tmp_path: Path) -> None:
    for ref in ("--upload-pack=touch x", "--output=" + str(tmp_path / "out"), "-h", ""):
        with pytest.raises(UserError):
            workspace.resolve(ref)
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------- ranges


def test_commits_between_first_parent_over_a_merge(
    workspace: Workspace, history: dict[str, str]
) -> None:
    commits = workspace.commits_between("v1", "main")
    assert [c.sha for c in commits] == [
        history[name] for name in ("attn", "docs", "readme", "merge", "pwned", "tip")
    ]
    merge = commits[3]
    assert merge.parents == (history["readme"], history["k2"])
    assert merge.files == ("sgl-kernel/a.cu", "sgl-kernel/b.cu")  # relative to first parent
    assert commits[0].files == (ATTN,)  # good has its own files too
    assert commits[0].subject == "switch attention backend"
    assert commits[0].author == "Ada Tester <ada@example.com>"
    assert commits[0].date[:4].isdigit() and "T" in commits[0].date


def test_commits_between_all_parents_is_topological(
    workspace: Workspace, history: dict[str, str]
) -> None:
    commits = workspace.commits_between(history["docs"], history["merge"], first_parent=False)
    order = [c.sha for c in commits]
    assert order[0] == history["docs"] and order[-1] == history["merge"]
    assert set(order) == {history[n] for n in ("docs", "k1", "k2", "readme", "merge")}
    assert order.index(history["k1"]) < order.index(history["k2"])


def test_commits_between_good_from_a_side_branch_needs_all_parents(
    workspace: Workspace, history: dict[str, str]
) -> None:
    with pytest.raises(UserError, match="first-parent"):
        workspace.commits_between(history["k1"], "main")
    commits = workspace.commits_between(history["k1"], "main", first_parent=False)
    order = [c.sha for c in commits]
    assert order[0] == history["k1"] and order[-1] == history["tip"]
    assert history["k2"] in order and history["readme"] in order
    assert history["attn"] not in order  # reachable from good, so not in the range


def test_commits_between_rejects_same_commit_and_non_ancestor(
    workspace: Workspace, history: dict[str, str]
) -> None:
    with pytest.raises(UserError, match="same commit"):
        workspace.commits_between("main", history["tip"])
    with pytest.raises(UserError, match="not an ancestor"):
        workspace.commits_between("main", "v1")  # reversed
    with pytest.raises(UserError, match="not an ancestor"):
        workspace.commits_between("feature", history["readme"])  # diverged


def test_commit_text_is_data_not_shell(
    workspace: Workspace, history: dict[str, str], repo: Path, tmp_path: Path, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    commits = workspace.commits_between(history["merge"], "main")
    assert commits[1].subject == "tweak $(touch pwned) `touch pwned2`; touch pwned3"
    workspace.checkout(history["pwned"])
    for folder in (tmp_path, repo, workspace.cache_dir, workspace.cache_dir / history["pwned"]):
        assert not any((folder / name).exists() for name in ("pwned", "pwned2", "pwned3"))


def test_commits_between_large_range_is_one_fast_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = tmp_path / "big"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    count = 2500
    stream = []
    for index in range(count):
        body = f"change {index}\n".encode()
        message = f"commit {index}\n".encode()
        stream.append(b"commit refs/heads/main\n")
        stream.append(b"committer Ada <ada@example.com> %d +0000\n" % (1_700_000_000 + index))
        stream.append(b"data %d\n%s" % (len(message), message))
        stream.append(b"M 644 inline src/file%d.py\ndata %d\n%s\n" % (index % 50, len(body), body))
    git(repo, "fast-import", "--quiet", stdin=b"".join(stream))
    workspace = Workspace(repo, tmp_path / "cache")
    calls: list[tuple] = []
    real_execute = GitCommand.execute

    def counting_execute(self, command, *args, **kwargs):
        calls.append(tuple(command))
        return real_execute(self, command, *args, **kwargs)

    # "Fast" is counted, not timed: the cost that grows with the range is one git process per
    # commit; a stopwatch would measure the machine's load instead.
    monkeypatch.setattr(GitCommand, "execute", counting_execute)
    few = workspace.commits_between("main~9", "main")
    calls_for_few = len(calls)
    calls.clear()
    commits = workspace.commits_between("main~2499", "main")
    assert len(few) == 10 and len(commits) == count
    assert commits[0].subject == "commit 0" and commits[-1].subject == f"commit {count - 1}"
    assert commits[-1].files == (f"src/file{(count - 1) % 50}.py",)
    assert len(calls) == calls_for_few <= 6, calls  # the same few calls, whatever the range


# ----------------------------------------------------------------------- touches


def test_touches_paths_dirs_files_and_globs(workspace: Workspace, history: dict[str, str]) -> None:
    commits = {c.sha: c for c in workspace.commits_between(history["root"], "main")}
    eagle, attn = commits[history["eagle"]], commits[history["attn"]]
    merge = commits[history["merge"]]
    assert workspace.touches(eagle, ["python/sglang/srt/speculative"])
    assert workspace.touches(eagle, ["./python/sglang/srt/speculative/"])
    assert workspace.touches(eagle, [EAGLE])
    assert not workspace.touches(attn, ["python/sglang/srt/speculative"])
    assert workspace.touches(attn, ["docs", "python/*/srt/layers"])
    assert workspace.touches(merge, ["*.cu"])
    assert workspace.touches(eagle, ["python/**/eagle_*.py"])
    assert not workspace.touches(merge, ["python", "docs"])
    assert not workspace.touches(eagle, [])
    assert not path_matches("python/sglang-extra/x.py", "python/sglang")
    assert path_matches("eagle3.py", "**/eagle*.py")


def test_touches_counts_both_sides_of_a_rename(tmp_path: Path) -> None:
    repo = tmp_path / "r"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit_files(repo, "root", {"old/module.py": "x = 1\n" * 20})
    git(repo, "mv", "old", "new")
    git(repo, "commit", "-q", "-m", "move")
    workspace = Workspace(repo, tmp_path / "cache")
    moved = workspace.commits_between("HEAD~1", "HEAD")[-1]
    assert isinstance(moved, CommitInfo)
    assert workspace.touches(moved, ["old"]) and workspace.touches(moved, ["new"])


# ----------------------------------------------------------------------- checkouts


def test_checkout_reuses_intact_worktree_and_rebuilds_damaged_one(
    workspace: Workspace, history: dict[str, str]
) -> None:
    path = workspace.checkout("v1")
    assert path == workspace.cache_dir / history["attn"]
    assert (path / ATTN).read_text() == "backend = 'fi'\n"
    (path / "build-artifact.so").write_text("built")  # untracked build output is kept
    assert workspace.checkout(history["attn"]) == path
    assert (path / "build-artifact.so").exists()  # same tree, not re-created

    (path / ATTN).write_text("backend = 'tampered'\n")  # an edited tracked file is not intact
    assert workspace.checkout("v1") == path
    assert (path / ATTN).read_text() == "backend = 'fi'\n"
    assert not (path / "build-artifact.so").exists()


def test_checkout_leaves_user_tree_index_and_head_alone(
    workspace: Workspace, repo: Path, history: dict[str, str], tmp_path: Path
) -> None:
    (repo / "README.md").write_text("local edit\n")
    (repo / "docs/usage.md").write_text("staged edit\n")
    git(repo, "add", "docs/usage.md")
    before = (
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain"),
        (repo / ".git" / "index").read_bytes(),
    )
    patch = write_patch(tmp_path / "fix.patch", "verify = 1", "verify = 9")
    path = workspace.checkout(history["root"], [patch])
    assert (path / EAGLE).read_text() == "verify = 9\n"
    after = (
        git(repo, "symbolic-ref", "HEAD"),
        git(repo, "rev-parse", "HEAD"),
        git(repo, "status", "--porcelain"),
        (repo / ".git" / "index").read_bytes(),
    )
    assert after == before
    assert (repo / "README.md").read_text() == "local edit\n"
    assert (repo / EAGLE).read_text() == "verify = 3\n"


def test_patches_apply_inside_the_worktree_only(
    workspace: Workspace, repo: Path, history: dict[str, str], tmp_path: Path
) -> None:
    new_file = add_file_patch(tmp_path / "add.patch", "python/sglang/new_kernel.py", "fast = True")
    tweak = write_patch(tmp_path / "tweak.patch", "verify = 3", "verify = 4")
    plain = workspace.checkout("main")
    patched = workspace.checkout("main", [new_file, tweak])
    assert patched != plain and patched.name.startswith(history["tip"] + "-")
    assert (patched / "python/sglang/new_kernel.py").read_text() == "fast = True\n"
    assert (patched / EAGLE).read_text() == "verify = 4\n"
    assert not (plain / "python/sglang/new_kernel.py").exists()
    assert not (repo / "python/sglang/new_kernel.py").exists()
    assert workspace.dirty_diff_hash(plain) is None
    assert workspace.dirty_diff_hash(patched) is not None
    assert workspace.patch_hashes([new_file, tweak]) == [
        hashlib.sha256(p.read_bytes()).hexdigest() for p in (new_file, tweak)
    ]
    assert workspace.checkout("main", [new_file, tweak]) == patched  # reused with patches too


def test_patch_that_does_not_apply_leaves_nothing(
    workspace: Workspace, repo: Path, tmp_path: Path
) -> None:
    good = add_file_patch(tmp_path / "good.patch", "extra.py", "x = 1")
    bad = write_patch(tmp_path / "stale.patch", "verify = 7", "verify = 8")
    with pytest.raises(UserError, match="stale.patch") as raised:
        workspace.checkout("main", [good, bad])
    assert "\n" not in str(raised.value)
    assert worktree_paths(repo) == [str(repo.resolve())]
    # Only the private repository stays (it is reused by every later checkout); no half-made
    # worktree, no state, no lock file.
    leftovers = [p.name for p in workspace.cache_dir.iterdir() if p.name not in (".locks",)]
    assert leftovers == [".repos"]
    assert not list((workspace.cache_dir / ".locks").glob("*"))
    assert [p.name for p in (workspace.cache_dir / ".repos").iterdir()][0].endswith(".git")


def test_check_patches_applies_the_series_in_order_and_writes_nothing(
    workspace: Workspace, repo: Path, tmp_path: Path
) -> None:
    first = write_patch(tmp_path / "first.patch", "verify = 3", "verify = 4")
    second = write_patch(tmp_path / "second.patch", "verify = 4", "verify = 5")
    objects = sorted(p.name for p in (repo / ".git" / "objects").rglob("*"))
    assert workspace.check_patches("main", [first, second]) == [first, second]
    # The second needs the first: out of order, the first patch that fails is named.
    with pytest.raises(UserError, match="second.patch does not apply"):
        workspace.check_patches("main", [second, first])
    assert not workspace.cache_dir.exists()
    assert sorted(p.name for p in (repo / ".git" / "objects").rglob("*")) == objects
    assert workspace.checkout("main", [first, second]).joinpath(EAGLE).read_text() == "verify = 5\n"


def test_missing_patch_file_is_a_user_error_before_anything_is_made(
    workspace: Workspace, tmp_path: Path
) -> None:
    with pytest.raises(UserError, match="missing.patch"):
        workspace.checkout("main", [tmp_path / "missing.patch"])
    assert not workspace.cache_dir.exists()


def test_concurrent_checkouts_of_one_commit_from_several_processes(
    workspace: Workspace, repo: Path, history: dict[str, str], tmp_path: Path
) -> None:
    """Three processes check out one commit at once. A barrier, not a sleep, lines them up:
    each says it is ready (imports done, workspace built) and blocks on its stdin; only when all
    three have said so does the test release them together, so they race however slow the
    machine is."""
    patch = write_patch(tmp_path / "p.patch", "verify = 2", "verify = 5")
    script = textwrap.dedent(
        f"""
        import sys
        from orchestrator.workspace import Workspace
        ws = Workspace({str(repo)!r}, {str(workspace.cache_dir)!r})
        print("ready", flush=True)
        sys.stdin.readline()
        print(ws.checkout({history["eagle"]!r}, [{str(patch)!r}]))
        """
    )
    root = Path(__file__).resolve().parents[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            cwd=root,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    results = [proc.communicate(timeout=60) for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0, 0], [err for _, err in results]
    paths = {out.strip() for out, _ in results}
    assert len(paths) == 1
    path = Path(paths.pop())
    assert (path / EAGLE).read_text() == "verify = 5\n"
    assert worktree_paths(repo) == [str(repo.resolve())]  # the user's repo knows nothing of it
    (mirror,) = (workspace.cache_dir / ".repos").iterdir()
    assert str(path) in worktree_paths(mirror)
    assert not [p for p in workspace.cache_dir.iterdir() if p.name.startswith(".tmp-")]


# ----------------------------------------------------------------------- state and cleanup


def test_dirty_diff_hash_follows_content(workspace: Workspace, repo: Path) -> None:
    assert workspace.dirty_diff_hash(repo) is None
    (repo / "README.md").write_text("edit one\n")
    first = workspace.dirty_diff_hash(repo)
    (repo / "README.md").write_text("edit two\n")
    second = workspace.dirty_diff_hash(repo)
    assert first and second and first != second


def test_prune_removes_worktrees_but_not_foreign_files(
    workspace: Workspace, repo: Path, tmp_path: Path
) -> None:
    path = workspace.checkout("v1")
    patched = workspace.checkout("main", [write_patch(tmp_path / "p.patch", "verify = 3", "v")])
    foreign = workspace.cache_dir / "notes.txt"
    foreign.write_text("keep me\n")
    workspace.prune()
    assert not path.exists() and not patched.exists()
    assert foreign.read_text() == "keep me\n"
    assert worktree_paths(repo) == [str(repo.resolve())]
    assert workspace.checkout("v1") == path  # the cache still works after pruning


# ----------------------------------------------------------------------- the user's repository


def _tree_digest(path: Path) -> dict[str, str]:
    """Every file under `path` with its content hash (and every directory)."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = str(p.relative_to(path))
        out[rel] = hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
    return out


def test_checkouts_write_nothing_into_the_users_repository(
    repo: Path, history: dict[str, str], tmp_path: Path
) -> None:
    before = _tree_digest(repo / ".git")
    ws = Workspace(repo, tmp_path / "cache")
    patch = write_patch(tmp_path / "fix.patch", "verify = 1", "verify = 9")
    paths = [ws.checkout(history["root"], [patch]), ws.checkout("v1"), ws.checkout("main")]
    assert (paths[0] / EAGLE).read_text() == "verify = 9\n"
    assert ws.dirty_diff_hash(paths[0]) is not None
    assert ws.checkout("v1") == paths[1]  # reused
    ws.commits_between(history["root"], history["tip"])
    assert worktree_paths(repo) == [str(repo.resolve())]
    assert _tree_digest(repo / ".git") == before  # not one byte changed, no file added
    ws.prune()
    assert _tree_digest(repo / ".git") == before


@pytest.fixture()
def read_only_repo(repo: Path, tmp_path: Path):
    with read_only_view(repo, tmp_path / "ro-repo") as view:
        yield view


def test_a_read_only_repository_checks_out(
    read_only_repo: Path, history: dict[str, str], tmp_path: Path
) -> None:
    with pytest.raises(OSError):
        (read_only_repo / "probe").write_text("x")
    ws = Workspace(read_only_repo, tmp_path / "cache")
    commits = ws.commits_between(history["root"], history["tip"])
    patch = write_patch(tmp_path / "fix.patch", "verify = 3", "verify = 4")
    path = ws.checkout(commits[-1].sha, [patch])
    assert (path / EAGLE).read_text() == "verify = 4\n"
    assert ws.checkout(commits[-1].sha, [patch]) == path


def test_an_old_worktree_registered_in_the_users_repo_is_rebuilt_privately(
    repo: Path, history: dict[str, str], tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    old = cache / history["attn"]
    git(repo, "worktree", "add", "-q", "--detach", str(old), history["attn"])
    ws = Workspace(repo, cache)
    assert ws.checkout(history["attn"]) == old
    assert (old / ".git").read_text().startswith(f"gitdir: {cache.resolve() / '.repos'}")
    assert (old / ATTN).read_text() == "backend = 'fi'\n"


def test_the_cache_is_bounded_least_recently_used_out(
    repo: Path, history: dict[str, str], tmp_path: Path
) -> None:
    probe = Workspace(repo, tmp_path / "probe")
    one = probe.cache.usage() or 0
    probe.checkout("v1")
    one = probe.cache.usage()
    assert one > 0
    ws = Workspace(repo, tmp_path / "cache", max_bytes=int(2.5 * one))
    a = ws.checkout(history["root"])
    b = ws.checkout(history["eagle"])
    os.utime(ws.cache_dir / ".state" / f"{history['root']}.json", (1, 1))
    os.utime(ws.cache_dir / ".state" / f"{history['eagle']}.json", (2, 2))
    ws.checkout(history["root"])  # used again: now the most recent of the two
    c = ws.checkout(history["attn"])
    assert a.exists() and c.exists() and not b.exists()  # eagle was the least recently used
    assert ws.cache.usage() <= ws.max_bytes
    with ws.lease(history["root"]) as held:  # a worktree in use is never removed
        os.utime(ws.cache_dir / ".state" / f"{history['root']}.json", (1, 1))
        d = ws.checkout(history["docs"])
        assert held.exists() and d.exists() and not c.exists()
    assert not list((ws.cache_dir / ".locks").glob("*.lock"))
