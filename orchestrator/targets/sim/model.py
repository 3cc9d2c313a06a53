"""The EAGLE-3 performance model of the simulated node. Pure: no I/O, no clocks, no randomness.

Each forward pass is a roofline: `max(compute, memory) + all-reduce + fixed CPU time`, plus a
launch overhead when it runs eagerly instead of in a CUDA graph. Compute scales with the
effective SM clock; memory traffic only weakly (memory-bound kernels barely care about SM
clock). Verify (target forward over the draft tokens, an extend-style pass) and prefill are
compute-bound; plain decode of one token is memory-bound. That is what makes the seed's
signature come out of a clock lock: verify 19 -> 29 ms while decode moves ~8%.

A lowered power limit throttles each phase by its own power demand: compute-bound phases draw
more power, so they lose more clock than memory-bound decode (which may not throttle at all).

Calibration (default GPU state, tp 8, default env, neutral profile, batch 1):
  baseline decode step 11.2 ms -> 89 tok/s; EAGLE-3 steps 2 / topk 1 / draft tokens 3:
  draft step 2.2 ms x 2, verify 19.0 ms, draft-extend 2.1 ms, accept length 2.40 -> 94 tok/s.
  Clock locked to 60% (1458 MHz): verify ~28.9 ms, decode ~12.15 ms (82 tok/s baseline).

Everything the server sleeps comes from `PassCostModel`; tests and the orchestrator compare
measurements against `predict()` and `expected_request_ms()`.

Size: one calibrated model (each pass's roofline, the power throttle, the calibration
constants), pure functions read together against the seed's numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

# Acceptance helpers are re-exported so callers can treat the model as one module.
from orchestrator.targets.sim.acceptance import cycles_for_tokens as cycles_for_tokens
from orchestrator.targets.sim.acceptance import expected_accept_len as expected_accept_len
from orchestrator.targets.sim.acceptance import (
    scaled_position_probabilities as scaled_position_probabilities,
)
from orchestrator.targets.sim.acceptance import tokens_after_cycles as tokens_after_cycles
from orchestrator.targets.sim.comm import NcclConfigError, allreduce_factors, parse_comm_env
from orchestrator.targets.sim.gpu_state import GpuInfo, GpuState
from orchestrator.targets.sim.profile import NEUTRAL, Effects

REFERENCE_SM_CLOCK_MHZ = 2430
REFERENCE_MEM_CLOCK_MHZ = 14001
REFERENCE_TP = 8
STATIC_POWER_W = 90.0  # board power that does not scale with SM clock
MEMORY_CLOCK_EXPONENT = 0.2  # memory-bound time ~ r**-0.2 (r = SM clock ratio)
MOE_TOKENS_SCALE = 16.0  # more tokens per pass touch more experts: more weight traffic
MIN_CUDA_DRIVER = 12080  # Blackwell needs CUDA 12.8+
FOREIGN_MEMORY_OOM_SHARE = 0.5
CONTENTION_PER_PROCESS = 0.12
SPEC_ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


@dataclass(frozen=True)
class PhaseCost:
    """Roofline terms of one forward pass at reference clocks and tp 8 (milliseconds)."""

    compute_ms: float
    compute_ms_per_token: float
    memory_ms: float
    moe_growth: float  # memory grows up to (1 + moe_growth)x as tokens per pass grow
    allreduce_ms: float  # latency-bound part at the default NCCL environment
    allreduce_ms_per_token: float  # bandwidth-bound part
    fixed_ms: float  # CPU-side time, clock independent
    eager_ms: float  # kernel-launch overhead when not replayed from a CUDA graph
    eager_compute_factor: float
    power_demand_w: float  # board power at full clock


PHASES: dict[str, PhaseCost] = {
    "decode": PhaseCost(0.0, 0.33, 8.85, 1.5, 2.35, 0.002, 0.0, 3.2, 1.0, 360.0),
    "verify": PhaseCost(10.8, 1.33, 8.85, 1.5, 2.40, 0.002, 1.8, 6.0, 1.08, 580.0),
    "prefill": PhaseCost(12.0, 0.06, 8.85, 1.5, 2.40, 0.002, 2.0, 0.0, 1.0, 600.0),
    "draft": PhaseCost(0.3, 0.05, 1.2, 0.0, 0.15, 0.0002, 0.85, 1.0, 1.0, 330.0),
    "draft_extend": PhaseCost(0.6, 0.15, 1.2, 0.0, 0.15, 0.0002, 0.75, 1.0, 1.0, 400.0),
    "draft_prefill": PhaseCost(0.5, 0.01, 1.2, 0.0, 0.15, 0.0002, 0.75, 0.0, 1.0, 400.0),
}


class LaunchError(RuntimeError):
    """The configuration cannot start on this node (the server exits 1 at start).

    `kind` says where a real server would fail: `nccl`, `device`, `driver`, `oom`.
    """

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class LaunchConfig:
    """The launch flags that matter to performance, already resolved (no None defaults)."""

    tp_size: int = 8
    speculative_algorithm: str | None = None
    speculative_num_steps: int = 3
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 4
    cuda_graph_max_bs: int = 160
    disable_cuda_graph: bool = False
    disable_custom_all_reduce: bool = False

    @property
    def speculative(self) -> bool:
        return bool(self.speculative_algorithm)


@dataclass(frozen=True)
class Prediction:
    """Noise-free expectation for one batch size (per-phase ms; tok/s per request)."""

    speculative: bool
    batch_size: int
    decode_ms: float | None  # plain decode step (baseline only)
    decode_cuda_graph: bool | None
    verify_ms: float | None  # per speculative cycle
    verify_cuda_graph: bool | None
    draft_step_ms: float | None
    draft_extend_ms: float | None
    draft_ms: float | None  # per cycle: steps x draft step + draft extend
    step_ms: float  # one scheduler decode pass: decode step or whole cycle
    accept_len: float  # output tokens per pass per request (1.0 without speculation)
    tok_s: float  # steady-state output tokens/s of one request
    prefill_ms: float  # for `prompt_tokens` new tokens, one request
    prompt_tokens: int
    allreduce_ms: float  # all-reduce part of one decode step / verify


@dataclass(frozen=True)
class Hardware:
    """What the GPU state and environment mean for speed: the slowest used GPU dominates."""

    gpus: tuple[GpuInfo, ...]
    contention: float
    mem_factor: float
    allreduce_latency_factor: float
    allreduce_bandwidth_factor: float


def visible_gpus(state: GpuState, env: Mapping[str, str]) -> tuple[GpuInfo, ...]:
    """GPUs after CUDA_VISIBLE_DEVICES (indices or UUIDs), in the order it lists them."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return tuple(sorted(state.gpus, key=lambda g: g.index))
    out = []
    for token in (t.strip() for t in raw.split(",")):
        if not token:
            continue
        match = [g for g in state.gpus if str(g.index) == token or g.uuid == token]
        if not match:
            break  # CUDA stops at the first invalid entry
        out.append(match[0])
    return tuple(out)


