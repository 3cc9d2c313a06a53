"""Write a wheel (PEP 427) from a mapping of files: for a scenario's simulated node, whose
package cache holds the versions it ran before, and for builds without a build backend.

The result is an ordinary `py3-none-any` wheel that pip installs like any other (METADATA,
WHEEL and a RECORD with every file's sha256 and size).
"""

from __future__ import annotations

import base64
import hashlib
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path


def _escape(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name)


def _record_line(path: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{path},sha256={digest},{len(data)}"


def write_wheel(out_dir: Path, name: str, version: str, files: Mapping[str, str | bytes],
                summary: str = "") -> Path:
    """`out_dir/<name>-<version>-py3-none-any.whl` holding `files` (archive path -> content)."""
    dist = _escape(name)
    info = f"{dist}-{version}.dist-info"
    contents = {path: (data.encode() if isinstance(data, str) else data)
                for path, data in files.items()}
    contents[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                    f"Summary: {summary or name}\n").encode()
    contents[f"{info}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: sleuth\n"
                                 b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    tops = sorted({p.split("/", 1)[0].removesuffix(".py") for p in files})
    contents[f"{info}/top_level.txt"] = ("\n".join(tops) + "\n").encode()
    record = [_record_line(p, d) for p, d in contents.items()] + [f"{info}/RECORD,,"]
    contents[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for member, data in contents.items():
            zf.writestr(member, data)
    return path
