"""Package pins: `name==version`, the level of the `packages` factor.

A pin names one distribution and one exact version (`flashinfer-python==0.2.3`). Nothing looser:
a candidate must say exactly what it runs, and a range would let two trials of one candidate
install two different versions. Names are compared in their normalized form (PEP 503: lower
case, runs of `-`, `_`, `.` as one `-`), so `Flashinfer_Python==0.2.3` and
`flashinfer-python==0.2.3` are one level.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from orchestrator.errors import UserError

_NAME = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?$")
# PEP 440 public versions with an optional local part (`2.9.1+cu128`); nothing a shell, a URL
# or a requirement marker could hide in.
_VERSION = re.compile(r"^(?:\d+!)?\d+(?:\.\d+)*(?:[-_.]?(?:a|b|rc|alpha|beta|c|pre|preview)\d*)?"
                      r"(?:[-_.]?(?:post|rev|r)\d*)?(?:[-_.]?dev\d*)?(?:\+[A-Za-z0-9.]+)?$",
                      re.IGNORECASE)


def canonical(name: str) -> str:
    """PEP 503 normalized name: `Flashinfer_Python` -> `flashinfer-python`."""
    return re.sub(r"[-_.]+", "-", str(name)).lower()


def check_version(name: str, version: object) -> str:
    text = str(version).strip()
    if not _VERSION.match(text):
        raise UserError(f"package {name}: {text!r} is not an exact version (write {name}==1.2.3)")
    return text


def parse_pin(text: object) -> tuple[str, str]:
    """`"flashinfer-python==0.2.3"` -> (`flashinfer-python`, `0.2.3`); UserError otherwise."""
    raw = str(text).strip()
    name, sep, version = raw.partition("==")
    if not sep or version.startswith("="):
        raise UserError(f"package pin {raw!r}: write name==version (an exact version, e.g."
                        " flashinfer-python==0.2.3)")
    name = name.strip()
    if not _NAME.match(name):
        raise UserError(f"package pin {raw!r}: {name!r} is not a package name")
    return canonical(name), check_version(name, version)


def pins_of(raw: object) -> dict[str, str]:
    """Pins from a list of `name==version` strings, or a `{name: version}` mapping, as
    `{canonical name: version}`. A package pinned twice is refused."""
    if raw is None:
        return {}
    if isinstance(raw, str):
        raw = [raw] if raw.strip() else []
    out: dict[str, str] = {}
    items: Iterable[tuple[str, str]]
    if isinstance(raw, Mapping):
        items = []
        for name, version in raw.items():
            if not _NAME.match(str(name)):
                raise UserError(f"packages: {name!r} is not a package name")
            items.append((canonical(str(name)), check_version(str(name), version)))
    else:
        items = [parse_pin(p) for p in raw]
    for name, version in items:
        if name in out and out[name] != version:
            raise UserError(f"package {name} is pinned twice ({out[name]} and {version})")
        out[name] = version
    return dict(sorted(out.items()))


def format_pin(name: str, version: str) -> str:
    return f"{name}=={version}"


def pin_list(pins: Mapping[str, str]) -> tuple[str, ...]:
    """Sorted `name==version` strings (the form a candidate stores)."""
    return tuple(format_pin(n, v) for n, v in sorted(pins.items()))