def sm_clock_cap_mhz(gpu: GpuInfo) -> float:
    """The highest SM clock the GPU's settings allow: its maximum, a lock, application clocks."""
    clock = float(gpu.sm_clock_max_mhz)
    for cap in (gpu.sm_clock_locked_mhz, gpu.applications_clock_sm_mhz):
        if cap:
            clock = min(clock, float(cap))
    return clock


def mem_clock_mhz(gpu: GpuInfo) -> float:
    """The memory clock under load: its setting, or a lower memory clock lock."""
    clock = float(gpu.mem_clock_mhz)
    if gpu.mem_clock_locked_mhz:
        clock = min(clock, float(gpu.mem_clock_locked_mhz))
    return max(clock, 1.0)


def clock_ratio(gpu: GpuInfo, power_demand_w: float) -> float:
    """Effective SM clock under load for a phase, relative to the reference clock."""
    ratio = sm_clock_cap_mhz(gpu) / REFERENCE_SM_CLOCK_MHZ
    # Power ~ static + dynamic * r: the clock settles where the phase's draw meets the cap.
    demand_at_ratio = STATIC_POWER_W + (power_demand_w - STATIC_POWER_W) * ratio
    if demand_at_ratio > gpu.power_limit_w:
        headroom = max(gpu.power_limit_w - STATIC_POWER_W, 1.0)
        ratio = max(0.2, headroom / (power_demand_w - STATIC_POWER_W))
    if gpu.temperature_c >= 88:
        ratio *= max(0.5, 1.0 - 0.04 * (gpu.temperature_c - 87))
    return ratio


