"""Commit records and the one-call `git log` parser behind `Workspace.commits_between`.

A bisect over SGLang can span thousands of commits. Walking them through GitPython's object
model costs one `git` round trip (or more) per commit; one `git log -z --name-only` call with a
machine-readable format returns the whole range, files included, in milliseconds. The format
uses ASCII record/unit separators, which never occur in hashes, names, dates or subjects, and
`-z` makes file names come back verbatim (no C-style quoting of odd characters).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

RECORD_SEPARATOR = "\x1e"
FIELD_SEPARATOR = "\x1f"

# Hash, parents, author, author date (strict ISO 8601), subject. The subject goes last so a
# stray separator inside it could only ever end up in the subject itself.
LOG_FORMAT = "%x1e%H%x1f%P%x1f%an <%ae>%x1f%aI%x1f%s"

# Options that make the log output independent of the user's git configuration: no signature
# blocks or colour codes mixed into the records, no rename folding (a rename must count as a
# touch of both the old and the new path), merges listed once with their diff against the
# first parent, and the root commit's files listed like any other commit's.
LOG_OPTIONS: tuple[str, ...] = (
    "-z",
    "--name-only",
    "--no-renames",
    "--no-color",
    "--no-show-signature",
    "--diff-merges=first-parent",
    "--root",
    f"--format={LOG_FORMAT}",
)


@dataclass(frozen=True)
class CommitInfo:
    """One commit as the strategies and reports see it.

    `files` are the paths the commit changed relative to its first parent (for a merge: what
    the merge brought into the branch), which is what `touches` filters on. `boundary`: not in
    the range but the parent of a commit in it (a side branch forked before the good commit),
    listed so that a culprit can be measured against its real parent; like every ancestor of
    the good commit it is taken to be good.
    """

    sha: str
    parents: tuple[str, ...]
    subject: str
    author: str
    date: str
    files: tuple[str, ...]
    boundary: bool = False



def parse_log(raw: bytes) -> list[CommitInfo]:
    """Parse the output of `git log` run with `LOG_OPTIONS`, keeping git's order.

    Each record is `RS header NUL` followed, when the commit changed files, by `LF` and the
    NUL-terminated file names. Bytes that are not UTF-8 are kept via surrogate escapes so a path
    still compares equal to itself.
    """
    text = raw.decode("utf-8", errors="surrogateescape")
    commits: list[CommitInfo] = []
    for record in text.split(RECORD_SEPARATOR):
        if not record.strip("\0\n"):
            continue
        header, _, rest = record.partition("\0")
        fields = header.split(FIELD_SEPARATOR, 4)
        if len(fields) != 5:
            raise ValueError(f"unexpected git log record: {header[:80]!r}")
        sha, parents, author, date, subject = fields
        if rest.startswith("\n"):
            rest = rest[1:]
        files = tuple(name for name in rest.split("\0") if name)
        commits.append(
            CommitInfo(
                sha=sha,
                parents=tuple(parents.split()),
                subject=subject,
                author=author,
                date=date,
                files=files,
            )
        )
    return commits


def _normalize_pattern(pattern: str) -> str:
    pattern = pattern.strip()
    while pattern.startswith("./"):
        pattern = pattern[2:]
    return pattern.strip("/")


def _has_glob(pattern: str) -> bool:
    return any(char in pattern for char in "*?[")


def _ancestors_and_self(path: str) -> Iterable[str]:
    parts = path.split("/")
    for end in range(len(parts), 0, -1):
        yield "/".join(parts[:end])


def path_matches(path: str, pattern: str) -> bool:
    """True if `path` (repo-relative, '/'-separated) lies under `pattern`.

    A plain pattern names a file or a directory (`python/sglang/srt/speculative` matches every
    file below it). A glob is matched against the path and each of its parent directories, so
    `python/*/srt` also selects everything under `python/sglang/srt`; `*` may cross '/', and
    `**/` also matches zero directories (`python/**/eagle*.py` matches `python/eagle3.py`).
    """
    pattern = _normalize_pattern(pattern)
    if pattern in ("", "."):
        return True
    if not _has_glob(pattern):
        return path == pattern or path.startswith(pattern + "/")
    candidates = {pattern, pattern.replace("**/", "")}
    return any(
        fnmatch.fnmatchcase(prefix, candidate)
        for prefix in _ancestors_and_self(path)
        for candidate in candidates
    )


def touches_paths(files: Sequence[str], patterns: Sequence[str]) -> bool:
    """True if any of `files` lies under any of `patterns` (see `path_matches`)."""
    return any(path_matches(name, pattern) for name in files for pattern in patterns)


def boundary_parents(commits: Sequence[CommitInfo]) -> list[str]:
    """Parents of the listed commits that are not listed themselves, in first-seen order."""
    listed = {c.sha for c in commits}
    out: list[str] = []
    for commit in commits[1:]:
        for parent in commit.parents:
            if parent not in listed and parent not in out:
                out.append(parent)
    return out


def graph_order(commits: Sequence[CommitInfo], boundary: Sequence[CommitInfo]
                ) -> list[CommitInfo]:
    """The full-graph bisect's points: the good commit, then the boundary parents (marked),
    then the range in topological order; the bad commit stays last."""
    marked = [CommitInfo(**{**c.__dict__, "boundary": True}) for c in boundary]
    return [commits[0], *marked, *commits[1:]]


def parent_points(commits: Sequence[CommitInfo]) -> tuple[list[tuple[int, ...]], list[int]]:
    """Each point's parents as earlier points (parents outside the list dropped), and the
    points taken to be good (the good commit and the boundary parents)."""
    index = {c.sha: i for i, c in enumerate(commits)}
    parents = [tuple(index[p] for p in c.parents if p in index and index[p] < i)
               for i, c in enumerate(commits)]
    good = [0] + [i for i, c in enumerate(commits) if c.boundary]
    return parents, good
