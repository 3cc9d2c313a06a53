"""Overlays: one pinned package installed once, beside the node's environment, never into it.

`pip install --no-deps --target DIR name==version` puts exactly one distribution into a
directory of its own; a trial puts that directory first on the server's `PYTHONPATH` (and the
directories of its native libraries, `lib*.so*`, first on `LD_LIBRARY_PATH`), so the node's own
environment is never written and the next trial without the pin is the node as it is.
`--no-deps`: the pin replaces one package and keeps everything it depends on as the node has
it, which is what "was it the NCCL wheel?" asks.

The cache (`runs_dir/.cache/overlays/<key>`) is shared by every run and node on that path:

- one directory per (pin, interpreter tag, package source): built once, under an exclusive lock
  (two nodes asking for the same overlay build it once), into a temporary directory that is
  renamed into place only when pip succeeded and the distribution is there, so a crash or a
  failed build never leaves a half-made overlay;
- `.state/<key>.json` says what an intact overlay holds (pin, version, native libraries, size,
  the file pip installed it from with its sha256, and a signature of its files); its mtime is
  the overlay's last use;
- checked when reused (`integrity.py`: the signature, then the wheel's RECORD when it
  differs): a damaged overlay is rebuilt, and one that cannot be is one line naming it;
- pip runs isolated from its own configuration when a source is configured (`pipcall.py`), and
  the key holds pip's configuration when none is, so an overlay is never reused for a pin that
  would now be installed from elsewhere;
- bounded: past `max_bytes` the least recently used overlays are removed, never one a trial
  holds (a shared `.use` lock, as the worktree cache does).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from orchestrator.packages import integrity, pipcall
from orchestrator.packages.pipcall import OverlayError, interpreter_tag, one_line
from orchestrator.util.files import write_atomic
from orchestrator.util.pins import canonical, format_pin, parse_pin
from orchestrator.workspace.cache import disk_usage
from orchestrator.workspace.locking import (
    LOCKS_DIRNAME,
    STATE_DIRNAME,
    TEMP_PREFIX,
    exclusive_lock,
    release,
    shared_lock,
    try_exclusive,
)

OVERLAYS_DIRNAME = "overlays"
_KEY = re.compile(r"[0-9a-f]{64}")
# A native shared library (`libnccl.so.2`), as opposed to a Python extension module
# (`_C.cpython-311-x86_64-linux-gnu.so`): the dynamic linker finds these by name.
_NATIVE = re.compile(r"^lib[^/]+\.so(?:\.\d+)*$")
# Bumped when what a key stands for changes: version 2 is pip run isolated from its own
# configuration (an overlay built before could hold a distribution from a pip.conf's source).
_KEY_VERSION = 2


@dataclass(frozen=True)
class OverlaySettings:
    """Where overlays live and where pip takes them from (plain values: they cross Ray)."""

    root: str
    find_links: tuple[str, ...] = ()
    index_url: str = ""
    pip_args: tuple[str, ...] = ()
    max_bytes: int | None = None
    timeout_s: float = 1800.0

    @property
    def offline(self) -> bool:
        """A wheel directory and no index: pip never touches the network."""
        return bool(self.find_links) and not self.index_url

    @property
    def configured(self) -> bool:
        """The user named a package source (a wheel directory or an index, as a setting or in
        `pip_args`): then it alone is used, pip's own configuration is not."""
        links, indexes = pipcall.pip_arg_sources(self.pip_args)
        return bool(self.find_links or self.index_url or links or indexes)

    def source_args(self) -> list[str]:
        args: list[str] = []
        for d in self.find_links:
            args += ["--find-links", d]
        if self.offline:
            args.append("--no-index")
        elif self.index_url:
            args += ["--index-url", self.index_url]
        return args + list(self.pip_args)

    def source_id(self) -> str:
        return json.dumps({"find_links": list(self.find_links), "index_url": self.index_url,
                           "pip_args": list(self.pip_args)}, sort_keys=True)

    def to_json(self) -> dict:
        return {"root": self.root, "find_links": list(self.find_links),
                "index_url": self.index_url, "pip_args": list(self.pip_args),
                "max_bytes": self.max_bytes, "timeout_s": self.timeout_s}

    @classmethod
    def from_json(cls, doc: Mapping) -> OverlaySettings:
        return cls(str(doc["root"]), tuple(str(d) for d in doc.get("find_links") or ()),
                   str(doc.get("index_url") or ""), tuple(str(a) for a in doc.get("pip_args") or ()),
                   doc.get("max_bytes"), float(doc.get("timeout_s") or 1800.0))


