"""The differences between two candidate specs, as factors an isolating strategy can toggle.

A *spec* is a candidate description with each part optional: `commit`, `patches`, `env`,
`clock`, `server`, `packages`. A commit, clock or server setting left out on one side is the
same as on the other side; patches, env variables and package pins are what that side lists
(none listed: no patches, no override, the node's own packages), so `good.env.NCCL_PROTO=LL128
bad.patches=[a.patch] bad.packages=[flashinfer-python==0.2.3]` means "bad lacks the variable,
has the patch and runs flashinfer 0.2.3 over the node's packages". Each difference can be
applied to the good spec on its own; applying all of them gives the bad spec.

**One change, one factor level.** A change sets one key of one *factor kind* (a commit, a
patch, an env variable, one clock policy part such as the power limit or the SM clock lock, a
server setting, one package's version) to its good or its bad level; a level of None means
"not set by the candidate: as the node (or the target config) has it". Every kind is a small :class:`FactorKind` that
reads and writes its level in a spec and in a candidate: package versions are the
:class:`_Package` kind and the `packages` part of :class:`~orchestrator.records.Candidate`.

Size: one factor kind per candidate part (commit, patch, env, clock part, server setting,
package), each short and read through the same small interface; kept together so the kinds
are seen side by side.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SleuthError, UserError
from orchestrator.gpu.base import CLOCK_PARTS, format_parts, parse_parts
from orchestrator.records import UNSET, Candidate
from orchestrator.system.fingerprint_diff import SESSION_ENV as SESSION_ENV
from orchestrator.system.fingerprint_diff import Difference as SystemDifference
from orchestrator.system.fingerprint_diff import is_session_env
from orchestrator.system.redact import is_redacted, is_secret_name, secret_in_value
from orchestrator.util.pins import pins_of

PARTS = ("commit", "patches", "env", "clock", "server", "packages")
Spec = dict  # {"commit": str, "patches": [path], "env": {var: value}, "clock": {part: value},
#             "server": {setting: value}, "packages": {name: version}}: every part present
#             (see `normalize`)

_CLOCK_NAMES = {"power": ("power limit", " W"), "locked": ("SM clock lock", " MHz"),
                "mem_locked": ("memory clock lock", " MHz"),
                "app": ("SM applications clock", " MHz"), "persistence": ("persistence mode", ""),
                "reset": ("clock reset", "")}


class FactorKind:
    """How one kind of factor reads and writes its level (None: not set by the candidate)."""

    name = ""
    finding_kind = ""  # `kind` of a finding in findings.json

    def get(self, spec: Spec, key: str) -> object:
        raise NotImplementedError

    def set(self, spec: Spec, key: str, level: object) -> None:
        raise NotImplementedError

    def of_candidate(self, cand: Candidate, key: str) -> object:
        raise NotImplementedError

    def keys(self, spec: Spec) -> Iterable[str]:
        raise NotImplementedError

    def show(self, key: str, level: object) -> str:
        return "unset" if level in (None, UNSET) else str(level)

    def name_of(self, key: str) -> str:
        return key

    def check(self, key: str, level: object) -> None:
        """Refuse a level that cannot be launched (UserError, one line)."""
        if is_redacted(level):
            raise UserError(f"{self.name_of(key)}: a redacted value ({level}) can never be set")


class _Commit(FactorKind):
    name, finding_kind = "commit", "commit"

    def get(self, spec, key):
        return spec["commit"]

    def set(self, spec, key, level):
        spec["commit"] = level

    def of_candidate(self, cand, key):
        return cand.commit

    def keys(self, spec):
        return [""]

    def name_of(self, key):
        return "commit"


class _Patch(FactorKind):
    name, finding_kind = "patch", "patch"

    def get(self, spec, key):
        return key in spec["patches"]

    def set(self, spec, key, level):
        spec["patches"] = [p for p in spec["patches"] if p != key] + ([key] if level else [])

    def of_candidate(self, cand, key):
        return key in cand.patches

    def keys(self, spec):
        return list(spec["patches"])

    def name_of(self, key):
        return f"patch {Path(key).name}"

    def check(self, key, level):
        if not Path(key).is_file():
            raise UserError(f"patch file not found: {key}")


class _Env(FactorKind):
    name, finding_kind = "env", "env"

    def get(self, spec, key):
        return spec["env"].get(key)

    def set(self, spec, key, level):
        if level is None:
            spec["env"].pop(key, None)
        else:
            spec["env"][key] = str(level)

    def of_candidate(self, cand, key):
        return cand.env_dict.get(key)

    def keys(self, spec):
        return list(spec["env"])

    def check(self, key, level):
        super().check(key, level)
        if level in (None, UNSET):
            return
        from orchestrator.system.envcheck import check_env

        if is_secret_name(key) or secret_in_value(str(level)):
            raise UserError(f"{key} looks like a secret: export it in the node's environment"
                            " instead of passing it in a candidate (sleuth stores candidates)")
        check_env({key: str(level)})


class _Clock(FactorKind):
    name, finding_kind = "clock", "clock"

    def get(self, spec, key):
        return spec["clock"].get(key)

    def set(self, spec, key, level):
        if level is None:
            spec["clock"].pop(key, None)
        else:
            spec["clock"][key] = str(level)

    def of_candidate(self, cand, key):
        return parse_parts(cand.clock).get(key)

    def keys(self, spec):
        return list(spec["clock"])

    def name_of(self, key):
        return _CLOCK_NAMES.get(key, (key, ""))[0]

    def show(self, key, level):
        if level is None:
            return "as the node is"
        unit = _CLOCK_NAMES.get(key, ("", ""))[1]
        if level == "off":
            return "unlocked"
        return f"{level}{unit}" if str(level).isdigit() else str(level or key)

    def check(self, key, level):
        super().check(key, level)
        if level is not None:
            parse_parts(format_parts({key: str(level)}))


class _Server(FactorKind):
    name, finding_kind = "server", "system"

    def get(self, spec, key):
        return spec["server"].get(key)

    def set(self, spec, key, level):
        if level is None:
            spec["server"].pop(key, None)
        else:
            spec["server"][key] = level

    def of_candidate(self, cand, key):
        return cand.server_dict.get(key)

    def keys(self, spec):
        return list(spec["server"])


class _Package(FactorKind):
    """One distribution's version, installed over the node's for the trial (an overlay);
    None: the node's own (an overlay can replace a package, never remove one)."""

    name, finding_kind = "package", "package"

    def get(self, spec, key):
        return spec["packages"].get(key)

    def set(self, spec, key, level):
        if level is None:
            spec["packages"].pop(key, None)
        else:
            spec["packages"][key] = str(level)

    def of_candidate(self, cand, key):
        return cand.package_dict.get(key)

    def keys(self, spec):
        return list(spec["packages"])

    def show(self, key, level):
        return "as the node has it" if level is None else str(level)

    def check(self, key, level):
        super().check(key, level)
        if level is not None:
            pins_of({key: level})


