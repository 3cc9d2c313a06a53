"""The GPU seam: snapshot (for fingerprints), samples (telemetry), clock/power policy.

Why a seam: the same trial code must run on a real node (NVML through `pynvml`) and on the
simulated node (a JSON GPU-state file the sim server reads), and tests can only exercise the
latter here. Both backends pass the same conformance suite (`tests/test_gpu_control.py`).

Clock policy is a factor of a candidate: `default` leaves the node as it is (a power limit
someone lowered stays lowered: that may be the cause being looked for), `locked:MHZ` locks SM
clocks, `power:WATTS` sets the board power limit; `reset` restores driver defaults. Policies
combine with commas (`locked:1980,power:450`). Whatever is applied is restored after the trial,
also when the server crashed.
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


@dataclass(frozen=True)
class ClockPolicy:
    locked_mhz: int | None = None
    power_w: int | None = None
    reset: bool = False

    @classmethod
    def parse(cls, text: str) -> ClockPolicy:
        text = (text or "default").strip()
        if text == "default":
            return cls()
        locked = power = None
        reset = False
        for part in text.split(","):
            kind, _, value = part.strip().partition(":")
            if kind == "reset" and not value:
                reset = True
                continue
            if kind not in ("locked", "power") or not value.isdigit() or int(value) <= 0:
                raise UserError(
                    f"bad clock policy {text!r}: use default, reset, locked:MHZ, power:WATTS"
                    " (comma-separated to combine)"
                )
            if kind == "locked":
                locked = int(value)
            else:
                power = int(value)
        return cls(locked, power, reset)

    @property
    def is_default(self) -> bool:
        return self.locked_mhz is None and self.power_w is None and not self.reset


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
        """Apply a policy; return what `restore` needs to put the previous state back."""

    @abstractmethod
    def restore(self, token: object) -> None:
        """Undo an `apply` (idempotent)."""


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
