"""Telemetry during a trial: a sampler thread reading the node's GPUs while the server runs.

A trial measured on a disturbed GPU (thermal or hardware slowdown, a foreign process on its
GPUs, clocks or power limit changed under it) is marked *suspect*: its numbers are kept and
shown, but strategies may leave them out, so one bad restart cannot flip a decision. Which of
the processes on the GPUs are the trial's own is decided across PID namespaces
(`gpu/pids.py`): in a container the driver lists host pids.
"""

from __future__ import annotations

import statistics
import threading
from collections.abc import Callable, Collection
from dataclasses import replace

from orchestrator.gpu.base import SUSPECT_REASONS, GpuControl, GpuSample, NoGpuControl
from orchestrator.gpu.pids import PidResolver

MAX_KEPT_SAMPLES = 400


class TelemetrySampler:
    def __init__(self, gpu: GpuControl, interval_s: float, own_pids: Callable[[], Collection[int]],
                 resolver: PidResolver | None = None):
        self.gpu = gpu
        self.resolver = resolver
        self.interval_s = max(0.05, float(interval_s))
        self.own_pids = own_pids
        self.samples: list[GpuSample] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="sleuth-telemetry", daemon=True)
        # A node without GPUs has nothing to sample: no thread, and no scan of the processes
        # (`own_pids`) on every sample of a trial that lasts milliseconds.
        self._nothing = isinstance(gpu, NoGpuControl)
        self.own_processes = 0  # the most processes the server's group had at one sample

    def start(self) -> TelemetrySampler:
        if not self._nothing:
            self._thread.start()
        return self

    def _loop(self) -> None:
        while True:
            self.sample_once()
            if self._stop.wait(self.interval_s):
                return

    def sample_once(self) -> None:
        if self._nothing:
            return
        try:
            if self.resolver is None:
                self.resolver = PidResolver()
            group = set(self.own_pids())
            self.own_processes = max(self.own_processes, len(group))
            own = self.resolver.own_ids(group)
            for s in self.gpu.sample(own):
                foreign, unknown = self.resolver.split(s.foreign_pids, own)
                self.samples.append(replace(s, foreign_pids=foreign, unattributed_pids=unknown))
        except Exception as exc:  # telemetry must never break the trial; say it was missing
            if len(self.errors) < 5:
                self.errors.append(f"{type(exc).__name__}: {exc}")

    def stop(self) -> dict:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        self.sample_once()  # one last look, so a short trial still has a sample at its end
        return summarize(self.samples, self.errors, self.own_processes)


def summarize(samples: list[GpuSample], errors: list[str] | None = None,
              own_processes: int = 0) -> dict:
    """Trial-level telemetry and the suspect verdict (with the reason a person can check).
    GPU processes that cannot be attributed (another PID namespace, nothing to map it through)
    make the trial suspect only when they outnumber the server's own processes."""
    if not samples:
        return {"n_samples": 0, "suspect": False, "suspect_reason": "", "errors": errors or []}
    clocks = [s.sm_clock_mhz for s in samples]
    power = [s.power_w for s in samples]
    reasons = sorted({r for s in samples for r in s.throttle_reasons})
    foreign = sorted({p for s in samples for p in s.foreign_pids})
    why = []
    bad = sorted(set(reasons) & SUSPECT_REASONS)
    if bad:
        why.append("GPU throttled: " + ", ".join(bad))
    if foreign:
        why.append(f"foreign process(es) on the GPUs: pids {foreign[:8]}")
    unknown = sorted({p for s in samples for p in s.unattributed_pids})
    if len(unknown) > own_processes:
        why.append(f"{len(unknown)} process(es) on the GPUs outside this PID namespace, more than"
                   f" the server's {own_processes}: some are not its own (pids {unknown[:8]})")
    per_gpu_clock = {}
    for s in samples:
        per_gpu_clock.setdefault(s.index, set()).add(round(s.sm_clock_mhz))
    return {
        "n_samples": len(samples),
        "sm_clock_mhz": {"min": min(clocks), "mean": round(statistics.fmean(clocks), 1),
                         "max": max(clocks)},
        "power_w": {"mean": round(statistics.fmean(power), 1), "max": max(power)},
        "temperature_c_max": max(s.temperature_c for s in samples),
        "throttle_reasons": reasons,
        "foreign_pids": foreign,
        "unattributed_pids": unknown,
        "suspect": bool(why),
        "suspect_reason": "; ".join(why),
        "errors": errors or [],
        "samples": [s.__dict__ for s in samples[-MAX_KEPT_SAMPLES:]],
    }
