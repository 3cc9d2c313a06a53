"""The simulated node's kernels: one modeled forward pass split into the kernels a profiler sees.

Pure. `pass_kernels` returns named kernels plus the host-side gap of one pass; the kernels and
the gap add up to exactly the pass time `PassCostModel.pass_ms` gives (a test holds it), so a
trace written from them agrees with the phase metrics of the same server. The split follows the
model's roofline terms, so each planted cause has a known kernel signature:

- the roofline term `max(compute, memory)` is the matmul-and-attention work: a fixed share of it
  is attention (`ATTENTION_SHARE`), the rest GEMMs (dense, and the MoE experts on the target
  model). A clock lock or power cap slows the compute-bound phases' GEMMs and attention alike;
  the GEMMs carry most of that time, so GEMM is a clock cause's top family;
- the all-reduce term is one NCCL kernel (SGLang's custom all-reduce kernel on two GPUs), priced
  by the NCCL environment as in `comm.py`: an NCCL cause moves only this family;
- a code effect on verify (`verify_mult`, `verify_ms_add` in a sim profile) is modeled as the
  verify attention path getting slower, the seed's story (the sim's planted verify culprits edit
  the attention backend and the EAGLE worker), so its extra time lands on the attention kernel;
  the other phases' multipliers scale the whole pass;
- the fixed CPU time is half small device kernels (norms, rotary, sampling: family `other`)
  and half a host gap; the eager-launch overhead is all host gap (launch latency is idle device
  time, not kernel time), while eager mode's slower kernels (`eager_compute_factor`) show in the
  kernels themselves.
"""

from __future__ import annotations

import math

from orchestrator.targets.sim import model

ATTENTION_SHARE = {"verify": 0.40, "prefill": 0.30, "decode": 0.25, "draft": 0.20,
                   "draft_extend": 0.30, "draft_prefill": 0.30}  # fmt: skip
MOE_SHARE = 0.40  # of the target model's GEMM time: the routed experts
OTHER_KERNEL_SHARE = 0.5  # of the fixed CPU-side time: small device kernels
TARGET_PHASES = ("verify", "prefill", "decode")

ATTENTION_KERNELS = {
    "verify": "flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8>, true>",
    "decode": "flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8>, true>",
    "prefill": "BatchPrefillWithRaggedKVCacheKernel",
    "draft": "BatchDecodeWithPagedKVCacheKernel",
    "draft_extend": "BatchPrefillWithPagedKVCacheKernel",
    "draft_prefill": "BatchPrefillWithRaggedKVCacheKernel",
}
DENSE_GEMM = "nvjet_tst_128x64_64x8_1x1_v_bz_coopB_TNT"
MOE_GEMM = "fused_moe_kernel"
NCCL_ALLREDUCE = "ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)"
CUSTOM_ALLREDUCE = "cross_device_reduce_1stage<__nv_bfloat16, 2>"
NORM = ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>(__nv_bfloat16*, "
        "__nv_bfloat16*, __nv_bfloat16*, unsigned int, unsigned int, float)")
ROTARY = "rotary_embedding_kernel"


def pass_kernels(costs: model.PassCostModel, phase: str, tokens: int,
                 graph: bool) -> tuple[list[tuple[str, float]], float]:
    """([(kernel name, ms)], host gap ms) of one noise-free pass; sums to `costs.pass_ms`."""
    cost = model.PHASES[phase]
    hw = costs.hw
    launch = costs.launch
    ratio = min(model.clock_ratio(g, cost.power_demand_w) for g in hw.gpus)
    tp_scale = model.REFERENCE_TP / launch.tp_size
    compute = (cost.compute_ms + cost.compute_ms_per_token * tokens) * tp_scale / ratio
    compute *= hw.contention * (1.0 if graph else cost.eager_compute_factor)
    growth = 1.0 + cost.moe_growth * (
        1.0 - math.exp(-(max(tokens, 1) - 1) / model.MOE_TOKENS_SCALE))
    memory = cost.memory_ms * growth * tp_scale * ratio**-model.MEMORY_CLOCK_EXPONENT
    memory *= hw.mem_factor * hw.contention
    roofline = max(compute, memory)
    allreduce = costs.allreduce_ms(phase, tokens)
    attention = roofline * ATTENTION_SHARE[phase]
    gemm = roofline - attention
    moe = gemm * MOE_SHARE if phase in TARGET_PHASES else 0.0
    other = cost.fixed_ms * OTHER_KERNEL_SHARE
    gap = cost.fixed_ms - other + (0.0 if graph else cost.eager_ms)
    base = roofline + allreduce + cost.fixed_ms + (0.0 if graph else cost.eager_ms)
    fx = costs.effects
    scale = 1.0
    if phase == "verify":
        attention += base * (fx.verify_mult - 1.0) + fx.verify_ms_add
    elif phase == "decode":
        scale = fx.decode_mult
    elif phase in ("draft", "draft_extend"):
        scale = fx.draft_mult
    else:
        scale = fx.prefill_mult
    ar_name = CUSTOM_ALLREDUCE if launch.tp_size == 2 and not launch.disable_custom_all_reduce \
        else NCCL_ALLREDUCE
    kernels = [(ATTENTION_KERNELS[phase], attention), (DENSE_GEMM, gemm - moe), (MOE_GEMM, moe),
               (ar_name, allreduce), (NORM, other * 0.6), (ROTARY, other * 0.4)]
    kernels = [(name, ms * scale) for name, ms in kernels if ms > 0.0]
    gap *= scale
    total = sum(ms for _, ms in kernels) + gap
    if total < 0.01:  # pass_ms's floor
        gap += 0.01 - total
    if attention < 0.0:  # a speed-up profile larger than the attention time: keep it physical
        kernels = [(n, max(ms, 0.0)) for n, ms in kernels]
    return kernels, gap
