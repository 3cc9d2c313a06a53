"""The `sleuth` commands README.md and docs/*.md show, read as a reader reads them.

The documents are parsed with markdown-it-py (CommonMark; rich already depends on it), so a
command is found exactly where a renderer shows it: in a fenced code block, or in an inline code
span. A fenced line is split the way a POSIX shell splits it (`shlex`: quotes, `\\`
continuations, `#` comments), and a `$ ` prompt or a `.venv/bin/` prefix is taken off, so the
test runs the words the shell would hand to `sleuth`.

- **commands**: every `sleuth ...` line of a fenced block, in order, grouped by block (the lines
  of one block are one story: a scenario, then a trial in it, then an investigation);
- **forms**: inline code spans that start with `sleuth <command>`, the syntax prose refers to
  (`sleuth resume RUN`): not runnable as written, but their command and keys must exist.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


@dataclass(frozen=True)
class Command:
    """One documented command: where it is, the text as written (continuations joined), and
    the words the shell would pass to `sleuth` (without the `sleuth` itself)."""

    doc: str  # README.md, docs/packages.md
    line: int  # 1-based line of its block or span
    text: str
    words: tuple[str, ...]

    @property
    def key(self) -> str:
        """The command as the case table names it: `sleuth` and its words, one space apart."""
        return " ".join(("sleuth", *self.words))


@dataclass(frozen=True)
class Block:
    doc: str
    line: int
    commands: tuple[Command, ...]

    @property
    def id(self) -> str:
        return f"{self.doc}:{self.line}"


def _shell_lines(content: str) -> list[str]:
    """The block's logical lines: a trailing backslash joins the next line, as in a shell."""
    lines, current = [], ""
    for raw in content.splitlines():
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        lines.append(current + raw)
        current = ""
    if current:
        lines.append(current)
    return lines


_SUBSTITUTION = re.compile(r"\$\(([^()]*)\)")


def _sleuth_words(line: str) -> tuple[str, ...] | None:
    """The words after `sleuth` if the line runs sleuth (prompt and venv prefix allowed). A
    command substitution `$(...)` stays one word, as the shell expands it into one."""
    stripped = line.strip()
    if stripped.startswith("$ "):
        stripped = stripped[2:]
    held = _SUBSTITUTION.sub(lambda m: "$(" + m.group(1).replace(" ", "\0") + ")", stripped)
    try:
        words = [w.replace("\0", " ") for w in shlex.split(held, comments=True)]
    except ValueError:
        return None
    if not words or Path(words[0]).name != "sleuth" or words[0] not in (
            "sleuth", ".venv/bin/sleuth"):
        return None
    return tuple(words[1:])


def _relative(path: Path) -> str:
    return str(path.relative_to(ROOT))


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of `path` that run `sleuth` at least once."""
    found = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        if token.type != "fence" or token.map is None:
            continue
        commands = []
        for line in _shell_lines(token.content):
            words = _sleuth_words(line)
            if words is not None:
                commands.append(Command(_relative(path), token.map[0] + 1, line.strip(), words))
        if commands:
            found.append(Block(_relative(path), token.map[0] + 1, tuple(commands)))
    return found


def forms(path: Path) -> list[Command]:
    """The inline code spans of `path` that show `sleuth <command> ...`."""
    found = []
    for token in MarkdownIt("commonmark").parse(path.read_text()):
        if token.type != "inline" or token.map is None:
            continue
        for child in token.children or []:
            if child.type == "code_inline" and child.content.startswith("sleuth "):
                try:
                    words = tuple(shlex.split(child.content)[1:])
                except ValueError:  # an unbalanced quote in prose: take it as written
                    words = tuple(child.content.split()[1:])
                found.append(Command(_relative(path), token.map[0] + 1, child.content, words))
    return found
