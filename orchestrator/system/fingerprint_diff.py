"""Diff two fingerprints into ranked, human-readable differences.

Ranking here is by plausibility alone (a clock cap before a driver, an NCCL variable before an
editor setting): `compare` re-ranks with what the trials measured (the phase that moved, the
SM clock under load; :mod:`orchestrator.system.mechanism`). Each difference says whether sleuth can
set it per trial (`controllable`) and, if so, the level of one factor that puts the reference
side back (`factor`: kind, key, level), which is what `sleuth isolate` needs to test it. Every
clock setting is its own difference with its own level, so a power limit and an SM lock changed
together are two tests, not one.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.records import UNSET
from orchestrator.system.redact import is_redacted
from orchestrator.util.pins import canonical

# Plausibility as a cause of a performance change (lower = more plausible).
RANK = {"clock": 1, "gpu_process": 2, "driver": 3, "nccl": 3, "env_dropped": 3.5, "pcie": 5,
        "package": 7, "env": 8, "code": 8, "kernel": 9, "gpu": 10}
# Variables that steer the GPU libraries or the server's CPU threads.
PERF_ENV = re.compile(r"^(NCCL_|CUDA_|SGLANG_|TORCH_|PYTORCH_|NVIDIA_|OMP_|FLASHINFER_|TRITON_|"
                      r"MKL_|KMP_|GOMP_|CUBLAS|CUDNN_|NVTE_|UCX_|LD_PRELOAD$|LD_LIBRARY_PATH$)")
# Variables of an interactive shell or desktop session: they cannot change what a GPU server
# computes. A system-level isolate sets them aside (listed, not tested) unless asked to test
# every variable.
SESSION_ENV = re.compile(
    r"^(TERM|TERM_\w+|COLORTERM|SSH_\w+|LS_COLORS|LESS\w*|HIST\w+|PROMPT_COMMAND|PS[1-4]|"
    r"OLDPWD|PWD|SHLVL|WINDOWID|DBUS_\w+|XDG_\w+|MAIL|MOTD_SHOWN|EDITOR|VISUAL|PAGER|TMUX\w*|"
    r"VSCODE_\w+|STARSHIP_\w+|LC_TERMINAL\w*|GIT_ASKPASS|DISPLAY|WAYLAND_\w+|_)$"
)
NOT_FROM_RECORD = "not controllable from the record: the reference value was redacted (a secret)"


def is_session_env(name: str) -> bool:
    return bool(SESSION_ENV.match(name))


def env_rank(name: str) -> float:
    if name.startswith("NCCL_"):
        return 4.0
    if PERF_ENV.match(name):
        return 6.0
    return 10.0 if is_session_env(name) else 8.0


# GPU fields: (category, how a person names it, unit, how an unset value reads).
GPU_FIELDS = {
    "power_limit_w": ("clock", "power limit", " W", "default"),
    "sm_clock_locked_mhz": ("clock", "SM clock lock", " MHz", "none"),
    "mem_clock_locked_mhz": ("clock", "memory clock lock", " MHz", "none"),
    "applications_clock_sm_mhz": ("clock", "SM applications clock", " MHz", "default"),
    "persistence_mode": ("clock", "persistence mode", "", "unknown"),
    "sm_clock_max_mhz": ("gpu", "maximum SM clock", " MHz", "unknown"),
    "pcie_gen": ("pcie", "PCIe link generation", "", "unknown"),
    "pcie_width": ("pcie", "PCIe link width", "x", "unknown"),
    "ecc_errors": ("gpu", "uncorrected ECC errors", "", "unknown"),
    "name": ("gpu", "GPU model", "", "unknown"),
    "memory_total_mib": ("gpu", "GPU memory", " MiB", "unknown"),
}


def show_value(key: str, value: object) -> str:
    """A recorded value as a person reads it (`1900 MHz`, `none`, `on`, `unset`)."""
    spec = GPU_FIELDS.get(key)
    if spec is None:
        return "unset" if value in (None, UNSET) else str(value)
    _, _, unit, unset = spec
    if value is None:
        return unset
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return f"{value}{unit}"


@dataclass(frozen=True)
class Difference:
    category: str
    key: str  # e.g. "power_limit_w", "NCCL_PROTO", "rich"
    reference: object
    now: object
    detail: str = ""
    controllable: bool = False
    # How `isolate` puts the reference side back per trial: (factor kind, factor key, level),
    # e.g. ("clock", "power", "600"), ("env", "NCCL_ALGO", "Tree"), ("env", "X", "<unset>").
    # The "now" side is always the node as it is.
    factor: tuple | None = None
    extra: dict = field(default_factory=dict)

    @property
    def rank(self) -> float:
        if self.category == "env":
            return env_rank(self.key)
        return RANK.get(self.category, 99)

    @property
    def name(self) -> str:
        spec = GPU_FIELDS.get(self.key)
        return spec[1] if spec else self.key

    @property
    def label(self) -> str:
        if self.category == "env_dropped":
            return (f"{self.key}={self.reference} is set on the node but the server got "
                    f"{show_value(self.key, self.now)}")
        # A reference that cannot tell this side (an old log) says so in `extra["then"]`.
        before = self.extra.get("then") or show_value(self.key, self.reference)
        return f"{self.name}: {before} -> {show_value(self.key, self.now)}"

    def to_json(self) -> dict:
        return {"category": self.category, "key": self.key, "reference": self.reference,
                "now": self.now, "detail": self.detail, "controllable": self.controllable,
                "rank": self.rank, "label": self.label,
                "factor": list(self.factor) if self.factor else None,
                **({"extra": self.extra} if self.extra else {})}

    @classmethod
    def from_json(cls, doc: Mapping) -> Difference:
        factor = doc.get("factor")
        if factor and len(factor) == 3 and isinstance(factor[1], list):  # (kind, [var, value], _)
            factor = ("env", factor[1][0], factor[1][1])
        return cls(doc["category"], doc["key"], doc.get("reference"), doc.get("now"),
                   doc.get("detail", ""), bool(doc.get("controllable")),
                   tuple(factor) if factor else None, dict(doc.get("extra") or {}))


def _clock_level(name: str, value: object, default_app: object) -> tuple[str, str] | None:
    """The policy part that sets GPU field `name` back to `value`, if a policy can."""
    if name == "power_limit_w":
        return ("power", str(int(value))) if isinstance(value, int | float) and value else None
    if name in ("sm_clock_locked_mhz", "mem_clock_locked_mhz"):
        part = "locked" if name.startswith("sm") else "mem_locked"
        return (part, str(int(value)) if value else "off")
    if name == "applications_clock_sm_mhz" and isinstance(value, int | float):
        return ("app", "default" if value == default_app else str(int(value)))
    if name == "persistence_mode" and isinstance(value, bool):
        return ("persistence", "on" if value else "off")
    return None


def _gpu_field_diffs(ref: Mapping, now: Mapping) -> list[Difference]:
    out: list[Difference] = []
    ref_gpus = {g.get("index"): g for g in ref.get("gpus", [])}
    now_gpus = {g.get("index"): g for g in now.get("gpus", [])}
    n = max(len(ref_gpus), len(now_gpus))
    for name, (category, *_rest) in GPU_FIELDS.items():
        changed = {}
        for i in sorted(set(ref_gpus) | set(now_gpus), key=str):
            a, b = ref_gpus.get(i, {}).get(name), now_gpus.get(i, {}).get(name)
            if a != b:
                changed[i] = (a, b)
        if not changed:
            continue
        pairs = sorted(set(changed.values()), key=str)
        a, b = pairs[0]
        detail = f"on {len(changed)}/{n} GPUs"
        ref_values = {ref_gpus.get(i, {}).get(name) for i in ref_gpus}
        level = None
        if category == "clock":
            default_app = next((g.get("applications_clock_sm_default_mhz")
                                for g in ref_gpus.values()), None)
            level = _clock_level(name, a, default_app)
            if level is not None and len(ref_values) > 1:
                level = None
                detail += "; the reference differs between GPUs: one policy cannot restore it"
        factor = ("clock", *level) if level else None
        out.append(Difference(category, name, a, b, detail, factor is not None, factor))
    ref_procs = {p["pid"] for g in ref_gpus.values() for p in g.get("processes", [])}
    now_procs = {(p["pid"], p.get("name", ""), p.get("used_memory_mib")) for g in now_gpus.values()
                 for p in g.get("processes", []) if p["pid"] not in ref_procs}
    if now_procs:
        shown = ", ".join(f"pid {pid} {name} {mem} MiB" for pid, name, mem in sorted(now_procs))
        out.append(Difference("gpu_process", "foreign GPU processes", None, shown,
                              "processes on the GPUs that were not there before"))
    return out


def _env_diffs(ref: Mapping, now: Mapping) -> list[Difference]:
    """The server's environment then and now (both as the server process had it), plus the
    variables the node set that never reached the server now (a launcher or wrapper)."""
    ref_env, now_env = ref.get("env", {}) or {}, now.get("env", {}) or {}
    re_, ne = ref_env.get("server", {}) or {}, now_env.get("server", {}) or {}
    dropped = dict(now_env.get("not_received") or {})
    out: list[Difference] = []
    for var in sorted(set(re_) | set(ne)):
        if re_.get(var) == ne.get(var):
            continue
        value = re_.get(var)
        detail, extra = "", {}
        if var in dropped:
            detail = (f"the node sets {var}={dropped.pop(var)} but the server did not get it:"
                      " a launcher or wrapper drops it")
            extra["dropped_before_server"] = True
        if is_redacted(value):
            out.append(Difference("env", var, value, ne.get(var),
                                  "; ".join(x for x in (detail, NOT_FROM_RECORD) if x), False,
                                  None, extra))
            continue
        out.append(Difference("env", var, value, ne.get(var), detail, True,
                              ("env", var, UNSET if value is None else value), extra))
    for var, value in sorted(dropped.items()):
        out.append(Difference("env_dropped", var, value, ne.get(var),
                              "set in the node's environment, missing in the server's: a"
                              " launcher or wrapper drops it (the same at the reference)"))
    return out


# sleuth's own distribution: an overlay of it would replace the tool, not the server.
_NOT_OVERLAID = frozenset({"sleuth"})


def _package_diffs(ref: Mapping, now: Mapping) -> list[Difference]:
    """Installed versions then and now. A package the reference had is controllable: an
    overlay (`orchestrator/packages`) installs its reference version over the node's for a
    trial. One installed only since cannot be taken away by an overlay."""
    out = []
    for name in sorted(set(ref) | set(now)):
        a, b = ref.get(name), now.get(name)
        if a == b:
            continue
        category = "nccl" if "nccl" in name else "package"
        if a is None:
            out.append(Difference(category, name, a, b, "installed since the reference: an"
                                  " overlay can replace a package, not remove one"))
        elif name in _NOT_OVERLAID or is_redacted(a):
            out.append(Difference(category, name, a, b))
        else:
            out.append(Difference(category, name, a, b, "", True,
                                  ("package", canonical(name), str(a))))
    return out


def diff(ref: Mapping, now: Mapping) -> list[Difference]:
    """Differences between a reference fingerprint and a current one, most plausible first."""
    out: list[Difference] = []
    rg, ng = ref.get("gpu", {}) or {}, now.get("gpu", {}) or {}
    for key, category in (("driver_version", "driver"), ("cuda_driver_version", "driver"),
                          ("nccl_version", "nccl")):
        if rg.get(key) != ng.get(key):
            out.append(Difference(category, key, rg.get(key), ng.get(key)))
    out += _gpu_field_diffs(rg, ng)
    out += _package_diffs(ref.get("packages", {}) or {}, now.get("packages", {}) or {})
    out += _env_diffs(ref, now)
    rh, nh = ref.get("host", {}) or {}, now.get("host", {}) or {}
    for key in ("kernel", "boot_id", "hostname"):
        if rh.get(key) != nh.get(key):
            out.append(Difference("kernel" if key != "hostname" else "gpu", key, rh.get(key),
                                  nh.get(key)))
    rgit, ngit = ref.get("git", {}) or {}, now.get("git", {}) or {}
    if rgit.get("sha") != ngit.get("sha"):
        out.append(Difference("code", "git", rgit.get("sha"), ngit.get("sha"),
                              "different code: compare the same candidate, or bisect"))
    elif (rgit.get("patches") or {}) != (ngit.get("patches") or {}):
        before, after = _patch_list(rgit, ngit), _patch_list(ngit, rgit)
        out.append(Difference("code", "patches", before, after,
                              f"different patches on commit {str(rgit.get('sha'))[:12]}:"
                              " isolate tests them one by one"))
    return sorted(out, key=lambda d: (d.rank, d.key))


def _patch_list(side: Mapping, other: Mapping) -> str:
    """One side's patches by file name; a name both sides apply with different contents is
    marked "(changed)". "none" when the side applies no patch."""
    mine, theirs = side.get("patches") or {}, other.get("patches") or {}
    names = [name + (" (changed)" if name in theirs and theirs[name] != digest else "")
             for name, digest in sorted(mine.items())]
    return ", ".join(names) if names else "none"
