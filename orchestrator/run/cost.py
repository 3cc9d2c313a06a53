"""What trials cost, measured: node wall time split into its parts, and GPU-minutes.

A restart of a large model costs minutes (weights over 8 GPUs, CUDA-graph capture) while one
benchmark repetition costs seconds; what the user pays for is node wall time times the GPUs
the server holds. Each trial's split comes from what the store records: the step times
(``trial_states``: launching, waiting_ready, warming_up, benchmarking, tearing_down, done) and
each repetition's own wall time (``repetition_times``).

Against the simulator wall time is scaled (``time_scale`` wall seconds per modeled second);
every figure here is divided by it, so a simulated run states *modeled* GPU-minutes, the
quantity a real node would have spent.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.records import TrialResult, TrialState
from orchestrator.stats.repetition_plan import CostModel
from orchestrator.store import TrialRow


@dataclass(frozen=True)
class TrialCost:
    """Seconds (modeled) of one trial: ``total`` from start to end, of which
    ``launch_to_ready``, ``warmup`` and each of ``repetitions``; the rest is preparing a
    checkout and tearing the server down."""

    total: float
    launch_to_ready: float | None
    warmup: float | None
    repetitions: tuple[float, ...]
    gpus: int

    @property
    def restart(self) -> float:
        """All but the repetitions: what a new restart costs before it measures anything."""
        return max(self.total - sum(self.repetitions), 0.0)

    @property
    def gpu_minutes(self) -> float:
        return self.total * self.gpus / 60.0


def simulated(target: Mapping) -> bool:
    """True for the simulated server: its GPU time is modeled, and every figure says so."""
    name = str(target.get("name", ""))
    return name == "sim" or (name == "sglang" and target.get("engine") == "sim")


def time_scale_of(target: Mapping) -> float:
    """Wall seconds per modeled second of the configured target (1 for a real server)."""
    scale = float(target.get("time_scale") or 1.0) if simulated(target) else 1.0
    return scale if scale > 0 else 1.0


def gpus_of(result: TrialResult, target: Mapping) -> int:
    """GPUs the trial held: those its fingerprint saw, else the server's tensor parallelism."""
    gpu = result.fingerprint.get("gpu") if result.fingerprint else None
    listed = gpu.get("gpus") if isinstance(gpu, Mapping) else None
    if isinstance(listed, list) and listed:
        return len(listed)
    tp = target.get("tp_size")
    return int(tp) if isinstance(tp, int) and tp > 0 else 1


def trial_cost(result: TrialResult, target: Mapping) -> TrialCost | None:
    """The split of one finished trial, or None when it recorded no times."""
    if not (result.ended_at and result.started_at and result.ended_at >= result.started_at):
        return None
    scale = time_scale_of(target)
    at = {}
    for state, when in result.states:
        at.setdefault(state, when)

    def span(a: TrialState, b: TrialState) -> float | None:
        if a.value in at and b.value in at and at[b.value] >= at[a.value]:
            return (at[b.value] - at[a.value]) / scale
        return None

    reps = tuple(m.seconds / scale for m in result.measurements
                 if m.seconds is not None and math.isfinite(m.seconds))
    return TrialCost((result.ended_at - result.started_at) / scale,
                     span(TrialState.LAUNCHING, TrialState.WARMING_UP),
                     span(TrialState.WARMING_UP, TrialState.BENCHMARKING), reps,
                     gpus_of(result, target))


def costs(rows: Sequence[TrialRow], target: Mapping) -> list[TrialCost]:
    return [c for r in rows if r.result is not None
            for c in [trial_cost(r.result, target)] if c is not None]


PRIOR_TRIALS = 9  # an earlier run's trial costs count as this many trials at most


def measured_costs(rows: Sequence[TrialRow], target: Mapping) -> list[TrialCost]:
    """The cost split of the measured trials that timed their repetitions, oldest first."""
    return [c for r in rows if r.result is not None and r.outcome is not None
            and r.outcome.measured for c in [trial_cost(r.result, target)]
            if c is not None and c.repetitions]


def cost_model(rows: Sequence[TrialRow], target: Mapping,
               prior: Sequence[TrialCost] = ()) -> CostModel | None:
    """Median restart and repetition cost of the measured trials (None before any), with the
    latest :data:`PRIOR_TRIALS` of ``prior`` (the node's earlier runs) among them: before this
    run has measured anything the earlier runs' costs decide, after a few trials its own."""
    return model_of([*list(prior)[-PRIOR_TRIALS:], *measured_costs(rows, target)])


def model_of(measured: Sequence[TrialCost]) -> CostModel | None:
    """Median restart and repetition seconds of these trials, on the most GPUs any held."""
    measured = [c for c in measured if c.repetitions]
    if not measured:
        return None
    restart = statistics.median(c.restart for c in measured)
    rep = statistics.median(s for c in measured for s in c.repetitions)
    gpus = max(c.gpus for c in measured)
    return CostModel(restart, rep, gpus)


def gpu_minutes(rows: Sequence[TrialRow], target: Mapping) -> float:
    """GPU-minutes spent by these trials (failed ones too: they held the node)."""
    return sum(c.gpu_minutes for c in costs(rows, target))


def describe_cost(minutes: float, modeled: bool = False) -> str:
    """``42.5 GPU-min`` or ``3.1 GPU-h``; ``3.1 modeled GPU-h`` for the simulated server, whose
    hours no GPU spent (a bare "23.5 GPU-h" would read as a real bill)."""
    unit = "modeled GPU" if modeled else "GPU"
    return f"{minutes / 60.0:.1f} {unit}-h" if minutes >= 600 else f"{minutes:.1f} {unit}-min"
