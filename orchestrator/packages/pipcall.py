"""How an overlay's pip is run: from exactly the configured package source, and saying what it
installed.

**Isolation.** When the user names a package source (`packages.find_links`,
`packages.index_url`), that source alone is what an overlay may be installed from: the cache
key, the findings and the release listing all name it. pip has its own configuration on top of
its arguments, and any of it can add a source (`find-links`, `extra-index-url`) or a
constraint. pip's `--isolated` ignores the `PIP_*` variables and the *user's* files only: the
global files (`/etc/pip.conf`, `$XDG_CONFIG_DIRS/pip/pip.conf`), the interpreter's *site* file
(`sys.prefix/pip.conf`, a virtual environment's own) and a file named by `PIP_CONFIG_FILE` are
still read (pip's `configuration.py`: `iter_config_files` yields GLOBAL and SITE whatever
`isolated` says, and reads `PIP_CONFIG_FILE` from the environment directly). What pip documents
for "no configuration file at all" is `PIP_CONFIG_FILE=os.devnull` (`_load_config_files`
returns before reading any). So with a source configured pip runs with both, and every `PIP_*`
variable taken out of its environment; what it needs beyond the source (a certificate, a
second index) goes in `packages.pip_args`.

Without a configured source, pip's own configuration *is* the source (as documented): the
overlay's cache key then includes that configuration as `pip config list` prints it for the
interpreter, so a changed `pip.conf` builds a new overlay instead of reusing one installed
from elsewhere under the same key.

**What it installed.** `pip install --report FILE` (pip >= 22.2) writes, for each distribution,
the file it came from and its sha256 (`download_info.url`, `archive_info.hashes`): kept with
the overlay and recorded in every trial that uses it, so a finding names the wheel it
measured, not only the directory it was asked to look in.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path


class OverlayError(Exception):
    """An overlay could not be built (pip or its interpreter failed); the message is the
    reason in one line."""


_TAGS: dict[str, str] = {}
_TAG_CODE = ("import sys, sysconfig; print(sys.implementation.cache_tag, sysconfig.get_platform(),"
             " sys.maxsize > 2**32)")


def interpreter_tag(python: str) -> str:
    """What makes an overlay usable by an interpreter: its implementation and version, and its
    platform (`cpython-311 linux-x86_64`). Two virtual environments of one Python share
    overlays; another Python gets its own."""
    if python in _TAGS:
        return _TAGS[python]
    if python == sys.executable:
        import sysconfig

        tag = f"{sys.implementation.cache_tag} {sysconfig.get_platform()} {sys.maxsize > 2**32}"
    else:
        try:
            done = subprocess.run([python, "-c", _TAG_CODE], capture_output=True, text=True,
                                  timeout=60, check=False, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise OverlayError(f"cannot run the interpreter {python}: {exc}") from exc
        if done.returncode != 0:
            raise OverlayError(f"cannot run the interpreter {python}: {one_line(done.stderr)}")
        tag = done.stdout.strip()
    _TAGS[python] = tag
    return tag


def one_line(output: str, limit: int = 400) -> str:
    """pip's reason: its first `ERROR:` line (without the prefix), else its last line."""
    lines = [ln.strip() for ln in (output or "").splitlines() if ln.strip()]
    errors = [ln[len("ERROR:"):].strip() for ln in lines if ln.startswith("ERROR:")]
    text = errors[0] if errors else (lines[-1] if lines else "no output")
    return text[:limit]


# pip settings that would send an install elsewhere than the overlay directory.
PIP_ENV_DROPPED = ("PIP_TARGET", "PIP_PREFIX", "PIP_ROOT", "PIP_USER", "PYTHONPATH")


