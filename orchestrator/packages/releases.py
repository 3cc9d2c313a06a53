"""The releases of a package between two versions, as its package source lists them.

`sleuth bisect package=NAME good=V1 bad=V2` searches the versions in between; this module
lists them, from the same source the overlays are installed from, so that every listed
version is one pip can be asked for:

- a wheel directory (`packages.find_links`, or `--find-links DIR` in `packages.pip_args`):
  the file names say the name and version (a directory says nothing of release dates);
- a package index (`packages.index_url`, `--extra-index-url`): its simple API, JSON (PEP 691,
  with upload times, PEP 700, and yanked flags, PEP 592) where it answers so, else HTML
  (PEP 503, `data-yanked`);
- neither: pip's own configuration (`pip config list`, `PIP_INDEX_URL`, `PIP_FIND_LINKS`), else
  PyPI's simple index.

Ordering is `packaging.version`'s (PEP 440), not the listing's or the dates'. Pre-releases and
development releases take part only when asked for (`package.pre=true`), as pip installs them;
a yanked release (every file yanked) is left out unless it is an endpoint, as pip does. Both
go to `excluded` with the reason, so a report can say why a version was never measured.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path

from packaging.utils import (
    InvalidSdistFilename,
    InvalidWheelFilename,
    canonicalize_name,
    parse_sdist_filename,
    parse_wheel_filename,
)
from packaging.version import InvalidVersion, Version

from orchestrator.errors import UserError
from orchestrator.packages.overlay import OverlaySettings
from orchestrator.packages.pipcall import config_lines, pip_arg_sources

PYPI_SIMPLE = "https://pypi.org/simple"
_JSON = "application/vnd.pypi.simple.v1+json"


@dataclass
class Release:
    """One version as the source lists it: its files, the earliest upload date the source
    gives (empty for a directory), whether every file is yanked, and where it is described."""

    version: str
    date: str = ""
    files: list[str] = field(default_factory=list)
    yanked: bool = False
    yank_reason: str = ""
    url: str = ""

    @property
    def key(self) -> Version:
        return Version(self.version)

    def to_json(self) -> dict:
        doc: dict = {"version": self.version, "files": list(self.files)}
        if self.date:
            doc["date"] = self.date
        if self.url:
            doc["url"] = self.url
        if self.yanked:
            doc["yanked"] = self.yank_reason or True
        return doc


@dataclass
class Listing:
    """The releases between the endpoints (good first), those left out with why, and the
    source read."""

    name: str
    releases: list[Release]
    excluded: list[dict]
    source: str

    @property
    def versions(self) -> list[str]:
        return [r.version for r in self.releases]


def _file_version(filename: str, name: str) -> str | None:
    """The version in a wheel or sdist file name of `name` (None for another package's file
    or a name that is neither)."""
    try:
        if filename.endswith(".whl"):
            dist, version, _build, _tags = parse_wheel_filename(filename)
        elif filename.endswith((".tar.gz", ".zip")):
            dist, version = parse_sdist_filename(filename)
        else:
            return None
    except (InvalidWheelFilename, InvalidSdistFilename, InvalidVersion):
        return None
    return str(version) if dist == canonicalize_name(name) else None


def _add(found: dict[Version, Release], version: str, filename: str, *, date: str = "",
         yanked: object = False, url: str = "") -> None:
    v = Version(version)
    rel = found.get(v)
    if rel is None:
        rel = found[v] = Release(version=version, url=url, yanked=True)
    rel.files.append(filename)
    if date and (not rel.date or date < rel.date):
        rel.date = date
    if not yanked:  # yanked only when every file is
        rel.yanked = False
        rel.yank_reason = ""
    elif rel.yanked and isinstance(yanked, str) and yanked:
        rel.yank_reason = yanked


def from_directory(path: Path, name: str, found: dict[Version, Release]) -> None:
    for entry in sorted(Path(path).iterdir()):
        version = _file_version(entry.name, name) if entry.is_file() else None
        if version is not None:
            _add(found, version, entry.name)


class _Links(HTMLParser):
    """Anchors of a PEP 503 page: (href, text, data-yanked or None)."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[tuple[str, str, str | None]] = []
        self._open: tuple[str, str | None] | None = None

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            a = dict(attrs)
            self._open = (a.get("href") or "", a.get("data-yanked"))

    def handle_data(self, data):
        if self._open is not None:
            href, yanked = self._open
            self.links.append((href, data.strip(), yanked))
            self._open = None


def _project_page(index: str, name: str) -> str | None:
    """The human page of a release on PyPI (other indexes have no agreed one)."""
    host = urllib.parse.urlparse(index).netloc
    return "https://pypi.org/project/{name}/{version}/" if host in ("pypi.org",
                                                                    "pypi.python.org") else None


