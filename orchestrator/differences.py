"""The differences between two candidate specs, as factors an isolating strategy can toggle.

A *spec* is a candidate description with each part optional: `commit`, `patches`, `env`,
`clock`, `server`. A commit, clock or server setting left out on one side is the same as on the
other side; patches and env variables are what that side lists (none listed: no patches, no
override), so `good.env.NCCL_PROTO=LL128 bad.patches=[a.patch]` means "bad lacks the variable
and has the patch". Each difference can be applied to the good spec on its own; applying all of
them gives the bad spec.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.fingerprint_diff import Difference as SystemDifference
from orchestrator.records import Candidate
from orchestrator.targets.base import UNSET

PARTS = ("commit", "patches", "env", "clock", "server")


@dataclass(frozen=True)
class Change:
    """One difference: `factor` is commit | patch | env | clock | server."""

    factor: str
    key: str  # patch file, env var, server setting; "" for commit and clock
    good: object  # level on the good side (None = not set there)
    bad: object
    note: str = ""  # how a person would describe it, when the levels alone do not say

    @property
    def kind(self) -> str:
        return {"commit": "commit", "patch": "patch", "env": "env", "clock": "clock",
                "server": "server"}[self.factor]

    @property
    def label(self) -> str:
        def show(v: object) -> str:
            return "unset" if v in (None, UNSET) else str(v)

        if self.note:
            return self.note
        if self.factor == "patch":
            return f"patch {Path(self.key).name} {'added' if self.bad else 'removed'}"
        if self.factor in ("env", "server"):
            return f"{self.key}: {show(self.good)} -> {show(self.bad)}"
        return f"{self.factor}: {show(self.good)} -> {show(self.bad)}"

    def to_json(self) -> dict:
        return {"factor": self.factor, "key": self.key, "good": self.good, "bad": self.bad,
                "label": self.label}

    def matches(self, d: SystemDifference) -> bool:
        """Whether this change is the test of fingerprint difference `d`."""
        return (self.factor == "clock" and d.factor is not None and d.factor[0] == "clock") or (
            self.factor == "env" and d.category == "env" and d.key == self.key)


def _spec(raw: Mapping | None) -> dict:
    raw = dict(raw or {})
    unknown = set(raw) - set(PARTS)
    if unknown:
        raise UserError(f"unknown candidate part(s) {sorted(unknown)}: use {', '.join(PARTS)}")
    return raw


def changes_between(good_raw: Mapping | None, bad_raw: Mapping | None) -> tuple[dict, list[Change]]:
    """(the good spec with every part filled, the list of changes from good to bad)."""
    good, bad = _spec(good_raw), _spec(bad_raw)
    for part in ("commit", "clock", "server"):  # unset: same as the other side
        if part not in good and part in bad:
            good[part] = bad[part]
        if part not in bad and part in good:
            bad[part] = good[part]
    good.setdefault("commit", "HEAD")
    bad.setdefault("commit", good["commit"])
    changes: list[Change] = []
    if good["commit"] != bad["commit"]:
        changes.append(Change("commit", "", good["commit"], bad["commit"]))
    gp, bp = list(good.get("patches", [])), list(bad.get("patches", []))
    changes += [Change("patch", p, False, True) for p in bp if p not in gp]
    changes += [Change("patch", p, True, False) for p in gp if p not in bp]
    ge, be = dict(good.get("env", {})), dict(bad.get("env", {}))
    for var in sorted(set(ge) | set(be)):
        if ge.get(var) != be.get(var):
            changes.append(Change("env", var, ge.get(var), be.get(var)))
    if good.get("clock", "default") != bad.get("clock", "default"):
        changes.append(Change("clock", "", good.get("clock", "default"), bad.get("clock", "default")))
    gs, bs = dict(good.get("server", {})), dict(bad.get("server", {}))
    for key in sorted(set(gs) | set(bs)):
        if gs.get(key) != bs.get(key):
            changes.append(Change("server", key, gs.get(key), bs.get(key)))
    return good, changes


# Variables of an interactive shell or desktop session: they cannot change what a GPU server
# computes. A system-level isolate sets them aside (listed, not tested) unless asked to test
# every variable; any name not on this list is tested.
SESSION_ENV = re.compile(
    r"^(TERM|TERM_\w+|COLORTERM|SSH_\w+|LS_COLORS|LESS\w*|HIST\w+|PROMPT_COMMAND|PS[1-4]|"
    r"OLDPWD|PWD|SHLVL|WINDOWID|DBUS_\w+|XDG_\w+|MAIL|MOTD_SHOWN|EDITOR|VISUAL|PAGER|TMUX\w*|"
    r"VSCODE_\w+|STARSHIP_\w+|LC_TERMINAL\w*|GIT_ASKPASS|DISPLAY|WAYLAND_\w+|_)$"
)


def is_session_env(name: str) -> bool:
    return bool(SESSION_ENV.match(name))


def changes_from_system(diffs: Iterable[SystemDifference], *, all_env: bool = False) -> list[Change]:
    """Controllable fingerprint differences as changes from the reference (good) to now (bad).

    On the now side nothing is overridden (the node as it is); on the reference side the
    reference level is set per trial (a power limit, an env var's old value or its absence).
    Shell/session variables are left out unless `all_env`."""
    out = []
    for d in diffs:
        if not d.controllable or not d.factor:
            continue
        factor, ref_level, now_level = d.factor
        if factor == "clock":
            out.append(Change("clock", d.key, ref_level, now_level,
                              f"{d.key}: {d.reference} -> {d.now} {d.detail}".strip()))
        elif factor == "env" and not all_env and is_session_env(ref_level[0]):
            continue
        elif factor == "env":
            var, value = ref_level
            out.append(Change("env", var, value, None))
    return out


def apply(good: Mapping, changes: list[Change], subset: Iterable[int], resolve) -> Candidate:
    """The candidate that is `good` with the changes in `subset` switched to their bad level.

    `resolve` turns a ref into a SHA. An env level None means "not overridden"."""
    spec = {"commit": good.get("commit", "HEAD"), "patches": list(good.get("patches", [])),
            "env": {k: v for k, v in dict(good.get("env", {})).items() if v is not None},
            "clock": good.get("clock", "default"), "server": dict(good.get("server", {}))}
    for i in sorted(set(subset)):
        c = changes[i]
        if c.factor == "commit":
            spec["commit"] = c.bad
        elif c.factor == "patch":
            spec["patches"] = ([p for p in spec["patches"] if p != c.key] if not c.bad
                               else [*spec["patches"], c.key])
        elif c.factor == "env":
            if c.bad is None:
                spec["env"].pop(c.key, None)
            else:
                spec["env"][c.key] = c.bad
        elif c.factor == "clock":
            spec["clock"] = c.bad
        elif c.factor == "server":
            spec["server"][c.key] = c.bad
    return Candidate.make(resolve(str(spec["commit"])), sorted(spec["patches"]),
                          {k: str(v) for k, v in spec["env"].items()}, str(spec["clock"]),
                          spec["server"] or None)
