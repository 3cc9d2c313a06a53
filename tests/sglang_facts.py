"""The saved SGLang facts (tests/fixtures/sglang_*/, written by experiments/sglang_fixtures.py
from the real packages) and helpers that turn them into checks.

Nothing here imports SGLang: the fixtures are what an installed 0.5.23 (and the 0.5.9 wheel's
source) said, so a test compares the sim and the adapter with SGLang itself, not with strings
copied by hand.
"""

from __future__ import annotations

import ast
import json
import re
from functools import cache
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"
VERSIONS = ("0.5.9", "0.5.23")
F2 = r"-?\d+\.\d{2}"


def fixture_dir(version: str) -> Path:
    return FIXTURES / ("sglang_" + version.replace(".", "_"))


@cache
def facts(version: str) -> dict:
    return json.loads((fixture_dir(version) / "source_facts.json").read_text())


@cache
def argv_checks() -> list[dict]:
    return json.loads((fixture_dir("0.5.23") / "argv_checks.json").read_text())


@cache
def server_info_keys() -> frozenset[str]:
    return frozenset(json.loads((fixture_dir("0.5.23") / "server_info_keys.json").read_text()))


def help_text() -> str:
    return (fixture_dir("0.5.23") / "launch_server_help.txt").read_text()


def metric_names(version: str) -> set[str]:
    """Sample names SGLang can expose: counters with `_total`, histograms' three series."""
    out = set()
    for m in facts(version)["metrics"]:
        name = m["name"]
        if m["kind"] == "histogram":
            out |= {name + "_bucket", name + "_sum", name + "_count"}
        elif m["kind"] == "counter" and not name.endswith("_total"):
            out.add(name + "_total")
        else:
            out.add(name)
    return out


def categories(version: str, file_suffix: str) -> set[str]:
    """Forward-time categories the runner in `file_suffix` files passes under."""
    return {c for d in facts(version)["forward_categories"] if d["file"].endswith(file_suffix)
            for c in d["constants"]}


def meta_keys(version: str) -> set[str]:
    by_fn = facts(version)["meta_info"]["by_function"]
    return set(by_fn["_handle_batch_output"]) | set(by_fn["_calculate_spec_decoding_metrics"])


def fstring(source: str, values: dict[str, str]) -> str:
    """A regex for one saved f-string: literal text escaped, `:.2f` fields as 2-decimal numbers,
    a field named in `values` (by its source text) as that regex, any other field as a number."""
    node = ast.parse(source, mode="eval").body
    assert isinstance(node, ast.JoinedStr), source
    parts = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            parts.append(re.escape(part.value))
            continue
        expr = ast.unparse(part.value)
        spec = ast.unparse(part.format_spec) if part.format_spec else ""
        if expr in values:
            parts.append(values[expr])
        elif ".2f" in spec:
            parts.append(F2)
        else:
            parts.append(r"-?\d+")
    return "".join(parts)


def pick(fstrings: list[str], *starts: str) -> list[str]:
    """The saved f-strings that begin (after `f'`) with each of `starts`, in that order."""
    out = []
    for start in starts:
        found = [s for s in fstrings if s[2:].startswith(start)]
        assert found, f"no saved f-string starts with {start!r}"
        out.append(found[0])
    return out