def effective_sm_clock_mhz(gpu: GpuInfo, phase: str = "verify") -> tuple[float, tuple[str, ...]]:
    """The SM clock a busy GPU runs at in a phase, and NVML-style throttle reasons.

    For a telemetry backend that wants to report what the server experiences.
    """
    ratio = clock_ratio(gpu, PHASES[phase].power_demand_w)
    clock = ratio * REFERENCE_SM_CLOCK_MHZ
    reasons = []
    unlocked = sm_clock_cap_mhz(gpu)
    if unlocked < gpu.sm_clock_max_mhz:
        reasons.append("applications_clocks_setting")
    if gpu.temperature_c >= 88:
        reasons.append("sw_thermal_slowdown")
    if clock < unlocked - 1 and gpu.temperature_c < 88:
        reasons.append("sw_power_cap")
    return clock, tuple(reasons)


def busy_power_w(gpu: GpuInfo, phase: str = "verify") -> float:
    """Board power a GPU draws while running a phase (never above its power limit)."""
    ratio = clock_ratio(gpu, PHASES[phase].power_demand_w)
    demand = STATIC_POWER_W + (PHASES[phase].power_demand_w - STATIC_POWER_W) * ratio
    return min(float(gpu.power_limit_w), demand)


def _foreign(gpu: GpuInfo, own_pid: int | None) -> list:
    return [p for p in gpu.processes if p.pid != own_pid]


def hardware(
    launch: LaunchConfig,
    env: Mapping[str, str],
    state: GpuState,
    own_pid: int | None = None,
) -> Hardware:
    """Check the node can run the launch and summarise its speed. Raises LaunchError."""
    if state.cuda_driver_version < MIN_CUDA_DRIVER:
        raise LaunchError(
            "driver",
            "The NVIDIA driver on your system is too old "
            f"(found CUDA driver version {state.cuda_driver_version}).",
        )
    visible = visible_gpus(state, env)
    if len(visible) < launch.tp_size:
        raise LaunchError(
            "device",
            f"CUDA error: invalid device ordinal (tp_size={launch.tp_size}, "
            f"{len(visible)} visible GPU(s))",
        )
    used = visible[: launch.tp_size]
    for gpu in used:
        foreign_mib = sum(p.used_memory_mib for p in _foreign(gpu, own_pid))
        if foreign_mib > FOREIGN_MEMORY_OOM_SHARE * gpu.memory_total_mib:
            raise LaunchError(
                "oom",
                f"CUDA out of memory on GPU {gpu.index}: other processes hold "
                f"{foreign_mib} MiB of {gpu.memory_total_mib} MiB",
            )
    lat = bw = 1.0
    if launch.tp_size > 1:
        try:
            settings = parse_comm_env(env)
        except NcclConfigError as exc:
            raise LaunchError("nccl", str(exc)) from exc
        lat, bw = allreduce_factors(settings, state.nccl_version)
        gen_penalty = max(g.pcie_gen_max - g.pcie_gen for g in used)
        link = min((g.pcie_gen / g.pcie_gen_max) * (g.pcie_width / g.pcie_width_max) for g in used)
        lat *= 1.0 + 0.15 * gen_penalty
        bw /= max(link, 1e-3)
    n_foreign = max(len(_foreign(g, own_pid)) for g in used)
    mem_factor = max(REFERENCE_MEM_CLOCK_MHZ / mem_clock_mhz(g) for g in used)
    return Hardware(used, 1.0 + CONTENTION_PER_PROCESS * n_foreign, mem_factor, lat, bw)


