"""A log's partial fingerprint against a trial's: what is known to differ, and what is unknown.

A reference run's fingerprint is complete, so :func:`orchestrator.system.fingerprint_diff.diff`
compares field by field. A log's is not: a field it lacks is not "absent then", it is unknown,
and diffing it as absent would invent a difference on every GPU setting. So:

- **known** from the log, and diffed: the NCCL variables (with `NCCL_DEBUG=INFO`, NCCL prints
  every setting it takes from the environment, so one it did not print was unset; NCCL's own
  debug settings are never echoed and are left out), the NCCL release (as the package that
  provides it now, an overlay restores it), the server settings (`server_args=` against the
  server's `/server_info` now: a field the target does not set is stated, not tested), the host;
- **unknown, and tested**: a clock or power setting that differs now from the GPU's own
  default (a lowered power limit, a clock lock). The log cannot say what it was then; the
  default is what a node has unless someone changed it, so "restore the default" is tested
  and the label says "not in the log (default 600 W)", never "600 W";
- **unknown, listed**: the driver and CUDA, the GPU model and PCIe link, packages other than
  NCCL, variables other than NCCL_*, other GPU processes, the commit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from orchestrator.records import UNSET
from orchestrator.reference.record import NCCL_SILENT
from orchestrator.reference.server_args import setting_differences
from orchestrator.system.fingerprint_diff import (
    GPU_FIELDS,
    PERF_ENV,
    Difference,
    diff,
    show_value,
)
from orchestrator.util.pins import canonical

UNKNOWN = "unknown"
NOT_IN_LOG = "not in the log"
_NCCL_PACKAGES = ("nvidia-nccl-cu12", "nvidia-nccl-cu13")
# A clock field, the field that holds its default, and the policy part that restores it.
_DEFAULTS = {
    "power_limit_w": ("power_limit_default_w", ("power", "default")),
    "sm_clock_locked_mhz": (None, ("locked", "off")),
    "mem_clock_locked_mhz": (None, ("mem_locked", "off")),
    "applications_clock_sm_mhz": ("applications_clock_sm_default_mhz", ("app", "default")),
}


def differences(ref: Mapping, now: Mapping) -> list[Difference]:
    """The fingerprint differences of a reference (a run's, or a log's) against now."""
    if ref.get("source") != "log":
        return diff(ref, now)
    out = _nccl_env(ref, now) + _nccl_release(ref, now) + _clocks(now) + _server(ref, now)
    out += _unknowns(ref, now)
    host_then = (ref.get("host") or {}).get("hostname")
    host_now = (now.get("host") or {}).get("hostname")
    if host_then and host_now and host_then != host_now:
        out.append(Difference("gpu", "hostname", host_then, host_now,
                              "the log's NCCL lines name another host"))
    return sorted(out, key=lambda d: (d.rank, d.key))


def _release(version: object) -> str | None:
    m = re.match(r"\d+\.\d+\.\d+", str(version or ""))
    return m.group(0) if m else None


def _nccl_env(ref: Mapping, now: Mapping) -> list[Difference]:
    env = ref.get("env") or {}
    if not env.get("nccl_known"):
        return []
    then = {k: v for k, v in (env.get("server") or {}).items() if k.startswith("NCCL_")}
    now_env = now.get("env") or {}
    server = {k: v for k, v in (now_env.get("server") or {}).items() if k.startswith("NCCL_")}
    dropped = dict(now_env.get("not_received") or {})
    out = []
    for var in sorted(set(then) | set(server)):
        if var in NCCL_SILENT and var != "NCCL_DEBUG":
            continue
        a, b = then.get(var), server.get(var)
        if a == b:
            continue
        detail = ("NCCL printed no 'set by environment' line for it then: unset" if a is None
                  else "NCCL printed it as set by the environment then")
        if var == "NCCL_DEBUG":
            detail = "the log's NCCL INFO lines need NCCL_DEBUG=INFO (or more verbose)"
        extra = {}
        if var in dropped:
            detail += (f"; the node sets {var}={dropped[var]} but the server did not get it:"
                       " a launcher or wrapper drops it")
            extra["dropped_before_server"] = True
        out.append(Difference("env", var, a, b, detail, True,
                              ("env", var, UNSET if a is None else a), extra))
    return out


def _nccl_release(ref: Mapping, now: Mapping) -> list[Difference]:
    then = _release((ref.get("gpu") or {}).get("nccl_version"))
    if then is None:
        return []
    packages = now.get("packages") or {}
    dist = next((d for d in _NCCL_PACKAGES if d in packages), None)
    if dist is not None:
        now_v = _release(packages[dist])
        if now_v == then:
            return []
        return [Difference("nccl", dist, then, packages[dist],
                           "the NCCL release of the log's 'NCCL version' line, installed now as"
                           f" {dist}", True, ("package", canonical(dist), then))]
    now_v = _release((now.get("gpu") or {}).get("nccl_version"))
    if now_v is None or now_v == then:
        return []
    return [Difference("nccl", "nccl_version", then, now_v,
                       "the system's NCCL (no NCCL wheel installed): not settable per trial")]


def _clocks(now: Mapping) -> list[Difference]:
    """Clock and power settings that differ from the GPU's defaults now, each tested against
    the default (unknown then)."""
    gpus = (now.get("gpu") or {}).get("gpus") or []
    out = []
    for name, (default_field, level) in _DEFAULTS.items():
        moved = []
        for g in gpus:
            value = g.get(name)
            default = g.get(default_field) if default_field else None
            if value is None or (default_field and (default is None or value == default)):
                continue
            moved.append((value, default))
        if not moved:
            continue
        value, default = moved[0]
        label_default = (show_value(name, default) if default_field
                         else show_value(name, None))
        detail = (f"{NOT_IN_LOG}: on {len(moved)}/{len(gpus)} GPUs it differs now from the"
                  f" GPU's default ({label_default}), which is tested")
        out.append(Difference("clock", name, default, value, detail, True, ("clock", *level),
                              {"unknown_then": True, "then": f"{NOT_IN_LOG} (default"
                                                             f" {label_default})"}))
    return out


def _server(ref: Mapping, now: Mapping) -> list[Difference]:
    then, now_args = ref.get("server_args"), now.get("server_args")
    if not then or not isinstance(now_args, Mapping):
        return []
    return [Difference("server", key, a, b, "a server setting this target does not set: not"
                       " tested") for key, a, b in setting_differences(then, now_args)]


def _unknown(key: str, now_text: str, detail: str = "") -> Difference:
    return Difference(UNKNOWN, key, None, now_text, detail or f"{NOT_IN_LOG}: unknown then",
                      extra={"then": NOT_IN_LOG})


def _unknowns(ref: Mapping, now: Mapping) -> list[Difference]:
    """One listed difference per part of the fingerprint the log cannot tell."""
    gpu = now.get("gpu") or {}
    gpus = gpu.get("gpus") or []
    first = gpus[0] if gpus else {}
    out = []
    moved = {d.key for d in _clocks(now)}
    clocks = [f for f, spec in GPU_FIELDS.items() if spec[0] == "clock" and f not in moved]
    if gpus and clocks:
        shown = ", ".join(f"{GPU_FIELDS[f][1]} {show_value(f, first.get(f))}" for f in clocks
                          if f in first)
        out.append(_unknown("clocks and power limit", f"now at the defaults ({shown})"))
    driver = gpu.get("driver_version")
    if driver:
        out.append(_unknown("GPU driver and CUDA", f"driver {driver} now"))
    if first.get("name"):
        link = (f", PCIe gen {first.get('pcie_gen')} x{first.get('pcie_width')}"
                if first.get("pcie_gen") else "")
        out.append(_unknown("GPU model and PCIe link", f"{len(gpus)}x {first['name']}{link} now"))
    packages = {k: v for k, v in (now.get("packages") or {}).items() if k not in _NCCL_PACKAGES}
    if packages:
        out.append(_unknown("package versions other than NCCL", f"{len(packages)} installed now"))
    env_now = (now.get("env") or {}).get("server") or {}
    nccl_known = (ref.get("env") or {}).get("nccl_known")
    others = sorted(k for k in env_now if not (nccl_known and k.startswith("NCCL_")))
    if others:
        perf = [k for k in others if PERF_ENV.match(k)]
        out.append(_unknown("environment variables" + ("" if not nccl_known else
                                                        " other than NCCL_*"),
                            f"{len(others)} set now" + (f", among them {', '.join(perf[:6])}"
                                                       if perf else "")))
    procs = {p.get("pid") for g in gpus for p in g.get("processes", [])}
    if procs:
        out.append(_unknown("other GPU processes", f"{len(procs)} on the GPUs now"))
    sha = (now.get("git") or {}).get("sha")
    out.append(_unknown("the commit it ran", f"measured at {str(sha)[:12]}" if sha else "unknown",
                        f"{NOT_IN_LOG}: the reference is measured at the commit named (good= or"
                        " commit=)"))
    return out
