"""Tensor-parallel all-reduce cost on an 8-GPU PCIe node, as NCCL environment variables shape it.

With more than two PCIe-only GPUs SGLang disables its custom all-reduce, so every TP all-reduce
is an NCCL call and the NCCL variables matter. Decode-time all-reduces are small (a few hundred
KiB) and therefore latency-bound, which is why the optimum is not NCCL's default: NCCL's tuner
favours Ring/Simple with many channels on this topology, while forcing the low-latency protocol,
Tree, fewer channels, system-wide P2P and a smaller buffer is faster (sweeps have something to
find). The bandwidth part of the cost (prefill-sized messages) moves the other way for LL,
whose effective bandwidth is half: a real trade-off, not a free lunch.

Invalid values fail like NCCL does at communicator init (the server dies at start), so a sweep
over a typo is an untestable candidate, not a slow one. Factors are relative to NCCL defaults
(default environment == 1.0 exactly) so the base phase times stay calibrated.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

PROTOCOLS = {"ll": "LL", "ll128": "LL128", "simple": "Simple"}
# latency factor, bandwidth factor of each protocol when it is the one NCCL uses
PROTOCOL_FACTORS = {"LL": (0.82, 2.0), "LL128": (0.97, 1.1), "Simple": (1.10, 1.0)}
ALGORITHMS = {
    "ring": "Ring", "tree": "Tree", "collnetdirect": "CollnetDirect",
    "collnetchain": "CollnetChain", "nvls": "NVLS", "nvlstree": "NVLSTree", "pat": "PAT",
}  # fmt: skip
# Only Ring and Tree can run an all-reduce on a PCIe node without NVSwitch or a CollNet fabric.
ALGORITHM_FACTORS = {"Ring": 1.02, "Tree": 0.90}
P2P_LEVELS = {"LOC": 0, "NVL": 1, "PIX": 2, "PXB": 3, "PHB": 4, "SYS": 5}
P2P_FACTORS = {0: 1.45, 1: 1.45, 2: 1.30, 3: 1.0, 4: 0.95, 5: 0.93}
DEFAULT_P2P_LEVEL = 3  # NCCL's default on PCIe: P2P through PCIe switches only
DEFAULT_CHANNELS = 8  # what NCCL's tuner picks for this topology
BEST_CHANNELS = 4
DEFAULT_BUFFSIZE = 4 * 1024 * 1024
BEST_BUFFSIZE = 1024 * 1024
SGLANG_DEFAULT_MAX_CONNECTIONS = 8  # SGLang exports CUDA_DEVICE_MAX_CONNECTIONS=8 if unset
REFERENCE_NCCL_MINOR = 27
NCCL_228_LATENCY = 1.9  # the sim's planted 2.28.0-2.28.6 small-message regression


class NcclConfigError(ValueError):
    """An NCCL variable holds a value NCCL rejects at init (`ncclInvalidUsage`)."""

    def __init__(self, var: str, value: str, reason: str):
        super().__init__(f"{var}={value!r}: {reason}")
        self.var = var
        self.value = value
        self.reason = reason


@dataclass(frozen=True)
class CommSettings:
    protocols: frozenset[str] | None = None  # None = NCCL chooses
    algorithms: frozenset[str] | None = None
    channels: int = DEFAULT_CHANNELS
    p2p_level: int = DEFAULT_P2P_LEVEL
    buffsize: int = DEFAULT_BUFFSIZE
    max_connections: int = SGLANG_DEFAULT_MAX_CONNECTIONS


def _name_set(var: str, raw: str, names: Mapping[str, str]) -> frozenset[str]:
    text = raw.strip()
    exclude = text.startswith("^")
    if exclude:
        text = text[1:]
    chosen = set()
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if token.lower() not in names:
            raise NcclConfigError(var, raw, f"unknown value {token!r}")
        chosen.add(names[token.lower()])
    if not chosen:
        raise NcclConfigError(var, raw, "empty selection")
    return frozenset(set(names.values()) - chosen if exclude else chosen)


def _algo_value(raw: str) -> str:
    """NCCL >= 2.24 also accepts per-collective lists: `allreduce:tree;allgather:ring`."""
    if ":" not in raw:
        return raw
    for part in raw.split(";"):
        op, _, algos = part.partition(":")
        if op.strip().lower() == "allreduce":
            return algos
    return ",".join(ALGORITHMS.values())  # all-reduce left to NCCL


def _positive_int(var: str, raw: str) -> int:
    try:
        value = int(raw.strip(), 0)
    except ValueError:
        raise NcclConfigError(var, raw, "not an integer") from None
    if value <= 0:
        raise NcclConfigError(var, raw, "must be positive")
    return value


def parse_comm_env(env: Mapping[str, str]) -> CommSettings:
    """Read the NCCL / CUDA variables that shape all-reduce. Raises NcclConfigError."""
    protocols = algorithms = None
    if env.get("NCCL_PROTO", "").strip():
        protocols = _name_set("NCCL_PROTO", env["NCCL_PROTO"], PROTOCOLS)
    if env.get("NCCL_ALGO", "").strip():
        algorithms = _name_set("NCCL_ALGO", _algo_value(env["NCCL_ALGO"]), ALGORITHMS)
        if not algorithms & set(ALGORITHM_FACTORS):
            raise NcclConfigError(
                "NCCL_ALGO", env["NCCL_ALGO"], "no algorithm available for AllReduce on PCIe"
            )
    channels = DEFAULT_CHANNELS
    if env.get("NCCL_MAX_NCHANNELS", "").strip():
        channels = min(channels, _positive_int("NCCL_MAX_NCHANNELS", env["NCCL_MAX_NCHANNELS"]))
    if env.get("NCCL_MIN_NCHANNELS", "").strip():
        channels = max(channels, _positive_int("NCCL_MIN_NCHANNELS", env["NCCL_MIN_NCHANNELS"]))
    channels = min(channels, 32)
    p2p = DEFAULT_P2P_LEVEL
    raw_p2p = env.get("NCCL_P2P_LEVEL", "").strip()
    if raw_p2p:
        if raw_p2p.upper() in P2P_LEVELS:
            p2p = P2P_LEVELS[raw_p2p.upper()]
        elif raw_p2p.isdigit() and int(raw_p2p) <= 5:
            p2p = int(raw_p2p)
        else:
            raise NcclConfigError("NCCL_P2P_LEVEL", raw_p2p, "unknown level")
    buffsize = DEFAULT_BUFFSIZE
    if env.get("NCCL_BUFFSIZE", "").strip():
        buffsize = _positive_int("NCCL_BUFFSIZE", env["NCCL_BUFFSIZE"])
    connections = SGLANG_DEFAULT_MAX_CONNECTIONS
    raw_conn = env.get("CUDA_DEVICE_MAX_CONNECTIONS", "").strip()
    if raw_conn.isdigit() and 1 <= int(raw_conn) <= 32:  # CUDA ignores anything else
        connections = int(raw_conn)
    return CommSettings(protocols, algorithms, channels, p2p, buffsize, connections)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _release(version: str) -> tuple[int, int, int] | None:
    parts = re.findall(r"\d+", str(version).split("+", 1)[0])[:3]
    if len(parts) < 2:
        return None
    return int(parts[0]), int(parts[1]), int(parts[2]) if len(parts) > 2 else 0


def nccl_version_factor(version: str) -> tuple[float, float]:
    """(latency, bandwidth) factors of an NCCL release against 2.27, the reference.

    Older releases tune PCIe all-reduce a little worse (a small, real-looking effect). The
    sim's own belief, planted for the package stories (not a claim about NCCL): 2.28.0 to
    2.28.6 regress the latency of small all-reduces on this PCIe topology by
    :data:`NCCL_228_LATENCY` (what decode and verify issue), and 2.28.7 fixes it."""
    release = _release(version)
    if release is None or release[0] != 2:
        return 1.0, 1.0
    _, minor, patch = release
    if minor < REFERENCE_NCCL_MINOR:
        f = min(1.2, 1.0 + 0.015 * (REFERENCE_NCCL_MINOR - minor))
        return f, f
    if minor == REFERENCE_NCCL_MINOR:
        return 1.0, 1.0
    if minor == 28 and patch < 7:
        return NCCL_228_LATENCY, 1.0
    return 0.99, 0.99


def allreduce_factors(settings: CommSettings, nccl_version: str) -> tuple[float, float]:
    """(latency factor, bandwidth factor) relative to the default environment."""
    lat = bw = 1.0
    if settings.protocols is not None:
        chosen = sorted(settings.protocols)
        lat *= _mean([PROTOCOL_FACTORS[p][0] for p in chosen])
        bw *= _mean([PROTOCOL_FACTORS[p][1] for p in chosen])
    if settings.algorithms is not None:
        usable = sorted(settings.algorithms & set(ALGORITHM_FACTORS))
        lat *= _mean([ALGORITHM_FACTORS[a] for a in usable])
    lat *= _channel_factor(settings.channels) / _channel_factor(DEFAULT_CHANNELS)
    lat *= P2P_FACTORS[settings.p2p_level]
    bw *= P2P_FACTORS[settings.p2p_level]
    lat *= _buffer_factor(settings.buffsize) / _buffer_factor(DEFAULT_BUFFSIZE)
    lat *= _connection_factor(settings.max_connections)
    version_lat, version_bw = nccl_version_factor(nccl_version)
    return lat * version_lat, bw * version_bw


def _channel_factor(channels: int) -> float:
    return 1.0 + 0.06 * abs(math.log2(channels / BEST_CHANNELS))


def _buffer_factor(buffsize: int) -> float:
    factor = 1.0 + 0.025 * abs(math.log2(buffsize / BEST_BUFFSIZE))
    if buffsize < 64 * 1024:  # too small to hold one decode all-reduce: many round trips
        factor *= 1.0 + 0.5 * math.log2(64 * 1024 / buffsize)
    return factor


def _connection_factor(connections: int) -> float:
    """One hardware queue serialises NCCL kernels behind compute; 32 queues overlap slightly more."""
    if connections == 1:
        return 1.10
    if connections < SGLANG_DEFAULT_MAX_CONNECTIONS:
        return 1.03
    return 0.99 if connections >= 32 else 1.0