def _allreduce_scale(launch: LaunchConfig) -> tuple[float, bool]:
    """(scale vs 8-way ring, uses NCCL). Two PCIe GPUs use SGLang's custom all-reduce."""
    tp = launch.tp_size
    if tp <= 1:
        return 0.0, False
    if tp == 2 and not launch.disable_custom_all_reduce:
        return 0.6 / (REFERENCE_TP - 1), False
    return (tp - 1) / (REFERENCE_TP - 1), True


class PassCostModel:
    """Milliseconds of each kind of forward pass for one launch on one node state."""

    def __init__(
        self,
        launch: LaunchConfig,
        env: Mapping[str, str],
        state: GpuState,
        effects: Effects = NEUTRAL,
        own_pid: int | None = None,
    ):
        self.launch = launch
        self.effects = effects
        self.hw = hardware(launch, env, state, own_pid)
        self._cache: dict[tuple[str, int, bool], float] = {}

    def graph_ok(self, batch_size: int, phase: str) -> bool:
        launch = self.launch
        if launch.disable_cuda_graph or batch_size > launch.cuda_graph_max_bs:
            return False
        if phase == "verify":
            return self.effects.verify_cuda_graph
        return phase in ("decode", "draft", "draft_extend")

    def allreduce_ms(self, phase: str, tokens: int) -> float:
        cost = PHASES[phase]
        scale, nccl = _allreduce_scale(self.launch)
        lat, bw = (self.hw.allreduce_latency_factor, self.hw.allreduce_bandwidth_factor)
        if not nccl:
            lat = bw = 1.0
        raw = cost.allreduce_ms * lat + cost.allreduce_ms_per_token * tokens * bw
        return raw * scale * self.effects.allreduce_mult

    def pass_ms(self, phase: str, tokens: int, graph: bool) -> float:
        """One forward pass over `tokens` tokens (batch x tokens per request)."""
        key = (phase, tokens, graph)
        if key in self._cache:
            return self._cache[key]
        cost = PHASES[phase]
        hw = self.hw
        ratio = min(clock_ratio(g, cost.power_demand_w) for g in hw.gpus)
        tp_scale = REFERENCE_TP / self.launch.tp_size
        compute = (cost.compute_ms + cost.compute_ms_per_token * tokens) * tp_scale / ratio
        compute *= hw.contention * (1.0 if graph else cost.eager_compute_factor)
        growth = 1.0 + cost.moe_growth * (1.0 - math.exp(-(max(tokens, 1) - 1) / MOE_TOKENS_SCALE))
        memory = cost.memory_ms * growth * tp_scale * ratio**-MEMORY_CLOCK_EXPONENT
        memory *= hw.mem_factor * hw.contention
        total = max(compute, memory) + self.allreduce_ms(phase, tokens) + cost.fixed_ms
        if not graph:
            total += cost.eager_ms
        fx = self.effects
        if phase == "decode":
            total *= fx.decode_mult
        elif phase == "verify":
            total = total * fx.verify_mult + fx.verify_ms_add
        elif phase in ("draft", "draft_extend"):
            total *= fx.draft_mult
        else:
            total *= fx.prefill_mult
        total = max(total, 0.01)
        self._cache[key] = total
        return total

    # -- the scheduler's passes -----------------------------------------------------------------
    def decode(self, batch_size: int) -> tuple[float, bool]:
        graph = self.graph_ok(batch_size, "decode")
        return self.pass_ms("decode", batch_size, graph), graph

    def verify(self, batch_size: int) -> tuple[float, bool]:
        graph = self.graph_ok(batch_size, "verify")
        tokens = batch_size * self.launch.speculative_num_draft_tokens
        return self.pass_ms("verify", tokens, graph), graph

    def draft_step(self, batch_size: int) -> float:
        graph = self.graph_ok(batch_size, "draft")
        tokens = batch_size * max(1, self.launch.speculative_eagle_topk)
        return self.pass_ms("draft", tokens, graph)

    def draft_extend(self, batch_size: int) -> float:
        graph = self.graph_ok(batch_size, "draft_extend")
        tokens = batch_size * self.launch.speculative_num_draft_tokens
        return self.pass_ms("draft_extend", tokens, graph)

    def prefill(self, new_tokens: int) -> float:
        """Target prefill of `new_tokens` (all new sequences), plus the draft model's prefill."""
        ms = self.pass_ms("prefill", max(new_tokens, 1), False)
        if self.launch.speculative:
            ms += self.pass_ms("draft_prefill", max(new_tokens, 1), False)
        return ms

    def accept_len(self) -> float:
        launch = self.launch
        return expected_accept_len(
            launch.speculative_num_steps,
            launch.speculative_eagle_topk,
            launch.speculative_num_draft_tokens,
            self.effects.accept_len_mult,
        )


