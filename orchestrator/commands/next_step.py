"""The `next:` command a run prints, complete: it runs as printed, copied from the terminal.

A next step that drops `target=sim`, `repo=` or `runs_dir=` sends a user of the simulated node
to a real SGLang server, another repository or another runs directory, where the named run does
not exist. So the step carries where and how this run measured: the target (its group and
every setting that differs from that group's defaults), the bench and trial settings, the
cluster, the repository, the runs directory and the metric. Candidate settings (commit, env,
patches, clock, packages) are not carried: the next step says what it measures.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping

from orchestrator.config.compose import defaults
from orchestrator.config.settings import RunSettings, as_dict

CARRIED_PARTS = ("target", "bench", "trial", "cluster", "log")
CARRIED_KEYS = ("metric", "direction", "nodes", "confidence")
_PLAIN = re.compile(r"[\w./:@+-]*")  # a value Hydra reads as the string it is


def command(cfg: RunSettings, name: str, *args: str) -> str:
    """`sleuth <name> <args> <this run's where and how>`, quoted for a POSIX shell."""
    default = defaults(cfg.command or "trial", cfg.target.name)
    words = ["sleuth", name, *args]
    target = cfg.target.name
    if target and target != "sglang":
        words.append(f"target={target}")
    if cfg.repo:
        words.append(f"repo={cfg.repo}")
    words.append(f"runs_dir={cfg.runs_root}")
    for key in CARRIED_KEYS:
        if getattr(cfg, key) != getattr(default, key):
            words.append(f"{key}={_value(getattr(cfg, key))}")
    for part in CARRIED_PARTS:
        mine, theirs = as_dict(getattr(cfg, part)), as_dict(getattr(default, part))
        for key, value in _leaves(mine):
            if part == "target" and key == "name":
                continue
            if _lookup(theirs, key) != value:
                words.append(f"{part}.{key}={_value(value)}")
    return " ".join(_shell_word(w) for w in words)


def _shell_word(word: str) -> str:
    """As typed in a POSIX shell: bare when safe, in double quotes when only Hydra's single
    quotes are in it, else shlex's quoting."""
    quoted = shlex.quote(word)
    if quoted == word or any(c in word for c in '"$`\\!'):
        return quoted
    return f'"{word}"'


def _leaves(tree: Mapping, prefix: str = "") -> Iterator[tuple[str, object]]:
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _lookup(tree: Mapping, dotted: str) -> object:
    node: object = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return _MISSING
        node = node[part]
    return node


_MISSING = object()


def _value(value: object) -> str:
    """A value as a Hydra override reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list | tuple):
        return "[" + ",".join(_value(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if _PLAIN.fullmatch(text) and text not in ("null", "true", "false") \
            and not re.fullmatch(r"[-+]?[\d.]+(e[-+]?\d+)?", text):
        return text
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"