def environment(isolated: bool, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """pip's environment: without the variables that move an install, and isolated (no
    `PIP_*` variable, no configuration file) when a source is configured."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in PIP_ENV_DROPPED}
    if isolated:
        env = {k: v for k, v in env.items() if not k.startswith("PIP_")}
        env["PIP_CONFIG_FILE"] = os.devnull
    return env


def pip_arg_sources(args: Sequence[str]) -> tuple[list[str], list[str]]:
    """(find-links, indexes) named in pip arguments (`--find-links D`, `-f D`, `--x=y`)."""
    links, indexes = [], []
    items = list(args)
    i = 0
    while i < len(items):
        arg = items[i]
        key, eq, value = arg.partition("=")
        if not eq and key in ("--find-links", "-f", "--extra-index-url", "--index-url", "-i") \
                and i + 1 < len(items):
            value = items[i + 1]
            i += 1
        if key in ("--find-links", "-f"):
            links.append(value)
        elif key in ("--extra-index-url", "--index-url", "-i"):
            indexes.append(value)
        i += 1
    return links, indexes


def flags(isolated: bool) -> list[str]:
    return ["--isolated"] if isolated else []


_CONFIGS: dict[tuple[str, str], str] = {}


def configuration(python: str) -> str:
    """pip's own configuration for `python` as `pip config list` prints it (its files and its
    `PIP_*` variables): what an overlay without a configured source is installed from. Falls
    back on the `PIP_*` variables alone where the interpreter has no pip."""
    env = environment(False)
    seen = json.dumps(sorted((k, v) for k, v in env.items() if k.startswith("PIP_")))
    cached = _CONFIGS.get((python, seen))
    if cached is not None:
        return cached
    lines = config_lines(python, env)
    if lines is None:
        lines = sorted(f":env:.{k[4:].lower().replace('_', '-')}={v}" for k, v in env.items()
                       if k.startswith("PIP_"))
    text = "\n".join(lines)
    _CONFIGS[(python, seen)] = text
    return text


def config_lines(python: str, env: Mapping[str, str] | None = None) -> list[str] | None:
    """`pip config list` of `python` (None when it has no pip or it fails)."""
    try:
        done = subprocess.run([python, "-m", "pip", "config", "list"], capture_output=True,
                              text=True, timeout=60, env=None if env is None else dict(env),
                              stdin=subprocess.DEVNULL, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.splitlines() if done.returncode == 0 else None


def run(python: str, args: Sequence[str], *, isolated: bool, report: Path, timeout_s: float,
        ) -> subprocess.CompletedProcess:
    """`python -m pip install ...` with `args`, isolated when asked, writing its installation
    report to `report`. An interpreter without pip of its own is installed for by this one's
    pip (`--python`); a pip too old for `--report` runs without it (the source of what it
    installed is then not known, and the overlay says so). Raises subprocess.TimeoutExpired
    and OSError as subprocess.run does."""
    env = environment(isolated)
    pip = [python, "-m", "pip"]

    def install(with_report: bool) -> subprocess.CompletedProcess:
        argv = [*pip, "install", *flags(isolated),
                *(["--report", str(report)] if with_report else []), *args]
        return subprocess.run(argv, capture_output=True, text=True, env=env,
                              timeout=timeout_s, check=False, stdin=subprocess.DEVNULL)

    done = install(True)
    if done.returncode != 0 and python != sys.executable and "No module named pip" in done.stderr:
        pip = [sys.executable, "-m", "pip", "--python", python]
        done = install(True)
    if done.returncode != 0 and "no such option: --report" in done.stderr:
        done = install(False)
    return done


def installed_from(report: Path, name: str, canonical) -> dict:
    """`{"file": URL, "sha256": HEX}` of distribution `name` from pip's installation report,
    or `{"file": "", "sha256": "", "why": ...}` when the report does not say."""
    try:
        doc = json.loads(report.read_text())
    except (OSError, ValueError):
        return {"file": "", "sha256": "", "why": "pip wrote no installation report (pip older"
                " than 22.2)"}
    for item in doc.get("install") or []:
        meta = item.get("metadata") or {}
        if canonical(str(meta.get("name", ""))) != name:
            continue
        info = item.get("download_info") or {}
        archive = info.get("archive_info") or {}
        digest = (archive.get("hashes") or {}).get("sha256", "")
        if not digest and str(archive.get("hash", "")).startswith("sha256="):
            digest = archive["hash"].split("=", 1)[1]
        url = str(info.get("url", ""))
        if not digest and url.startswith("file://"):
            digest = file_sha256(Path(url[len("file://"):]))
        return {"file": url, "sha256": digest}
    return {"file": "", "sha256": "", "why": f"pip's report names no {name}"}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return ""
    return digest.hexdigest()
