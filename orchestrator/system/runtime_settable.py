"""Which differences can be changed on a running server, so that both sides of a comparison
are measured within one server lifetime instead of one restart each.

A restart of a large model costs minutes; a setting that changes while the server runs can be
compared in blocks interleaved within one lifetime (A B B A ...), where the restart's own level
(its noise) is the same for both sides and cancels from their difference
(:mod:`orchestrator.runner.lifetime`, :mod:`orchestrator.stats.lifetimes`).

What is settable, checked against the sources (`tests/fixtures/sglang_0_5_23/runtime_settings.json`):

- GPU: the power limit, the SM clock lock, the memory clock lock and the SM applications clock
  are set through NVML on GPUs whose process keeps running (a power limit lowered from outside
  mid-trial is what the trial's fault check sees). Persistence mode is driver state that
  matters when a process starts: not live.
- SGLang 0.5.23: `/set_internal_state` accepts only `pp_max_micro_batch_size`,
  `speculative_accept_threshold_single` / `_acc` and two DSpark worker commands; every other
  launch flag needs a restart. None of the three is a setting sleuth's candidates vary (the
  `server` factor holds launch flags), so no server setting is compared live.

At most :data:`MAX_LIVE` live differences share one lifetime: each lifetime measures every
combination of their levels (2 ** n), so more would spend more repetitions than they save
restarts; the rest are compared across restarts as before.
"""

from __future__ import annotations

from collections.abc import Sequence

# Clock policy parts NVML sets on a running GPU (orchestrator/gpu/base.py names the parts).
LIVE_CLOCK_PARTS = frozenset({"power", "locked", "mem_locked", "app"})
# SGLang 0.5.23's `/set_internal_state` handlers (InternalState._update_handlers).
SGLANG_RUNTIME_SETTABLE = frozenset({
    "pp_max_micro_batch_size", "speculative_accept_threshold_single",
    "speculative_accept_threshold_acc", "dspark_force_budget_frac",
    "dspark_clear_info_records",
})
MAX_LIVE = 2


def is_live(factor: str, key: str) -> bool:
    """Whether a difference of this factor and key can change on a running server (and
    sleuth changes it there)."""
    return factor == "clock" and key in LIVE_CLOCK_PARTS


def live_indices(changes: Sequence, limit: int = MAX_LIVE) -> frozenset[int]:
    """The changes compared within lifetimes: the first `limit` live ones (`changes` are
    :class:`~orchestrator.system.differences.Change` records, or anything with `factor`
    and `key`)."""
    found = [i for i, c in enumerate(changes) if is_live(c.factor, c.key)]
    return frozenset(found[:limit])
