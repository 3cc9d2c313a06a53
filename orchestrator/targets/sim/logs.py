"""SGLang-shaped log output on stderr, one flushed line at a time.

SGLang's scheduler/TP worker processes log with `[%Y-%m-%d %H:%M:%S TP0] ` and the main
(HTTP/tokenizer) process with `[%Y-%m-%d %H:%M:%S] `; parsers match either. Lines are flushed
immediately because the orchestrator tails the log while the server runs.
"""

from __future__ import annotations

import sys
import threading
import time
import traceback
from typing import TextIO

LEVELS = {"debug": 10, "info": 20, "warning": 30, "error": 40, "critical": 50}


class SimLog:
    def __init__(self, level: str = "info", stream: TextIO | None = None):
        self.level = LEVELS.get(level.lower(), 20)
        self.stream = stream or sys.stderr
        self._lock = threading.Lock()

    def _write(self, level: int, message: str, tp: bool) -> None:
        if level < self.level:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        prefix = f"[{stamp} TP0] " if tp else f"[{stamp}] "
        text = "".join(f"{prefix}{line}\n" for line in message.splitlines() or [""])
        with self._lock:
            try:
                self.stream.write(text)
                self.stream.flush()
            except (OSError, ValueError):
                pass

    # scheduler / model-runner lines (TP0 prefix)
    def tp(self, message: str, level: str = "info") -> None:
        self._write(LEVELS[level], message, tp=True)

    # main-process lines (no TP prefix)
    def main(self, message: str, level: str = "info") -> None:
        self._write(LEVELS[level], message, tp=False)

    def raw(self, text: str) -> None:
        """Unprefixed text (Python tracebacks, uvicorn's own messages)."""
        with self._lock:
            try:
                self.stream.write(text if text.endswith("\n") else text + "\n")
                self.stream.flush()
            except (OSError, ValueError):
                pass


def traceback_text(exc_type: str, message: str, frames: list[tuple[str, int, str, str]]) -> str:
    """A Python-style traceback for an error the simulated code 'raises' (no real exception)."""
    lines = ["Traceback (most recent call last):"]
    for filename, lineno, func, source in frames:
        lines.append(f'  File "{filename}", line {lineno}, in {func}')
        lines.append(f"    {source}")
    lines.append(f"{exc_type}: {message}")
    return "\n".join(lines) + "\n"


def format_exception(exc: BaseException) -> str:
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
