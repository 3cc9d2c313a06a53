"""GPU control and telemetry: one small seam, a real NVML backend and a simulated one."""

from orchestrator.gpu.base import (
    SUSPECT_REASONS,
    ClockPolicy,
    GpuControl,
    GpuSample,
    NoGpuControl,
)

__all__ = ["SUSPECT_REASONS", "ClockPolicy", "GpuControl", "GpuSample", "NoGpuControl"]