def from_index(index: str, name: str, found: dict[Version, Release], timeout: float) -> None:
    url = index.rstrip("/") + "/" + canonicalize_name(name) + "/"
    req = urllib.request.Request(url, headers={
        "Accept": f"{_JSON}, application/vnd.pypi.simple.v1+html;q=0.2, text/html;q=0.1"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            kind = resp.headers.get("Content-Type", "")
            body = resp.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return  # the index has no such project: other sources may
        raise UserError(f"cannot list the releases of {name} from {index}: HTTP {exc.code}"
                        ) from exc
    except (urllib.error.URLError, OSError) as exc:
        raise UserError(f"cannot list the releases of {name} from {index}: "
                        f"{getattr(exc, 'reason', exc)}") from exc
    page = _project_page(index, name)
    if "json" in kind:
        for f in json.loads(body).get("files", []):
            filename = str(f.get("filename") or "")
            version = _file_version(filename, name)
            if version is not None:
                _add(found, version, filename, date=str(f.get("upload-time") or "")[:10],
                     yanked=f.get("yanked") or False,
                     url=page.format(name=canonicalize_name(name), version=version) if page
                     else urllib.parse.urljoin(url, str(f.get("url") or "")))
        return
    parser = _Links()
    parser.feed(body)
    for href, text, yanked in parser.links:
        filename = text or urllib.parse.unquote(href.split("#")[0].rsplit("/", 1)[-1])
        version = _file_version(filename, name)
        if version is not None:
            # data-yanked="" is a yank without a reason
            _add(found, version, filename, yanked=False if yanked is None else (yanked or True),
                 url=page.format(name=canonicalize_name(name), version=version) if page
                 else urllib.parse.urljoin(url, href.split("#")[0]))


def pip_configuration(python: str) -> tuple[list[str], list[str]]:
    """(find-links, indexes) from pip's own configuration for `python` (its files and the
    PIP_* variables), as the overlays without a named source install from."""
    links: list[str] = []
    indexes: list[str] = []
    lines = config_lines(python)  # its files and its PIP_* variables (`:env:.index-url=...`)
    if lines is None:  # no pip for that interpreter: the variables alone
        lines = [f":env:.{var[4:].lower().replace('_', '-')}={os.environ[var]}"
                 for var in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS")
                 if os.environ.get(var)]
    for line in lines:
        key, _, value = line.partition("=")
        value = value.strip().strip("'\"")
        into = (indexes if key.endswith((".index-url", ".extra-index-url"))
                else links if key.endswith(".find-links") else None)
        if into is not None:
            into.extend(v for v in value.split() if v not in into)
    return links, indexes or [PYPI_SIMPLE]


def list_all(settings: OverlaySettings, name: str, python: str,
             timeout: float = 60.0) -> tuple[dict[Version, Release], str]:
    """Every release of `name` the source lists, and the source in words."""
    links, indexes = pip_arg_sources(settings.pip_args)
    links = [*settings.find_links, *links]
    if settings.index_url:
        indexes.insert(0, settings.index_url)
    if not links and not indexes:
        links, indexes = pip_configuration(python)
    found: dict[Version, Release] = {}
    for link in links:
        path = Path(urllib.parse.urlparse(link).path if link.startswith("file:") else link)
        if path.is_dir():
            from_directory(path, name, found)
        elif link.startswith(("http://", "https://")):
            from_index(link, name, found, timeout)  # a flat page of links reads the same
    for index in indexes:
        from_index(index, name, found, timeout)
    source = ", ".join([*links, *indexes])
    return found, source


def between(found: dict[Version, Release], name: str, good: str, bad: str, *, pre: bool,
            source: str) -> Listing:
    """The releases from `good` to `bad` in version order (descending when `bad` is the older:
    a downgrade that slowed things down is searched the same way), endpoints included."""
    try:
        g, b = Version(good), Version(bad)
    except InvalidVersion as exc:
        raise UserError(f"package {name}: {exc}") from exc
    if g == b:
        raise UserError(f"package {name}: good and bad are the same version ({good})")
    for v, label in ((g, good), (b, bad)):
        if v not in found:
            near = ", ".join(r.version for _, r in sorted(found.items())[-12:]) or "none"
            raise UserError(f"{name} {label} is not in the package source {source or '(none)'}"
                            f" (versions there: {near})")
    lo, hi = min(g, b), max(g, b)
    keep, excluded = [], []
    for v, rel in sorted(found.items()):
        if not lo <= v <= hi:
            continue
        named = v in (g, b)
        if not named and (v.is_prerelease or v.is_devrelease) and not pre:
            excluded.append({"version": rel.version, "why": "pre-release (package.pre=true "
                             "includes pre-releases)"})
        elif not named and rel.yanked:
            why = "yanked" + (f": {rel.yank_reason}" if rel.yank_reason else "")
            excluded.append({"version": rel.version, "why": why})
        else:
            keep.append(rel)
    if b < g:
        keep.reverse()
    return Listing(name=canonicalize_name(name), releases=keep, excluded=excluded, source=source)


def releases_between(settings: OverlaySettings, name: str, good: str, bad: str, *, pre: bool,
                     python: str) -> Listing:
    found, source = list_all(settings, name, python)
    return between(found, name, good, bad, pre=pre, source=source)


def describe(name: str, versions: Sequence[str], excluded: Sequence[dict], source: str,
             limit: int = 12) -> str:
    """`10 releases of slowpkg 1.0..1.9 from DIR (1 pre-release left out): 1.0 1.1 ...`."""
    reasons: dict[str, int] = {}
    for e in excluded:
        kind = e["why"].split(" ", 1)[0].split(":", 1)[0]
        reasons[kind] = reasons.get(kind, 0) + 1
    left = "; ".join(f"{n} {kind}{'s' if n != 1 and kind != 'yanked' else ''} left out"
                     for kind, n in reasons.items())
    shown = " ".join(versions[:limit]) + (" ..." if len(versions) > limit else "")
    return (f"{len(versions)} releases of {name} {versions[0]}..{versions[-1]} from "
            f"{source}{f' ({left})' if left else ''}: {shown}")