@dataclass(frozen=True)
class Overlay:
    """One built overlay: `path` goes on PYTHONPATH, `path/<d>` for each of `lib_dirs` on
    LD_LIBRARY_PATH."""

    pin: str
    path: Path
    version: str
    lib_dirs: tuple[str, ...] = ()
    libraries: tuple[str, ...] = ()  # basenames of its native libraries
    size_bytes: int = 0
    origin: str = ""  # the file pip installed it from (a URL)
    sha256: str = ""  # that file's sha256
    repaired: str = ""  # why it was rebuilt when this lease found it damaged

    def source(self) -> dict:
        """What it was installed from, as findings record it."""
        doc = {"file": self.origin, "sha256": self.sha256}
        if self.repaired:
            doc["rebuilt"] = self.repaired
        return doc

    @property
    def name(self) -> str:
        return self.pin.split("==", 1)[0]

    def library_paths(self) -> list[str]:
        return [str(self.path / d) for d in self.lib_dirs]


def _dist_version(directory: Path, name: str) -> str | None:
    """The version of distribution `name` installed in `directory` (from its METADATA)."""
    for info in directory.glob("*.dist-info"):
        meta = info / "METADATA"
        try:
            text = meta.read_text(errors="replace")
        except OSError:
            continue
        fields = dict(_header(text))
        if canonical(fields.get("Name", "")) == name:
            return fields.get("Version")
    return None


def _header(text: str):
    for line in text.splitlines():
        if not line.strip():
            return
        key, sep, value = line.partition(":")
        if sep:
            yield key.strip(), value.strip()


