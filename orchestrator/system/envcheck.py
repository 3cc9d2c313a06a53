"""Up-front checks of environment settings NCCL and CUDA would reject only at server start.

A typo like `NCCL_PROTO=LL129` would otherwise cost a multi-minute server launch per trial and
show up as a wall of `launch_failed` trials; here it is one line and exit 2 before anything runs.
Values follow NCCL's documented forms (comma lists, a leading `^` to exclude).
"""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.errors import UserError
from orchestrator.records import UNSET

_ENUMS = {
    "NCCL_PROTO": {"LL", "LL128", "SIMPLE"},
    "NCCL_ALGO": {"RING", "TREE", "COLLNETDIRECT", "COLLNETCHAIN", "NVLS", "NVLSTREE", "PAT"},
}
_P2P_LEVELS = {"LOC", "NVL", "PIX", "PXB", "PHB", "SYS"}
_POSITIVE_INTS = {"NCCL_MAX_NCHANNELS": (1, 64), "NCCL_MIN_NCHANNELS": (1, 64),
                  "NCCL_BUFFSIZE": (1, 1 << 34), "CUDA_DEVICE_MAX_CONNECTIONS": (1, 32),
                  "NCCL_NTHREADS": (64, 512)}


def _enum_ok(name: str, value: str) -> bool:
    body = value[1:] if value.startswith("^") else value
    items = [v.strip() for v in body.split(",")]
    return bool(items) and all(v.upper() in _ENUMS[name] for v in items)


def check_env(env: Mapping[str, str]) -> None:
    for name, raw in env.items():
        value = str(raw)
        if value == UNSET:
            continue
        if name in _ENUMS and not _enum_ok(name, value):
            raise UserError(f"invalid {name}={value!r}: NCCL accepts {', '.join(sorted(_ENUMS[name]))}"
                            " (comma-separated, ^ to exclude)")
        if name == "NCCL_P2P_LEVEL" and value.upper() not in _P2P_LEVELS and not value.isdigit():
            raise UserError(f"invalid NCCL_P2P_LEVEL={value!r}: use {', '.join(sorted(_P2P_LEVELS))}"
                            " or a number")
        if name in _POSITIVE_INTS:
            lo, hi = _POSITIVE_INTS[name]
            if not value.isdigit() or not lo <= int(value) <= hi:
                raise UserError(f"invalid {name}={value!r}: expected an integer in [{lo}, {hi}]")
