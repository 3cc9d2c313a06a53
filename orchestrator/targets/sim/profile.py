"""The sim profile: how the checked-out code changes the simulated server's behaviour.

The repo under test carries `sim_profile.json` plus fragments `sim_profile.d/*.json`; a commit
that edits them, or a patch that adds a fragment, changes performance exactly the way a code
change would. Fragments merge in sorted filename order (the base file first):

- multiplicative keys multiply across fragments, additive keys add;
- `verify_cuda_graph: false` in any applied fragment forces verify onto the eager path;
- `import_error` (first applied one wins) makes the server die at start like unbuildable code;
- `env_effects`: `[{"var": NAME, "value": V, <key>: ...}]` applies when the process env has
  NAME == V (V "*" matches any non-empty value) — how code can make an env var matter; an
  entry with `"with": {OTHER: W}` applies only when those variables match too (two settings
  that hurt only together);
- `requires`: stems of other fragments in `sim_profile.d`; the fragment's effects (including
  its env_effects and import_error) apply only if all of them are present: pair interactions.

All keys are optional and neutral by default, so a repo with no profile runs the base model.
Loading is split from merging so the merge (`resolve_effects`) stays pure and testable.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROFILE_FILENAME = "sim_profile.json"
FRAGMENT_DIRNAME = "sim_profile.d"
MULTIPLICATIVE_KEYS = (
    "verify_mult",
    "draft_mult",
    "decode_mult",
    "prefill_mult",
    "allreduce_mult",
    "accept_len_mult",
)
ADDITIVE_KEYS = ("verify_ms_add",)
KNOWN_KEYS = frozenset(
    (*MULTIPLICATIVE_KEYS, *ADDITIVE_KEYS, "verify_cuda_graph", "import_error", "env_effects",
     "requires")
)  # fmt: skip


class ProfileError(ValueError):
    """A profile file is not valid JSON or holds a value of the wrong type."""


class ProfileJSONError(ProfileError):
    """A profile file is not valid JSON at all."""


@dataclass(frozen=True)
class Effects:
    """The merged effect of every applicable fragment: what the performance model consumes."""

    verify_mult: float = 1.0
    draft_mult: float = 1.0
    decode_mult: float = 1.0
    prefill_mult: float = 1.0
    allreduce_mult: float = 1.0
    accept_len_mult: float = 1.0
    verify_ms_add: float = 0.0
    verify_cuda_graph: bool = True
    import_error: str | None = None


NEUTRAL = Effects()


@dataclass(frozen=True)
class Fragment:
    """One profile file, parsed and type-checked but not yet applied."""

    stem: str
    source: str
    values: Mapping[str, Any] = field(default_factory=dict)
    env_effects: tuple[Mapping[str, Any], ...] = ()
    requires: tuple[str, ...] = ()
    unknown_keys: tuple[str, ...] = ()


def _check_number(source: str, key: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProfileError(f"{source}: {key!r} must be a number, got {value!r}")
    return float(value)


def _check_values(source: str, doc: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key in MULTIPLICATIVE_KEYS or key in ADDITIVE_KEYS:
            out[key] = _check_number(source, key, value)
        elif key == "verify_cuda_graph":
            if not isinstance(value, bool):
                raise ProfileError(f"{source}: 'verify_cuda_graph' must be true/false")
            out[key] = value
        elif key == "import_error":
            if not isinstance(value, str):
                raise ProfileError(f"{source}: 'import_error' must be a string")
            out[key] = value
    return out


def parse_fragment(stem: str, source: str, doc: object) -> Fragment:
    """Type-check one decoded profile document."""
    if not isinstance(doc, Mapping):
        raise ProfileError(f"{source}: a profile must be a JSON object")
    env_effects = doc.get("env_effects", [])
    if not isinstance(env_effects, list):
        raise ProfileError(f"{source}: 'env_effects' must be a list")
    checked_effects = []
    for entry in env_effects:
        if not isinstance(entry, Mapping) or "var" not in entry or "value" not in entry:
            raise ProfileError(f"{source}: each env_effects entry needs 'var' and 'value'")
        effect_values = {k: v for k, v in entry.items() if k not in ("var", "value", "with")}
        checked = _check_values(source, effect_values)
        also = entry.get("with", {})
        if not isinstance(also, Mapping):
            raise ProfileError(f"{source}: an env_effects 'with' must map variables to values")
        if also:
            checked["with"] = {str(k): str(v) for k, v in also.items()}
        checked_effects.append({"var": str(entry["var"]), "value": str(entry["value"]), **checked})
    requires = doc.get("requires", [])
    if not isinstance(requires, list) or not all(isinstance(r, str) for r in requires):
        raise ProfileError(f"{source}: 'requires' must be a list of fragment names")
    return Fragment(
        stem=stem,
        source=source,
        values=_check_values(source, doc),
        env_effects=tuple(checked_effects),
        requires=tuple(r.removesuffix(".json") for r in requires),
        unknown_keys=tuple(sorted(k for k in doc if k not in KNOWN_KEYS)),
    )


def _read_fragment(path: Path) -> Fragment:
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ProfileJSONError(f"{path}: malformed JSON: {exc}") from exc
    return parse_fragment(path.stem, str(path), doc)


def load_fragments(profile_path: str | os.PathLike[str]) -> list[Fragment]:
    """The base profile (if present) then `sim_profile.d/*.json` beside it, in sorted order.

    A missing base file or fragment directory is not an error (neutral behaviour); an
    unreadable or malformed file is (the server must fail to start, as with broken code).
    """
    base = Path(profile_path)
    out: list[Fragment] = []
    if base.is_file():
        out.append(_read_fragment(base))
    frag_dir = base.parent / FRAGMENT_DIRNAME
    if frag_dir.is_dir():
        for path in sorted(frag_dir.glob("*.json"), key=lambda p: p.name):
            if path.is_file():
                out.append(_read_fragment(path))
    return out


def _env_matches(env: Mapping[str, str], var: str, value: str) -> bool:
    current = env.get(var)
    if value == "*":
        return bool(current)
    return current == value


def _apply(acc: dict[str, Any], values: Mapping[str, Any]) -> None:
    for key, value in values.items():
        if key in MULTIPLICATIVE_KEYS:
            acc[key] *= value
        elif key in ADDITIVE_KEYS:
            acc[key] += value
        elif key == "verify_cuda_graph":
            acc[key] = acc[key] and value
        elif key == "import_error" and acc[key] is None and value:
            acc[key] = value


def applicable(fragments: Sequence[Fragment]) -> list[Fragment]:
    """Fragments whose `requires` are all present among the fragment stems."""
    present = {f.stem for f in fragments}
    return [f for f in fragments if all(r in present for r in f.requires)]


def resolve_effects(fragments: Sequence[Fragment], env: Mapping[str, str]) -> Effects:
    """Merge fragments (already in order) under a process environment. Pure."""
    acc: dict[str, Any] = {
        **{k: 1.0 for k in MULTIPLICATIVE_KEYS},
        **{k: 0.0 for k in ADDITIVE_KEYS},
        "verify_cuda_graph": True,
        "import_error": None,
    }
    for frag in applicable(fragments):
        _apply(acc, frag.values)
        for entry in frag.env_effects:
            if _env_matches(env, entry["var"], entry["value"]) and all(
                    _env_matches(env, k, v) for k, v in entry.get("with", {}).items()):
                _apply(acc, {k: v for k, v in entry.items() if k not in ("var", "value", "with")})
    return Effects(**acc)


def load_effects(profile_path: str | os.PathLike[str], env: Mapping[str, str]) -> Effects:
    return resolve_effects(load_fragments(profile_path), env)