KINDS: dict[str, FactorKind] = {k.name: k for k in (_Commit(), _Patch(), _Env(), _Clock(),
                                                    _Server(), _Package())}


@dataclass(frozen=True)
class Change:
    """One difference: `factor` (a kind in :data:`KINDS`) key `key` goes from `good` to `bad`.

    `reference` / `now` are what was recorded on each side, for a difference found in the
    system (the factor levels alone do not say it: "leave as the node is" is not "INFO");
    `source` is the fingerprint field it tests (`power_limit_w`)."""

    factor: str
    key: str  # patch file, env var, clock policy part, server setting; "" for commit
    good: object  # level on the good side (None = not set there)
    bad: object
    note: str = ""  # how a person would describe it, when the levels alone do not say
    reference: str | None = None
    now: str | None = None
    source: str = ""

    @property
    def kind(self) -> str:
        return KINDS[self.factor].finding_kind

    @property
    def name(self) -> str:
        """Its identity in findings: the fingerprint field, patch path, variable or part."""
        return self.source or self.key or self.factor

    @property
    def label(self) -> str:
        if self.note:
            return self.note
        kind = KINDS[self.factor]
        if self.factor == "patch":
            return f"patch {Path(self.key).name} {'added' if self.bad else 'removed'}"
        before = self.reference if self.reference is not None else kind.show(self.key, self.good)
        after = self.now if self.now is not None else kind.show(self.key, self.bad)
        return f"{kind.name_of(self.key) if self.factor != 'env' else self.key}: {before} -> {after}"

    def to_json(self) -> dict:
        """`key` is the change's identity (the fingerprint field it tests, when it came from
        one); `level_key` the factor key its levels set, when that differs."""
        doc = {"factor": self.factor, "key": self.name, "good": self.good, "bad": self.bad,
               "label": self.label}
        if self.source:
            doc["source"] = self.source
        for key in ("reference", "now"):  # what each side recorded, for a system difference
            if getattr(self, key) is not None:
                doc[key] = getattr(self, key)
        if self.name != self.key:
            doc["level_key"] = self.key
        return doc

    def matches(self, d: SystemDifference) -> bool:
        """Whether this change is the test of fingerprint difference `d`."""
        return d.factor is not None and (d.factor[0], d.factor[1]) == (self.factor, self.key)


def normalize(raw: Mapping | None) -> Spec:
    """A spec with every part present: clock as policy parts, env and server as dicts."""
    raw = dict(raw or {})
    unknown = set(raw) - set(PARTS)
    if unknown:
        raise UserError(f"unknown candidate part(s) {sorted(unknown)}: use {', '.join(PARTS)}")
    clock = raw.get("clock", "default")
    return {"commit": str(raw.get("commit", "HEAD")),
            "patches": [str(p) for p in raw.get("patches", [])],
            "env": {str(k): str(v) for k, v in dict(raw.get("env") or {}).items()
                    if v is not None},
            "clock": dict(clock) if isinstance(clock, Mapping) else parse_parts(str(clock)),
            "server": dict(raw.get("server") or {}),
            "packages": pins_of(raw.get("packages"))}


