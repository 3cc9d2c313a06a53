"""Writing a scenario's history: one `git fast-import` stream, isolated from the user's git.

Split from :mod:`orchestrator.sim_scenarios.generate` (which plans the history): this module only
turns planned commits into a repo, byte for byte the same for the same plan.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol

from orchestrator.errors import SleuthError


class PlannedCommit(Protocol):
    """What the stream needs of a planned commit."""

    mark: int
    parents: tuple[int, ...]
    author: tuple[str, str, str]
    committer: tuple[str, str, str]
    author_time: int
    commit_time: int
    message: str
    changes: Sequence[tuple[str, str]]


def git_env() -> dict[str, str]:
    """Isolate git from the user's config so hooks, templates or autocrlf cannot change bytes."""
    isolation = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull}
    return {**os.environ, **isolation, "GIT_TERMINAL_PROMPT": "0"}


def git(repo: Path, *args: str, stdin: bytes | None = None) -> str:
    command = ["git", "-C", str(repo), *args]
    proc = subprocess.run(command, input=stdin, capture_output=True, env=git_env(), check=False)
    if proc.returncode != 0:
        raise SleuthError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()}")
    return proc.stdout.decode()


def fast_import_stream(commits: Sequence[PlannedCommit], tags: Mapping[str, int]) -> bytes:
    parts: list[bytes] = []
    for commit in commits:
        a_name, a_email, a_tz = commit.author
        c_name, c_email, c_tz = commit.committer
        message = commit.message.encode() + b"\n"
        header = (
            f"commit refs/heads/main\nmark :{commit.mark}\n"
            f"author {a_name} <{a_email}> {commit.author_time} {a_tz}\n"
            f"committer {c_name} <{c_email}> {commit.commit_time} {c_tz}\n"
            f"data {len(message)}\n"
        )
        parts += [header.encode(), message]
        if commit.parents:
            parts.append(f"from :{commit.parents[0]}\n".encode())
        parts += [f"merge :{parent}\n".encode() for parent in commit.parents[1:]]
        for path, content in commit.changes:
            data = content.encode()
            parts += [f"M 100644 inline {path}\ndata {len(data)}\n".encode(), data, b"\n"]
        parts.append(b"\n")
    for tag, mark in tags.items():
        parts.append(f"reset refs/tags/{tag}\nfrom :{mark}\n\n".encode())
    parts.append(b"done\n")
    return b"".join(parts)


def write_repo(repo: Path, commits: Sequence[PlannedCommit], tags: Mapping[str, int]) -> dict[int, str]:
    """Create the repo with one fast-import process; return mark -> SHA."""
    repo.mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    with tempfile.TemporaryDirectory() as scratch:
        marks_file = Path(scratch) / "marks"
        stream = fast_import_stream(commits, tags)
        git(repo, "fast-import", "--quiet", "--done", f"--export-marks={marks_file}", stdin=stream)
        marks = {}
        for line in marks_file.read_text().splitlines():
            mark, sha = line.split()
            marks[int(mark.lstrip(":"))] = sha
    git(repo, "reset", "-q", "--hard", "main")
    return marks
