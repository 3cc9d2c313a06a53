"""Fingerprints: everything about a trial's environment that could matter, as a diffable dict.

Secrets never leave the node: every value is redacted (:mod:`orchestrator.system.redact`, by name and
by value) before the fingerprint is stored, logged or reported.

The environment recorded is the one the server process really has (read back from
``/proc/<pid>/environ`` once it is ready, :func:`record_server_env`), not the one sleuth meant
to give it: a launcher, wrapper, container or systemd unit between the two may drop or add
variables, and "the NCCL variables never reached the server" is a cause worth naming.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.system.redact import REDACTED
from orchestrator.system.redact import redact_env as redact_env

__all__ = ["REDACTED", "collect", "record_server_env", "redact_env", "whole_env"]

# Packages whose versions change inference performance or sleuth's own behaviour.
PACKAGES = ("sglang", "torch", "flashinfer-python", "sgl-kernel", "triton", "nvidia-nccl-cu12",
            "nvidia-nccl-cu13", "transformers", "ray", "sleuth")

# Environment variables worth recording even when the candidate did not set them.
RELEVANT_ENV = re.compile(r"^(NCCL_|CUDA_|SGLANG_|TORCH_|NVIDIA_|OMP_|PYTORCH_|HF_|FLASHINFER_)")


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    return redact_env({k: v for k, v in env.items() if RELEVANT_ENV.match(k)})


# Variables that describe sleuth's own process tree rather than the node: never a cause.
# (OMP_NUM_THREADS is not one: Ray sets it to 1 in its workers when it is unset, the server
# inherits it, and a change of it changes the server's CPU-side threads.)
_OWN_ENV = re.compile(r"^(RAY_|_$|PYTHONPATH$|VIRTUAL_ENV$|PYTEST_|COV_CORE_|SLEUTH_SIM_)")


def whole_env(env: Mapping[str, str]) -> dict[str, str]:
    """The server's whole environment (redacted), minus sleuth's own bookkeeping variables:
    a changed shell profile on the node shows up here, even for names no list anticipated."""
    return redact_env({k: v for k, v in env.items() if not _OWN_ENV.match(k)})


def record_server_env(fp: dict, intended: Mapping[str, str],
                      actual: Mapping[str, str] | None) -> None:
    """Record the environment the server process really has in ``fp["env"]``.

    ``server`` becomes the actual environment (redacted, minus sleuth's bookkeeping), so two
    fingerprints diff actual against actual. What sleuth handed to the launcher but the server
    lacks (``not_received``: the node's value) or has with another value, and what the server
    has that sleuth did not hand over (``added``), are kept beside it: the first is a named
    finding of its own ("set on the node, stripped before the server"). ``actual`` None (the
    process could not be read) keeps the intended environment, marked as such."""
    env = fp.setdefault("env", {})
    if actual is None:
        env["source"] = "intended"
        return
    want, got = whole_env(intended), whole_env(actual)
    env["server"] = got
    env["relevant"] = relevant_env(actual)
    env["source"] = "process"
    env["not_received"] = {k: v for k, v in want.items() if got.get(k) != v}
    env["added"] = {k: v for k, v in got.items() if k not in want}


def host_load() -> list[float] | None:
    """1, 5 and 15 minute load averages: client-side timings on a loaded host follow its load."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def _normalized(name: str) -> str:
    """A distribution name as PEP 503 compares them (`Flashinfer_Python` = `flashinfer-python`)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str]:
    """The versions of `names` that are installed (from the cached listing, see
    :func:`all_packages`), keyed as given."""
    installed = {_normalized(k): v for k, v in all_packages().items()}
    return {name: installed[_normalized(name)] for name in names if _normalized(name) in installed}


def file_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def basic(
    *,
    commit: str,
    patches: Sequence[str],
    requested_env: Mapping[str, str],
    server_env: Mapping[str, str],
    node: str,
) -> dict:
    """The first, small fingerprint: code, env, interpreter, packages, host."""
    return {
        "git": {"sha": commit, "patches": {Path(p).name: file_hash(p) for p in patches}},
        "env": {
            "requested": redact_env(requested_env),
            "relevant": relevant_env(server_env),
            "server": whole_env(server_env),
            "source": "intended",
        },
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "host": {
            "node": node,
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
            "loadavg": host_load(),
            "cpus": os.cpu_count(),
        },
    }


def site_signature(paths: Sequence[str] | None = None) -> tuple:
    """What says an installed-package listing is still current: every import path (`sys.path`),
    with its directory's device, inode and mtime. pip, uv and conda install, upgrade and remove
    a distribution by adding or removing its `*.dist-info` (or `.egg-info`) directory in a
    site directory, which changes that directory's mtime; a site directory replaced wholesale
    (a new venv at the same path) has a new inode; a changed `sys.path` is another tuple.
    Python's own `importlib.metadata` keys its directory-listing cache on the same mtime."""
    out = []
    for entry in sys.path if paths is None else paths:
        path = entry or os.getcwd()  # "" is the working directory
        try:
            st = os.stat(path)
        except OSError:
            out.append((path, None))
            continue
        out.append((path, st.st_dev, st.st_ino, st.st_mtime_ns))
    return tuple(out)


RACY_NS = 2_000_000_000

# The last listing and the signature it was read under (one per process: a node actor lists
# its site-packages once, not on every trial).
_listing: tuple[tuple, dict[str, str]] | None = None


def all_packages() -> dict[str, str]:
    """Every installed distribution, `name -> version` (what `pip freeze` would list).

    Parsing every distribution's metadata costs tens of milliseconds (about 0.1 ms each), and
    a node asks on every trial: the listing is kept and read again only when
    :func:`site_signature` changes, so a package installed, upgraded or removed between two
    trials is in the second one's fingerprint."""
    global _listing
    signature = site_signature()
    if _listing is not None and _listing[0] == signature:
        return dict(_listing[1])
    out = {}
    for dist in importlib.metadata.distributions():
        meta = dist.metadata  # parsed once: `dist.version` would parse the file again
        name, version = meta["Name"], meta["Version"]
        if name:
            out[name.lower()] = version
    listing = dict(sorted(out.items()))
    if settled(signature):
        _listing = (signature, listing)
    return dict(listing)


def settled(signature: tuple) -> bool:
    """Whether a listing read under `signature` may be kept: a directory changed within the
    last moments may change again within the same timestamp tick, which its mtime would not
    show (git's "racy" rule), so such a listing is read again next time."""
    recent = time.time_ns() - RACY_NS
    return all(part[1] is None or part[3] < recent for part in signature)


def package_fields(pkgs: Mapping[str, str]) -> dict:
    """`packages`, `pip_freeze_sha256` and `key_versions` of a fingerprint, from the versions
    the server runs with (the node's, or what an overlay replaced them with)."""
    freeze = "\n".join(f"{k}=={v}" for k, v in sorted(pkgs.items()))
    return {"packages": {k: pkgs[k] for k in sorted(pkgs)},
            "pip_freeze_sha256": hashlib.sha256(freeze.encode()).hexdigest(),
            "key_versions": {k: pkgs.get(k) for k in PACKAGES if pkgs.get(k)}}


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def system_read(fingerprint: Mapping | None) -> bool:
    """Whether a trial got as far as reading its system (:func:`collect` writes the package
    listing with the rest): one stopped between launch and the read keeps only what its
    teardown wrote (on a cluster, with its node's identity), and compared with a read one
    would show every package as newly installed."""
    return bool(fingerprint) and "packages" in fingerprint


def system_info() -> dict:
    uptime = _read("/proc/uptime")
    return {
        "kernel": platform.release(),
        "os": platform.platform(),
        "boot_id": _read("/proc/sys/kernel/random/boot_id"),
        "uptime_s": float(uptime.split()[0]) if uptime else None,
        "nvidia_driver_module": (_read("/proc/driver/nvidia/version") or "").splitlines()[:1],
    }


def collect(
    *,
    commit: str,
    patches: Sequence[str],
    requested_env: Mapping[str, str],
    server_env: Mapping[str, str],
    node: str,
    gpu: Mapping | None = None,
    clock: str = "default",
    dirty_diff: str | None = None,
    packages: Mapping[str, str] | None = None,
) -> dict:
    """The full fingerprint of a trial: code, env, interpreter, packages, host, GPUs."""
    fp = basic(commit=commit, patches=patches, requested_env=requested_env,
               server_env=server_env, node=node)
    fp["git"]["dirty_diff"] = dirty_diff
    fp.update(package_fields(dict(packages) if packages is not None else all_packages()))
    fp["host"].update(system_info())
    fp["clock_policy"] = clock
    fp["gpu"] = dict(gpu or {})
    return fp
