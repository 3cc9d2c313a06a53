"""The GPU seam: snapshot (for fingerprints), samples (telemetry), clock/power policy.

Why a seam: the same trial code must run on a real node (NVML through `pynvml`) and on the
simulated node (a JSON GPU-state file the sim server reads), and tests can only exercise the
latter here. Both backends pass the same conformance suite
(`tests/conformance/test_gpu_control.py`; NVML against an in-memory `pynvml`).

Clock policy is a factor of a candidate: `default` leaves the node as it is (a power limit
someone lowered stays lowered: that may be the cause being looked for); otherwise a policy sets
some of the node's clock settings, each one a *part* that can be set on its own:

    power:WATTS | power:default      board power limit (or the GPU's default limit)
    locked:MHZ  | locked:off         SM clock lock (off: unlocked)
    mem_locked:MHZ | mem_locked:off  memory clock lock
    app:MHZ     | app:default        SM applications clock
    persistence:on | persistence:off persistence mode
    reset                            SM lock off and the default power limit (shorthand)

Parts combine with commas (`locked:1980,power:450`); a setting no part names is left as the node
has it. That is what lets `isolate` restore each clock difference (a power limit *and* an SM
lock changed from outside) to the reference's value on its own. Whatever is applied is restored
after the trial, also when the server crashed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Collection
from dataclasses import dataclass

from orchestrator.errors import UserError

# Throttle reasons that mean "this trial measured a disturbed GPU": not a property of the
# candidate. A steady power cap (`sw_power_cap`) is configuration and is not in this set.
SUSPECT_REASONS = frozenset({
    "sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown", "hw_power_brake_slowdown",
})


# Policy parts in the order a policy is written (`locked:1980,power:450`: existing policies keep
# their spelling, so candidates keep their keys).
CLOCK_PARTS = ("reset", "locked", "mem_locked", "app", "power", "persistence")
_OFF = {"locked": "off", "mem_locked": "off", "app": "default", "power": "default"}
_PART_HELP = ("use default, reset, locked:MHZ|off, mem_locked:MHZ|off, app:MHZ|default,"
              " power:WATTS|default, persistence:on|off (comma-separated to combine)")


def _part_value(kind: str, value: str, text: str) -> str:
    if kind == "reset":
        if value:
            raise UserError(f"bad clock policy {text!r}: 'reset' takes no value; {_PART_HELP}")
        return ""
    if kind == "persistence":
        if value not in ("on", "off"):
            raise UserError(f"bad clock policy {text!r}: persistence is on or off; {_PART_HELP}")
        return value
    if kind not in _OFF:
        raise UserError(f"bad clock policy {text!r}: {_PART_HELP}")
    if value == _OFF[kind]:
        return value
    if not value.isdigit() or int(value) <= 0:
        raise UserError(f"bad clock policy {text!r}: {_PART_HELP}")
    return str(int(value))


@dataclass(frozen=True)
class ClockPolicy:
    """A parsed clock policy: which parts it sets (see the module docstring)."""

    locked_mhz: int | None = None
    power_w: int | None = None
    reset: bool = False
    sm_unlock: bool = False
    mem_locked_mhz: int | None = None
    mem_unlock: bool = False
    app_sm_mhz: int | None = None
    app_default: bool = False
    power_default: bool = False
    persistence: bool | None = None

    @classmethod
    def parse(cls, text: str) -> ClockPolicy:
        return cls.from_parts(parse_parts(text))

    @classmethod
    def from_parts(cls, parts: dict[str, str]) -> ClockPolicy:
        def num(kind: str) -> int | None:
            value = parts.get(kind)
            return int(value) if value is not None and value.isdigit() else None

        return cls(
            locked_mhz=num("locked"), power_w=num("power"), reset="reset" in parts,
            sm_unlock=parts.get("locked") == "off", mem_locked_mhz=num("mem_locked"),
            mem_unlock=parts.get("mem_locked") == "off", app_sm_mhz=num("app"),
            app_default=parts.get("app") == "default",
            power_default=parts.get("power") == "default",
            persistence=None if "persistence" not in parts else parts["persistence"] == "on",
        )

    @property
    def is_default(self) -> bool:
        return self == ClockPolicy()


def parse_parts(text: str) -> dict[str, str]:
    """`locked:1980,power:450` -> `{"locked": "1980", "power": "450"}`; `default` -> `{}`.
    Raises UserError (one line naming the accepted forms) for anything else."""
    text = (text or "default").strip()
    if text == "default":
        return {}
    parts: dict[str, str] = {}
    for raw in text.split(","):
        kind, _, value = raw.strip().partition(":")
        if kind in parts:
            raise UserError(f"bad clock policy {text!r}: {kind} is given twice")
        parts[kind] = _part_value(kind, value.strip(), text)
    return parts


def format_parts(parts: dict[str, str]) -> str:
    """The policy string of some parts, in the canonical order (`default` for none)."""
    unknown = set(parts) - set(CLOCK_PARTS)
    if unknown:
        raise ValueError(f"unknown clock policy parts {sorted(unknown)}")
    shown = [k if k == "reset" else f"{k}:{parts[k]}" for k in CLOCK_PARTS if k in parts]
    return ",".join(shown) or "default"


@dataclass(frozen=True)
class GpuSample:
    """One GPU at one moment, as NVML would report it."""

    t: float
    index: int
    sm_clock_mhz: float
    power_w: float
    temperature_c: float
    utilization_pct: float
    throttle_reasons: tuple[str, ...]
    foreign_pids: tuple[int, ...]
    # Listed by the driver but not visible from this PID namespace, with nothing to map them
    # through (`gpu/pids.py`): neither known to be the server's nor known not to be.
    unattributed_pids: tuple[int, ...] = ()


class GpuControl(ABC):
    """One node's GPUs."""

    name = ""

    @abstractmethod
    def snapshot(self) -> dict:
        """Driver, CUDA and NCCL versions and per-GPU static state, for the fingerprint."""

    @abstractmethod
    def sample(self, own_pids: Collection[int] = ()) -> list[GpuSample]:
        """Current clocks, power, temperature, throttle reasons and foreign processes."""

    @abstractmethod
    def apply(self, policy: ClockPolicy) -> object:
        """Apply a policy; return what `restore` needs to put the previous state back (a value
        that survives JSON: the node persists it so a later actor can restore a killed one's).
        A policy the GPUs cannot take raises, leaving no GPU half-set."""

    @abstractmethod
    def restore(self, token: object) -> None:
        """Undo an `apply`: only what it changed (idempotent). Raises when the node could not
        be put back, so the trial says so instead of the next one running on these clocks."""


class NoGpuControl(GpuControl):
    """A node without NVIDIA GPUs: nothing to snapshot, sample or set."""

    name = "none"

    def snapshot(self) -> dict:
        return {"backend": self.name}

    def sample(self, own_pids: Collection[int] = ()) -> list[GpuSample]:
        return []

    def apply(self, policy: ClockPolicy) -> object:
        if not policy.is_default:
            raise RuntimeError("this node has no GPU control: clock policies need NVML")
        return None

    def restore(self, token: object) -> None:
        return None
