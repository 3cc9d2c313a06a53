"""Rank a compare's fingerprint differences by the mechanism the trials show.

Plausibility alone ("clocks before packages") cannot tell an outside SM clock lock from twenty
shell variables when both changed; what the trials measured can. Three kinds of evidence, in
this order:

1. **the phase that moved**: verify (an extend pass over the draft tokens) and prefill are
   compute-bound and follow the SM clock; plain decode of one token is memory-bound and barely
   does. A +28% verify with decode flat points at the SM clock (a lock, application clocks, a
   power cap); decode moving as much points at memory clocks, all-reduce (NCCL) or contention;
2. **telemetry**: the SM clock under load during today's trials against the reference's, and
   the clock event reasons that appeared (`applications_clocks_setting`: a lock or application
   clocks; `sw_power_cap`: the power limit). A clock setting explains a slowdown only if the
   clock actually moved;
3. **plausibility** (:attr:`Difference.rank`), to order what the evidence leaves equal.

The output is an order and a sentence per difference saying why; it is a ranking of suspects,
not a probability: `isolate` tests them.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.system.fingerprint_diff import Difference

COMPUTE_METRICS = ("verify_ms",)  # the extend-style pass (prefill is not a server metric here)
MEMORY_METRICS = ("decode_ms",)
CLOCK_DROP = 0.03  # a mean SM clock under load lower by this share counts as moved
RANK_OTHER_ENV = 8.0  # Difference.rank of a variable that steers nothing known
_SM_CAPS = ("sm_clock_locked_mhz", "applications_clock_sm_mhz", "sm_clock_max_mhz")


def _moved(effect: Mapping | None) -> float | None:
    """The % change of a metric when its interval excludes no change (slower = positive for
    the latency metrics used here)."""
    if not effect or "ci" not in effect:
        return None
    lo, hi = effect["ci"]
    return float(effect["pct"]) if lo > 0 or hi < 0 else None


def _mean_clock(telemetry: Sequence[Mapping | None]) -> float | None:
    means = [t["sm_clock_mhz"]["mean"] for t in telemetry
             if t and isinstance(t.get("sm_clock_mhz"), Mapping) and t.get("n_samples")]
    return statistics.fmean(means) if means else None


def _reasons(telemetry: Sequence[Mapping | None]) -> set[str]:
    return {r for t in telemetry if t for r in t.get("throttle_reasons", ())}


@dataclass(frozen=True)
class Signals:
    """What the trials say about the mechanism (None: not measured)."""

    compute_pct: float | None
    memory_pct: float | None
    sm_clock: tuple[float, float] | None  # mean SM clock under load: reference, now
    new_reasons: frozenset[str]

    @property
    def clock_dropped(self) -> bool:
        return self.sm_clock is not None and self.sm_clock[1] < self.sm_clock[0] * (1 - CLOCK_DROP)

    @property
    def clock_same(self) -> bool:
        return self.sm_clock is not None and not self.clock_dropped

    @property
    def compute_bound(self) -> bool:
        """Compute-bound phases moved, memory-bound ones clearly less (or were not measured)."""
        if self.compute_pct is None or self.compute_pct <= 0:
            return False
        return self.memory_pct is None or abs(self.memory_pct) < self.compute_pct / 2

    @property
    def memory_bound(self) -> bool:
        return self.memory_pct is not None and self.memory_pct > 0 and (
            self.compute_pct is None or self.memory_pct >= self.compute_pct / 2)

    def describe(self) -> str:
        parts = []
        if self.compute_pct is not None:
            parts.append(f"verify (compute-bound) {self.compute_pct:+.1f}%")
        if self.memory_pct is not None:
            parts.append(f"decode (memory-bound) {self.memory_pct:+.1f}%")
        if self.sm_clock is not None:
            ref, now = self.sm_clock
            parts.append(f"SM clock under load {now:.0f} MHz now vs {ref:.0f} MHz at the"
                         f" reference ({(now / ref - 1) * 100:+.1f}%)")
        if self.new_reasons:
            parts.append("new clock event reasons: " + ", ".join(sorted(self.new_reasons)))
        return "; ".join(parts)


def signals(effects: Mapping[str, Mapping], ref_telemetry: Sequence[Mapping | None],
            now_telemetry: Sequence[Mapping | None]) -> Signals:
    compute = [p for m in COMPUTE_METRICS if (p := _moved(effects.get(m))) is not None]
    memory = [p for m in MEMORY_METRICS if (p := _moved(effects.get(m))) is not None]
    ref_clock, now_clock = _mean_clock(ref_telemetry), _mean_clock(now_telemetry)
    clock = (ref_clock, now_clock) if ref_clock and now_clock else None
    return Signals(max(compute, default=None), max(memory, default=None), clock,
                   frozenset(_reasons(now_telemetry) - _reasons(ref_telemetry)))


def _lowered(d: Difference) -> bool:
    a, b = d.reference, d.now
    if d.key == "sm_clock_locked_mhz":  # None = unlocked: any lock lowers the cap
        return b is not None and (a is None or b < a)
    return isinstance(a, int | float) and isinstance(b, int | float) and b < a


def assess(d: Difference, s: Signals) -> tuple[int, str]:
    """(tier, why): tier 0 explains what the trials measured, 3 is only plausible."""
    if d.category == "clock" and d.key in (*_SM_CAPS, "power_limit_w"):
        if not _lowered(d):
            return 3, "a clock setting that was raised or lifted cannot slow the GPU down"
        reason = "sw_power_cap" if d.key == "power_limit_w" else "applications_clocks_setting"
        if s.clock_dropped and (reason in s.new_reasons or s.compute_bound):
            return 0, f"caps the SM clock, and the clock under load dropped; {s.describe()}"
        if s.clock_dropped:
            return 1, f"caps the SM clock, and the clock under load dropped; {s.describe()}"
        if s.clock_same:
            return 3, f"the SM clock under load did not move; {s.describe()}"
        if s.compute_bound:
            return 1, f"caps the SM clock, and the compute-bound phase moved; {s.describe()}"
        return 2, "caps the SM clock"
    if d.category == "clock" and d.key == "mem_clock_locked_mhz":
        if s.memory_bound:
            return 1, f"caps the memory clock, and the memory-bound phase moved; {s.describe()}"
        return 2, "caps the memory clock"
    if d.category == "unknown":  # a reference that cannot tell (an old log): listed, last
        return 4, "the reference cannot tell what it was then"
    if d.category == "gpu_process":
        return 1, "other processes on the GPUs contend for compute and memory"
    nccl = (d.category == "nccl" or (d.category in ("env", "env_dropped")
                                     and d.key.startswith("NCCL_")))
    stripped = d.category == "env" and d.extra.get("dropped_before_server") and \
        d.rank < RANK_OTHER_ENV
    if stripped:
        return 1, "set on the node but dropped before the server (a launcher or wrapper)"
    if nccl:
        if s.clock_dropped and s.compute_bound:
            moved = ("only the compute-bound phase moved" if s.memory_pct is not None
                     else "a clock drop explains a compute-bound slowdown")
            return 2, f"changes all-reduce time, but the SM clock under load dropped and {moved}"
        if s.compute_pct is not None or s.memory_pct is not None:
            return 1, "changes all-reduce time, which every phase pays"
        return 2, "changes all-reduce time"
    if d.category == "env_dropped":
        return 2, "set on the node but never reaches the server"
    if d.category in ("driver", "pcie"):
        return 2, "can change every kernel's speed"
    if d.category == "clock":
        return 3, "does not change the clocks under steady load"
    return 3, "plausible only"


def rank(diffs: Sequence[Difference], s: Signals) -> list[tuple[Difference, str]]:
    """The differences, most likely mechanism first, each with why."""
    scored = [(assess(d, s), d) for d in diffs]
    scored.sort(key=lambda x: (x[0][0], x[1].rank, x[1].key))
    return [(d, why) for (_, why), d in scored]
