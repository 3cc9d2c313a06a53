"""Fingerprints: everything about a trial's environment that could matter, as a diffable dict.

Secrets never leave the node: any variable whose name looks like a credential is redacted
before the fingerprint is stored, logged or reported.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import platform
import re
import socket
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

_SECRET = re.compile(r"(TOKEN|KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL)", re.IGNORECASE)
REDACTED = "<redacted>"

# Packages whose versions change inference performance or sleuth's own behaviour.
PACKAGES = ("sglang", "torch", "flashinfer-python", "sgl-kernel", "triton", "nvidia-nccl-cu12",
            "nvidia-nccl-cu13", "transformers", "ray", "sleuth")

# Environment variables worth recording even when the candidate did not set them.
_RELEVANT_ENV = re.compile(r"^(NCCL_|CUDA_|SGLANG_|TORCH_|NVIDIA_|OMP_|PYTORCH_|HF_|FLASHINFER_)")


def is_secret(name: str) -> bool:
    return bool(_SECRET.search(name))


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: (REDACTED if is_secret(k) else v) for k, v in sorted(env.items())}


def relevant_env(env: Mapping[str, str]) -> dict[str, str]:
    return redact_env({k: v for k, v in env.items() if _RELEVANT_ENV.match(k)})


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str]:
    out = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


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
        },
        "python": sys.version.split()[0],
        "packages": package_versions(),
        "host": {
            "node": node,
            "hostname": socket.gethostname(),
            "kernel": platform.release(),
        },
    }
