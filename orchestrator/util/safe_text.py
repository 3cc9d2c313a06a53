"""Repository text made safe to print: no terminal control sequences, ever.

Commit subjects, author names, refs, patch file names and server log lines are written by
other people. A subject holding `ESC ] 0 ; title BEL` retitles the user's terminal, `ESC [ 31 m`
colours it, a carriage return overwrites the line before it, a bidi override reorders what is
shown. `printable` drops all of that, whole escape sequences rather than just their ESC byte,
so what remains is the visible text. It is applied where such text enters sleuth (the commit
log, a trial's failure detail and log tail) and again where sleuth writes for people (the
console, the error line, report.md / report.html), so a path that skips one still meets the
other.
"""

from __future__ import annotations

import re

# ESC-introduced sequences (ECMA-48): CSI `ESC [ ... final`, OSC/DCS/SOS/PM/APC strings up to
# BEL or ST, and two-byte escapes; and their 8-bit C1 forms (CSI is U+009B, OSC U+009D).
_ESCAPES = re.compile(
    r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"  # CSI
    r"|(?:\x1b[\]P^_X]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # strings
    r"|\x1b[ -/]*[0-~]?"  # other escapes (ESC c, ESC ( B, a lone ESC)
)
# What is left to drop: C0 controls but tab and newline, DEL, C1 controls, and the Unicode
# bidi embeddings/overrides/isolates ("Trojan source") and line/paragraph separators.
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069"
                       r"\u2028\u2029]")


def printable(text: object, *, newlines: bool = True) -> str:
    """`text` without control characters or escape sequences.

    Tabs survive; newlines survive unless `newlines=False` (then each becomes a space), and a
    CRLF line end counts as a newline rather than a stray carriage return."""
    s = str(text)
    if s.isprintable() and "\x1b" not in s:  # the common case costs one scan
        return s
    s = s.replace("\r\n", "\n")
    s = _ESCAPES.sub("", s)
    s = _CONTROLS.sub("", s)
    return s if newlines else s.replace("\n", " ")


# An error line is read by a person: a word longer than this (a 100,000-character key typed by
# mistake, a pasted blob) is shown by its two ends, and the whole line by its beginning.
LONG_WORD = 160
LONG_LINE = 2000


def readable(line: str, word: int = LONG_WORD, total: int = LONG_LINE) -> str:
    """`line` with each word longer than `word` characters cut to its start and end around an
    ellipsis that says how long it was, and the line itself cut at `total` characters."""
    def cut(match: re.Match) -> str:
        text = match.group(0)
        return f"{text[:word * 2 // 3]}…{text[-word // 4:]} ({len(text):,} characters)"

    out = re.sub(rf"[^\s'\"]{{{word + 1},}}", cut, line)  # inside quotes too
    return out if len(out) <= total else out[:total - 1] + "…"