def _native_libraries(directory: Path) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(directories relative to `directory` holding native libraries, their basenames)."""
    dirs: dict[str, None] = {}
    names: dict[str, None] = {}
    for root, _subdirs, files in os.walk(directory):
        for f in files:
            if _NATIVE.match(f):
                dirs[str(Path(root).relative_to(directory))] = None
                names[f] = None
    return tuple(sorted(dirs)), tuple(sorted(names))


class OverlayCache:
    def __init__(self, settings: OverlaySettings):
        self.settings = settings
        self.root = Path(settings.root)

    def key(self, pin: str, python: str) -> str:
        """The pin, the interpreter's tag and where pip takes it from: the configured source
        (pip isolated from its own configuration), or else pip's configuration itself."""
        pip = "isolated" if self.settings.configured else pipcall.configuration(python)
        blob = json.dumps({"pin": pin, "python": interpreter_tag(python),
                           "source": self.settings.source_id(), "pip": pip,
                           "version": _KEY_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()

    def _state_path(self, key: str) -> Path:
        return self.root / STATE_DIRNAME / f"{key}.json"

    def _use_path(self, key: str) -> Path:
        return self.root / LOCKS_DIRNAME / f"{key}.use"

    def _read(self, key: str) -> Overlay | None:
        try:
            doc = json.loads(self._state_path(key).read_text())
        except (OSError, ValueError):
            return None
        path = self.root / key
        if not isinstance(doc, dict) or not path.is_dir():
            return None
        return Overlay(str(doc["pin"]), path, str(doc["version"]), tuple(doc.get("lib_dirs", ())),
                       tuple(doc.get("libraries", ())), int(doc.get("size_bytes") or 0),
                       str(doc.get("origin") or ""), str(doc.get("sha256") or ""))

    def _write_state(self, key: str, doc: Mapping) -> None:
        state = self._state_path(key)
        state.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(state, json.dumps(dict(doc)))

    def damage(self, key: str, overlay: Overlay) -> str:
        """Why a cached overlay is not what pip installed (`integrity.check`), or "": its
        signature first, the RECORD only when that differs (then kept, when it passes)."""
        try:
            doc = json.loads(self._state_path(key).read_text())
        except (OSError, ValueError):
            return "its state file is unreadable"
        now = integrity.signature(overlay.path)
        if doc.get("signature") == now:
            return ""
        why = integrity.check(overlay.path, overlay.name)
        if not why:
            self._write_state(key, {**doc, "signature": now})
        return why

    def ensure(self, pin: str, python: str = sys.executable) -> Overlay:
        """The overlay of `pin` for `python`: the cached one when it is intact, else built (or
        rebuilt) now. A damaged overlay that cannot be rebuilt is one line naming it."""
        name, version = parse_pin(pin)
        pin = format_pin(name, version)
        key = self.key(pin, python)
        found = self._read(key)
        if found is not None and not self.damage(key, found):
            return found
        with exclusive_lock(self.root / LOCKS_DIRNAME / f"{key}.lock"):
            found = self._read(key)  # another node built (or repaired) it meanwhile
            why = self.damage(key, found) if found is not None else ""
            if found is not None and not why:
                return found
            try:
                overlay = self._build(key, pin, python)
            except OverlayError as exc:
                if not why:
                    raise
                raise OverlayError(f"the cached overlay of {pin} ({self.root / key}) is damaged"
                                   f" ({why}) and could not be rebuilt: {exc}") from exc
            if why:
                overlay = replace(overlay, repaired=why)
        self.evict(keep=key)
        return overlay

    def _pip(self, python: str, target: Path, pin: str, report: Path,
             ) -> subprocess.CompletedProcess:
        args = ["--no-deps", "--target", str(target), "--disable-pip-version-check",
                "--no-input", "--no-warn-script-location", "--progress-bar", "off",
                *self.settings.source_args(), pin]
        try:
            return pipcall.run(python, args, isolated=self.settings.configured, report=report,
                               timeout_s=self.settings.timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise OverlayError(f"pip did not install {pin} within"
                               f" {self.settings.timeout_s:g}s") from exc
        except OSError as exc:
            raise OverlayError(f"cannot run {python}: {exc}") from exc

    def _build(self, key: str, pin: str, python: str) -> Overlay:
        name, version = parse_pin(pin)
        self.root.mkdir(parents=True, exist_ok=True)
        temp = self.root / f"{TEMP_PREFIX}{key}-{os.getpid()}-{secrets.token_hex(4)}"
        report = temp.with_name(temp.name + ".report.json")
        final = self.root / key
        try:
            done = self._pip(python, temp, pin, report)
            if done.returncode != 0:
                raise OverlayError(one_line(done.stderr or done.stdout))
            got = _dist_version(temp, name)
            if got is None:
                raise OverlayError(f"pip installed {pin} but no distribution named {name} is in"
                                   " the overlay")
            source = pipcall.installed_from(report, name, canonical)
            lib_dirs, libraries = _native_libraries(temp)
            size = disk_usage(temp)
            shutil.rmtree(final, ignore_errors=True)  # one left without its state, or damaged
            os.replace(temp, final)
        finally:
            shutil.rmtree(temp, ignore_errors=True)
            report.unlink(missing_ok=True)
        self._write_state(key, {"pin": pin, "version": got, "lib_dirs": list(lib_dirs),
                                "libraries": list(libraries), "size_bytes": size,
                                "python": interpreter_tag(python), "origin": source["file"],
                                "sha256": source["sha256"],
                                "signature": integrity.signature(final)})
        return Overlay(pin, final, got, lib_dirs, libraries, size, source["file"],
                       source["sha256"])

    # -- use and the size cap -------------------------------------------------------------------
    def hold(self, overlays: Sequence[Overlay]) -> list[int]:
        """Shared `.use` locks on `overlays` (the size cap leaves them alone) and mark them used
        now; hand the result to :meth:`release_held`."""
        held = []
        for o in overlays:
            held.append(shared_lock(self._use_path(o.path.name)))
            try:
                os.utime(self._state_path(o.path.name))
            except OSError:
                pass
        return held

    @staticmethod
    def release_held(held: Sequence[int]) -> None:
        for descriptor in held:
            release(descriptor)

    def entries(self) -> list[tuple[float, str, int]]:
        """(last use, key, bytes) of every finished overlay."""
        out = []
        if not self.root.is_dir():
            return out
        for entry in self.root.iterdir():
            if not _KEY.fullmatch(entry.name):
                continue  # temporary builds, locks, state
            try:
                used = self._state_path(entry.name).stat().st_mtime
            except OSError:
                used = 0.0
            found = self._read(entry.name)
            out.append((used, entry.name, found.size_bytes if found else disk_usage(entry)))
        return out

    def evict(self, keep: str = "") -> list[str]:
        """Remove least recently used overlays until the cache fits `max_bytes`; never `keep`
        and never one a trial holds. Returns the keys removed."""
        limit = self.settings.max_bytes
        if limit is None:
            return []
        entries = sorted(self.entries())
        total = sum(size for _, _, size in entries)
        removed = []
        for _, key, size in entries:
            if total <= limit:
                break
            if key == keep:
                continue
            use = try_exclusive(self._use_path(key))
            if use is None:
                continue  # a trial runs with it
            try:
                with exclusive_lock(self.root / LOCKS_DIRNAME / f"{key}.lock"):
                    self._state_path(key).unlink(missing_ok=True)
                    shutil.rmtree(self.root / key, ignore_errors=True)
            finally:
                release(use, self._use_path(key))
            total -= size
            removed.append(key)
        return removed


@dataclass
class OverlaySet:
    """The overlays of one candidate's pins, held until :meth:`release`."""

    cache: OverlayCache
    overlays: list[Overlay]
    held: list[int] = field(default_factory=list)

    @classmethod
    def lease(cls, settings: OverlaySettings, pins: Mapping[str, str], python: str) -> OverlaySet:
        """Build (if need be) and hold the overlays of `pins`. One removed by another node's
        size cap between its build and this hold is built again."""
        cache = OverlayCache(settings)
        for _ in range(3):
            overlays = [cache.ensure(format_pin(n, v), python) for n, v in sorted(pins.items())]
            held = cache.hold(overlays)
            if all(cache._read(o.path.name) is not None for o in overlays):
                return cls(cache, overlays, held)
            cache.release_held(held)
        raise OverlayError("the overlays of " + ", ".join(sorted(pins)) + " keep being removed"
                           " by the cache's size cap: raise packages.max_gb")

    def variables(self, env: Mapping[str, str]) -> dict[str, str]:
        """`PYTHONPATH` and `LD_LIBRARY_PATH` with the overlays first, before what `env` has."""
        out = {}
        python = [str(o.path) for o in self.overlays]
        out["PYTHONPATH"] = os.pathsep.join([*python, *filter(None, [env.get("PYTHONPATH")])])
        libs = [p for o in self.overlays for p in o.library_paths()]
        if libs:
            out["LD_LIBRARY_PATH"] = os.pathsep.join(
                [*libs, *filter(None, [env.get("LD_LIBRARY_PATH")])])
        return out

    def release(self) -> None:
        self.cache.release_held(self.held)
        self.held = []
