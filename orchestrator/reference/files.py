"""Which log files a `log:` reference reads, and in which order.

`reference=log:PATH` takes several paths joined by commas, shell-style globs and directories
(every `*.log*` file in one), and reads `.gz` files as they are. Logs get rotated (`server.log`,
`server.log.1`, `server.log.2.gz`): the files are read oldest first, by the first timestamp each
holds, and by the rotation number (a higher number is older) for one that holds none. Lines
keep their order within a file: NCCL's lines carry no timestamp and belong where they stand.
"""

from __future__ import annotations

import glob
import gzip
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.reference.lines import split_prefix

_ROTATED = re.compile(r"\.(\d+)(?:\.gz)?$")
_SCAN = 5000  # lines read to find a file's first timestamp


@dataclass(frozen=True)
class LogFile:
    """One file of the log: where it is, its rotation number, its first timestamp, and the
    year its dates mean when they print none (the file's modification year)."""

    path: Path
    rotation: int
    first_stamp: float | None
    year: int


def expand(spec: str) -> list[Path]:
    """The files `spec` names (comma-separated paths, globs, directories), each once; a name
    that matches nothing is bad input (one line)."""
    found: list[Path] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        path = Path(part).expanduser()
        if any(ch in part for ch in "*?["):
            matches = sorted(Path(m) for m in glob.glob(str(path)))
            if not matches:
                raise UserError(f"log:{part}: no file matches")
        elif path.is_dir():
            matches = sorted(p for p in path.iterdir() if p.is_file() and ".log" in p.name)
            if not matches:
                raise UserError(f"log:{part}: the directory holds no *.log* file")
        elif path.is_file():
            matches = [path]
        else:
            raise UserError(f"log:{part}: no such file")
        found += [m.resolve() for m in matches if m.is_file()]
    if not found:
        raise UserError("reference=log: names no file: reference=log:PATH[,PATH...]")
    return list(dict.fromkeys(found))


def read_lines(path: Path) -> Iterator[str]:
    """The lines of one file, a `.gz` one decompressed; undecodable bytes replaced."""
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rt", encoding="utf-8", errors="replace") as f:
                for line in f:
                    yield line.rstrip("\r\n")
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                for line in f:
                    yield line.rstrip("\r\n")
    except (OSError, EOFError) as exc:
        raise UserError(f"log:{path}: cannot be read ({exc})") from exc


def _describe(path: Path) -> LogFile:
    m = _ROTATED.search(path.name)
    rotation = int(m.group(1)) if m else 0
    try:
        year = datetime.fromtimestamp(path.stat().st_mtime, UTC).year
    except OSError:
        year = 1970
    first = None
    for i, line in enumerate(read_lines(path)):
        if i >= _SCAN:
            break
        stamp = split_prefix(line, year).stamp
        if stamp is not None:
            first = stamp
            break
    return LogFile(path, rotation, first, year)


def ordered(spec: str) -> list[LogFile]:
    """The files of `spec`, oldest first."""
    files = [_describe(p) for p in expand(spec)]
    return sorted(files, key=lambda f: (f.first_stamp is None,
                                        f.first_stamp if f.first_stamp is not None else 0.0,
                                        -f.rotation, f.path.name))