# -- prediction ------------------------------------------------------------------------------


def predict(
    launch: LaunchConfig,
    env: Mapping[str, str],
    state: GpuState,
    effects: Effects = NEUTRAL,
    *,
    batch_size: int = 1,
    prompt_tokens: int = 128,
    own_pid: int | None = None,
) -> Prediction:
    """Noise-free per-phase times and throughput. Raises LaunchError if it cannot start."""
    costs = PassCostModel(launch, env, state, effects, own_pid)
    prefill_ms = costs.prefill(prompt_tokens)
    if not launch.speculative:
        decode_ms, graph = costs.decode(batch_size)
        return Prediction(
            speculative=False, batch_size=batch_size, decode_ms=decode_ms,
            decode_cuda_graph=graph, verify_ms=None, verify_cuda_graph=None,
            draft_step_ms=None, draft_extend_ms=None, draft_ms=None, step_ms=decode_ms,
            accept_len=1.0, tok_s=1000.0 / decode_ms, prefill_ms=prefill_ms,
            prompt_tokens=prompt_tokens, allreduce_ms=costs.allreduce_ms("decode", batch_size),
        )  # fmt: skip
    verify_ms, graph = costs.verify(batch_size)
    draft_step = costs.draft_step(batch_size)
    draft_extend = costs.draft_extend(batch_size)
    draft_ms = launch.speculative_num_steps * draft_step + draft_extend
    step_ms = draft_ms + verify_ms
    accept = costs.accept_len()
    verify_tokens = batch_size * launch.speculative_num_draft_tokens
    return Prediction(
        speculative=True, batch_size=batch_size, decode_ms=None, decode_cuda_graph=None,
        verify_ms=verify_ms, verify_cuda_graph=graph, draft_step_ms=draft_step,
        draft_extend_ms=draft_extend, draft_ms=draft_ms, step_ms=step_ms, accept_len=accept,
        tok_s=1000.0 * accept / step_ms, prefill_ms=prefill_ms, prompt_tokens=prompt_tokens,
        allreduce_ms=costs.allreduce_ms("verify", verify_tokens),
    )  # fmt: skip


def decode_passes_for(prediction: Prediction, output_tokens: int) -> int:
    """Decode passes (steps or cycles) a request needs after its prefill token, noise-free."""
    remaining = max(0, output_tokens - 1)
    if not prediction.speculative:
        return remaining
    return cycles_for_tokens(remaining, prediction.accept_len)


def expected_request_ms(prediction: Prediction, output_tokens: int) -> float:
    """Modeled server time of one request alone: prefill (first token) + its decode passes."""
    return prediction.prefill_ms + decode_passes_for(prediction, output_tokens) * prediction.step_ms


def expected_decode_tok_s(prediction: Prediction, output_tokens: int) -> float:
    """Tokens after the first per second of decoding, as a streaming client measures it."""
    passes = decode_passes_for(prediction, output_tokens)
    if passes == 0:
        return float("nan")
    return 1000.0 * (output_tokens - 1) / (passes * prediction.step_ms)
