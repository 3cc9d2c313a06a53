"""One log line at a time: what an SGLang server log line says, checked against the source.

Shapes (fixtures with the source line of each: `tests/fixtures/sglang_logs/README.md`):

- the prefix of `configure_logger` (`srt/utils/common.py`): `[%Y-%m-%d %H:%M:%S{ms}{ranks}] `,
  ranks ` DP0`, ` PP0`, ` TP0`, ` EP0` (`srt/managers/scheduler.py`); some releases print the
  date without the year (`%m-%d`) or add `LEVEL file.py:LINE: ` after the bracket;
- `server_args=` at start (`srt/entrypoints/engine.py`): 0.5.23 prints the dict of
  `ServerArgs.resolved_dict()`, older launchers the `ServerArgs(...)` repr with nested records
  (`CudaGraphConfig(...)`). Both are read with :mod:`ast`: literals with
  `ast.literal_eval`'s own rules, a record's constructor call as a dict of its keywords, a
  name (`inf`, an enum member printed bare) as its value or its text. Nothing is evaluated;
- `Decode batch, ...` and `Prefill batch, ...` (`scheduler_components/metrics_reporter.py`),
  read by name with :mod:`orchestrator.bench.sglang_log`;
- NCCL with `NCCL_DEBUG=INFO` (`src/debug.cc`): `host:pid:tid [dev] NCCL INFO <text>`, among
  them `NCCL version 2.27.5+cuda12.9` (`src/init.cc` showVersion), `NCCL_PROTO set by
  environment to LL128` (string settings, tuning code, no period) and `NCCL_MAX_NCHANNELS
  set by environment to 4.` (integer parameters, `src/misc/param.cc`, with a period);
- SGLang's GC watchdog (`--gc-warning-threshold-secs`, `srt/utils/common.py`):
  `LONG GARBAGE COLLECTION DETECTED | Generation 2 | Duration: 0.4123s | ...`;
- the user's own lines through `log.pattern` (a regex whose named groups are metrics).
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

_PREFIX = re.compile(
    r"^\[(?P<date>(?:\d{4}-)?\d{2}-\d{2}) (?P<time>\d{2}:\d{2}:\d{2})(?:[.,](?P<frac>\d{1,6}))?"
    r"(?P<ranks>(?: (?:DP|PP|TP|EP|CP|ATTN_TP|MOE_EP)\d+)*)\] "
    r"(?:(?:DEBUG|INFO|WARNING|WARN|ERROR|CRITICAL) (?:[\w./-]+:\d+: )?)?(?P<message>.*)$")
_NCCL = re.compile(r"^(?P<host>[^\s:]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] NCCL INFO "
                   r"(?P<text>.*)$")
_NCCL_VERSION = re.compile(r"^NCCL version (?P<version>\d+\.\d+\.\d+)(?P<suffix>[^\s+]*)"
                           r"(?:\+cuda(?P<cuda>[\d.]+))?")
_NCCL_ENV = re.compile(r"^(?P<var>NCCL_[A-Z0-9_]+) set by environment to (?P<value>.*?)\s*$")
_INT_WITH_PERIOD = re.compile(r"^-?\d+\.$")
_GC = re.compile(r"LONG GARBAGE COLLECTION DETECTED \| Generation (?P<gen>\S+) \| "
                 r"Duration: (?P<seconds>[0-9.]+)s")
SERVER_ARGS = "server_args="


class LogLineError(ValueError):
    """A line that says what it is (`server_args=...`) but cannot be read."""


@dataclass(frozen=True)
class Prefixed:
    """A line split at SGLang's prefix: epoch seconds of its timestamp (the log's local time
    read as UTC: only differences are used), whether the date had a year, the rank labels,
    and the message. `stamp` is None for a line without SGLang's prefix."""

    stamp: float | None
    ranks: str
    message: str
    year_known: bool = True


def split_prefix(raw: str, year: int | None = None) -> Prefixed:
    """The prefix of `raw`, if it has SGLang's; `year` completes a date printed without one."""
    m = _PREFIX.match(raw)
    if m is None:
        return Prefixed(None, "", raw)
    date = m.group("date")
    year_known = len(date) == 10
    if not year_known:
        date = f"{year or 1970:04d}-{date}"
    try:
        when = datetime.strptime(f"{date} {m.group('time')}", "%Y-%m-%d %H:%M:%S")
    except ValueError:
        return Prefixed(None, "", raw)
    stamp = when.replace(tzinfo=UTC).timestamp()
    frac = m.group("frac")
    if frac:
        stamp += int(frac) / 10 ** len(frac)
    return Prefixed(stamp, m.group("ranks").strip(), m.group("message"), year_known)


def server_args(message: str) -> tuple[str, dict] | None:
    """`("dict" | "repr", the arguments)` of a `server_args=` message; None for any other
    message. Raises LogLineError for one that cannot be read (cut short, say)."""
    if not message.startswith(SERVER_ARGS):
        return None
    text = message[len(SERVER_ARGS):].strip()
    node = _parse(text)
    if isinstance(node, ast.Dict):
        value = _value(node)
        form = "dict"
    elif isinstance(node, ast.Call) and not node.args:
        value = _value(node)
        form = "repr"
    else:
        raise LogLineError(f"server_args= holds neither a dict nor a ServerArgs(...) repr:"
                           f" {text[:60]!r}")
    if not isinstance(value, dict):
        raise LogLineError("server_args= could not be read as a mapping")
    return form, plain(value)