def changes_between(good_raw: Mapping | None, bad_raw: Mapping | None) -> tuple[Spec, list[Change]]:
    """(the good spec with every part filled, the list of changes from good to bad)."""
    good_in, bad_in = dict(good_raw or {}), dict(bad_raw or {})
    for raw in (good_in, bad_in):
        normalize(raw)  # unknown parts are refused before anything else
    for part in ("commit", "clock", "server"):  # unset: same as the other side
        if part not in good_in and part in bad_in:
            good_in[part] = bad_in[part]
        if part not in bad_in and part in good_in:
            bad_in[part] = good_in[part]
    good, bad = normalize(good_in), normalize(bad_in)
    if "commit" not in bad_in:
        bad["commit"] = good["commit"]
    changes: list[Change] = []
    for kind in KINDS.values():
        keys = list(dict.fromkeys([*kind.keys(good), *kind.keys(bad)]))
        if kind.name == "patch":  # added ones first, as a patch series reads
            keys = [k for k in kind.keys(bad) if k not in good["patches"]] + \
                   [k for k in kind.keys(good) if k not in bad["patches"]]
        if kind.name in ("env", "server", "package"):
            keys = sorted(keys)
        elif kind.name == "clock":
            keys = sorted(keys, key=CLOCK_PARTS.index)
        for key in keys:
            a, b = kind.get(good, key), kind.get(bad, key)
            if a != b:
                changes.append(Change(kind.name, key, a, b))
    return good, changes


def changes_from_system(diffs: Iterable[SystemDifference], *, all_env: bool = False) -> list[Change]:
    """Controllable fingerprint differences as changes from the reference (good) to now (bad).

    On the now side nothing is overridden (the node as it is); on the reference side the
    reference level is set per trial (a power limit, an SM clock lock released, an env var's
    old value or its absence). Shell/session variables are left out unless `all_env`, and so
    is anything the record cannot restore (a redacted value)."""
    from orchestrator.system.fingerprint_diff import show_value

    out = []
    for d in diffs:
        if not d.controllable or not d.factor:
            continue
        kind, key, level = d.factor
        if kind not in KINDS or is_redacted(level):
            continue
        if kind == "env" and not all_env and is_session_env(key):
            continue
        then = d.extra.get("then") or show_value(d.key, d.reference)  # unknown then: said so
        out.append(Change(kind, key, level, None, reference=then,
                          now=show_value(d.key, d.now), source=d.key))
    return out


def apply(good: Mapping, changes: list[Change], subset: Iterable[int],
          resolve: Callable[[str], str]) -> Candidate:
    """The candidate that is `good` with the changes in `subset` switched to their bad level.

    `resolve` turns a ref into a SHA."""
    spec = copy.deepcopy(normalize(good))
    for i in sorted(set(subset)):
        c = changes[i]
        KINDS[c.factor].set(spec, c.key, c.bad)
    return candidate_of(spec, resolve)


def candidate_of(spec: Spec, resolve: Callable[[str], str]) -> Candidate:
    for level in [*spec["env"].values(), *spec["clock"].values()]:
        if is_redacted(level):  # never launch a record: a redacted value is not the value
            raise SleuthError(f"a candidate would be launched with a redacted value ({level})")
    return Candidate.make(resolve(str(spec["commit"])), sorted(spec["patches"]),
                          {k: str(v) for k, v in spec["env"].items()},
                          format_parts(spec["clock"]), spec["server"] or None,
                          spec["packages"])


def level_of(change: Change, cand: Candidate, resolve: Callable[[str], str]) -> bool:
    """Whether `cand` has `change` at its bad level."""
    level = KINDS[change.factor].of_candidate(cand, change.key)
    if change.factor == "commit":
        return level == resolve(str(change.bad))
    bad = change.bad if change.factor != "env" or change.bad is None else str(change.bad)
    if change.factor == "clock" and bad is not None:
        bad = str(bad)
    return level == bad


def reference_good(candidate: Candidate, changes: list[Change]) -> Spec:
    """The good spec of a system-level isolate: the reference candidate with every changed
    setting put back to its reference level (an absent variable as explicitly unset, a
    released clock lock as `locked:off`)."""
    spec = normalize({**candidate.to_json(), "clock": candidate.clock})
    for c in changes:
        KINDS[c.factor].set(spec, c.key, c.good)
    return spec


def check_distinct(good: Spec, changes: list[Change], resolve: Callable[[str], str]) -> None:
    """Each change must change the candidate, applied to good and removed from bad: two
    differences that launch the same candidate would have the strategy measure one
    configuration again and again under two names."""
    everything = range(len(changes))
    base, full = apply(good, changes, (), resolve).key, apply(good, changes, everything, resolve).key
    for i, c in enumerate(changes):
        alone = apply(good, changes, [i], resolve).key
        without = apply(good, changes, [j for j in everything if j != i], resolve).key
        if alone == base or without == full:
            raise SleuthError(f"the difference {c.label!r} does not change the candidate it is"
                              " applied to: it cannot be tested")
