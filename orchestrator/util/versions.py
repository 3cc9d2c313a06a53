"""A release's version as a comparable triple (SGLang's releases, NCCL's, a package's)."""

from __future__ import annotations

import re

_VERSION = re.compile(r"^\s*v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.?post(\d+))?")


def parse_version(text: str | None) -> tuple[int, int, int] | None:
    """(major, minor, patch) of `0.5.15.post1`, `v0.5.9`, `0.5.3rc2`; None if unreadable."""
    if not text:
        return None
    m = _VERSION.match(str(text))
    if not m:
        return None
    return int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)
