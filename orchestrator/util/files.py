"""Writing a small file so that a reader sees the old contents or the new, never a part.

A run directory, a node's state files and the caches are read by other processes (a report,
the next node actor, a second run) while they are written, and a full disk or a kill can stop a
write midway: the text goes to a temporary file of a name no other writer uses, which then
replaces the file in one rename; a failed write leaves no temporary behind.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def write_atomic(path: Path, text: str) -> None:
    """`path` holds `text`, or (on an error, which is raised) what it held before."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
