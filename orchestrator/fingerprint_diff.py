"""Diff two fingerprints into ranked, human-readable differences.

Ranking is by plausibility as a cause of a performance change on an inference node (driver,
NCCL, clocks/power, foreign GPU processes, PCIe link, packages, env, kernel). Each difference
says whether sleuth can set it per trial (`controllable`) and, if so, the factor level that
reproduces each side: that is what `sleuth isolate` needs to test it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from orchestrator.fingerprint import RELEVANT_ENV
from orchestrator.targets.base import UNSET

# (category, plausibility rank: lower = more plausible)
RANK = {"driver": 1, "nccl": 2, "clock": 3, "gpu_process": 4, "pcie": 5, "package": 6,
        "env": 7, "code": 8, "kernel": 9, "gpu": 10}


@dataclass(frozen=True)
class Difference:
    category: str
    key: str  # e.g. "power_limit_w", "NCCL_PROTO", "rich"
    reference: object
    now: object
    detail: str = ""
    controllable: bool = False
    # Factor levels for `isolate`: (factor, level on the reference side, level on the now side)
    factor: tuple[str, object, object] | None = None
    extra: dict = field(default_factory=dict)

    @property
    def rank(self) -> float:
        if self.category == "env" and RELEVANT_ENV.match(self.key):
            return 2.5  # NCCL_*, CUDA_*, SGLANG_* ... rank with NCCL itself, before packages
        return RANK.get(self.category, 99)

    @property
    def label(self) -> str:
        ref = "unset" if self.reference is None else self.reference
        now = "unset" if self.now is None else self.now
        return f"{self.key}: {ref} -> {now}"

    def to_json(self) -> dict:
        return {"category": self.category, "key": self.key, "reference": self.reference,
                "now": self.now, "detail": self.detail, "controllable": self.controllable,
                "rank": self.rank, "label": self.label,
                "factor": list(self.factor) if self.factor else None}


def _gpu_field_diffs(ref: Mapping, now: Mapping) -> list[Difference]:
    out: list[Difference] = []
    ref_gpus = {g.get("index"): g for g in ref.get("gpus", [])}
    now_gpus = {g.get("index"): g for g in now.get("gpus", [])}
    fields = {
        "power_limit_w": "clock", "sm_clock_locked_mhz": "clock", "sm_clock_max_mhz": "gpu",
        "applications_clock_sm_mhz": "clock", "persistence_mode": "gpu", "pcie_gen": "pcie",
        "pcie_width": "pcie", "ecc_errors": "gpu", "name": "gpu", "memory_total_mib": "gpu",
    }
    for name, category in fields.items():
        changed = {}
        for i in sorted(set(ref_gpus) | set(now_gpus)):
            a, b = ref_gpus.get(i, {}).get(name), now_gpus.get(i, {}).get(name)
            if a != b:
                changed[i] = (a, b)
        if not changed:
            continue
        pairs = sorted({v for v in changed.values()}, key=str)
        a, b = pairs[0]
        detail = f"on {len(changed)}/{max(len(ref_gpus), len(now_gpus))} GPUs"
        factor = None
        if name == "power_limit_w" and a:
            factor = ("clock", f"power:{int(a)}", "default")
        elif name == "sm_clock_locked_mhz":
            factor = ("clock", f"locked:{int(a)}" if a else "reset", "default")
        out.append(Difference(category, name, a, b, detail, factor is not None, factor))
    ref_procs = {p["pid"] for g in ref_gpus.values() for p in g.get("processes", [])}
    now_procs = {(p["pid"], p.get("name", ""), p.get("used_memory_mib")) for g in now_gpus.values()
                 for p in g.get("processes", []) if p["pid"] not in ref_procs}
    if now_procs:
        shown = ", ".join(f"pid {pid} {name} {mem} MiB" for pid, name, mem in sorted(now_procs))
        out.append(Difference("gpu_process", "foreign GPU processes", None, shown,
                              "processes on the GPUs that were not there before"))
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
    rp, np_ = ref.get("packages", {}) or {}, now.get("packages", {}) or {}
    for name in sorted(set(rp) | set(np_)):
        if rp.get(name) != np_.get(name):
            category = "nccl" if "nccl" in name else "package"
            out.append(Difference(category, name, rp.get(name), np_.get(name)))
    re_, ne = (ref.get("env", {}) or {}).get("server", {}), (now.get("env", {}) or {}).get("server", {})
    for var in sorted(set(re_) | set(ne)):
        if re_.get(var) != ne.get(var):
            ref_level = re_.get(var, UNSET)
            out.append(Difference("env", var, re_.get(var), ne.get(var), controllable=True,
                                  factor=("env", (var, ref_level), (var, None))))
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