def _parse(text: str) -> ast.expr:
    """The expression `text` holds; reprs such as `<Mode.EXTEND: 1>` or `<object at 0x..>`,
    which no literal syntax covers, are read as their text when the first parse fails."""
    for attempt in (text, _quote_angles(text)):
        try:
            return ast.parse(attempt, mode="eval").body
        except (SyntaxError, ValueError, RecursionError):
            continue
    raise LogLineError(f"server_args= is not a readable literal (cut short?): {text[:60]!r}...")


def _quote_angles(text: str) -> str:
    """`text` with every `<...>` outside a string literal (an enum's or an object's repr,
    which may hold quotes of its own) turned into a string literal of itself."""
    out: list[str] = []
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch in "'\"":
            end = _string_end(text, i)
            out.append(text[i:end])
            i = end
        elif ch == "<":
            depth, j = 0, i
            while j < n:
                if text[j] in "'\"":
                    j = _string_end(text, j)
                    continue
                depth += {"<": 1, ">": -1}.get(text[j], 0)
                j += 1
                if depth == 0:
                    break
            out.append(repr(text[i:j]))
            i = j
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def _string_end(text: str, start: int) -> int:
    """The index after the string literal opening at `start` (or the end of the text)."""
    quote, i = text[start], start + 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return len(text)


_NAMES = {"inf": math.inf, "nan": math.nan, "True": True, "False": False, "None": None}


def _value(node: ast.AST, depth: int = 0) -> object:
    """A literal's value without evaluating anything: containers and constants as
    `ast.literal_eval` reads them, a record's call (`CudaGraphConfig(max_bs=32)`) as the dict of
    its keywords, a one-argument call (`PosixPath('/m')`, `float('inf')`) as its argument, a
    bare name or attribute (an enum member) as its text."""
    if depth > 32:
        return ast.unparse(node)
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [_value(e, depth + 1) for e in node.elts]
    if isinstance(node, ast.Dict):
        return {_key(k): _value(v, depth + 1) for k, v in zip(node.keys, node.values, strict=True)
                if k is not None}
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        inner = _value(node.operand, depth + 1)
        if isinstance(inner, int | float) and not isinstance(inner, bool):
            return -inner if isinstance(node.op, ast.USub) else inner
        return ast.unparse(node)
    if isinstance(node, ast.Name):
        return _NAMES.get(node.id, node.id)
    if isinstance(node, ast.Attribute):
        return ast.unparse(node)
    if isinstance(node, ast.Call):
        if node.keywords and not node.args:
            record = {kw.arg: _value(kw.value, depth + 1) for kw in node.keywords if kw.arg}
            return {"__record__": ast.unparse(node.func), **record}
        if len(node.args) == 1 and not node.keywords:
            inner = _value(node.args[0], depth + 1)
            if ast.unparse(node.func) == "float" and isinstance(inner, str):
                try:
                    return float(inner)
                except ValueError:
                    return inner
            return inner
    return ast.unparse(node)


def _key(node: ast.AST) -> str:
    value = _value(node)
    return value if isinstance(value, str) else str(value)


def plain(args: Mapping) -> dict:
    """The arguments without the record markers `_value` leaves on nested records, and with
    a non-finite number as its text (`inf`: JSON has no such number)."""
    out = {}
    for key, value in args.items():
        if key == "__record__":
            continue
        out[key] = _plain(value)
    return out


def _plain(value: object) -> object:
    if isinstance(value, Mapping):
        return plain(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value


@dataclass(frozen=True)
class NcclInfo:
    """An NCCL INFO line: its host, process and CUDA device, and what it says (`version`, or
    the variable it took from the environment and the value NCCL printed)."""

    host: str
    pid: int
    dev: int
    version: str | None = None
    var: str | None = None
    value: str | None = None


def nccl_info(raw: str) -> NcclInfo | None:
    """An NCCL INFO line, or None. Integer parameters end in a period (`to 4.`), which is not
    part of the value; string settings print the value as given (`to LL128`)."""
    m = _NCCL.match(raw.strip())
    if m is None:
        return None
    host, pid, dev, text = m.group("host"), int(m.group("pid")), int(m.group("dev")), m.group("text")
    v = _NCCL_VERSION.match(text)
    if v is not None:
        return NcclInfo(host, pid, dev, version=v.group("version") + v.group("suffix"))
    e = _NCCL_ENV.match(text)
    if e is not None:
        value = e.group("value")
        if _INT_WITH_PERIOD.match(value):
            value = value[:-1]
        return NcclInfo(host, pid, dev, var=e.group("var"), value=value)
    return NcclInfo(host, pid, dev)




def gc_pause(message: str) -> tuple[str, float] | None:
    """(generation, seconds) of SGLang's long-GC warning, or None."""
    m = _GC.search(message)
    return (m.group("gen"), float(m.group("seconds"))) if m else None


class UserPattern:
    """`log.pattern`: a regular expression whose named groups are metrics (`verify_ms`).

    A group that does not read as a finite number is not a sample."""

    def __init__(self, pattern: str):
        try:
            self.regex = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"log.pattern={pattern!r} is not a regular expression: {exc}") from None
        self.metrics = tuple(self.regex.groupindex)
        if not self.metrics:
            raise ValueError(f"log.pattern={pattern!r} names no group: write the metric as a"
                             " named group, e.g. 'verify (?P<verify_ms>[0-9.]+) ms'")
        self.pattern = pattern

    def samples(self, message: str) -> dict[str, float]:
        m = self.regex.search(message)
        if m is None:
            return {}
        out = {}
        for name in self.metrics:
            text = m.group(name)
            try:
                value = float(text) if text is not None else math.nan
            except ValueError:
                continue
            if math.isfinite(value):
                out[name] = value
        return out
