"""Kernel families by name (no dependencies, so the simulated server can import it without the
statistics stack).

Checked in order, the first family whose pattern matches a kernel name wins; a name no pattern
matches is `other`, never guessed. Every pattern is tested against real kernel names (CUDA,
ROCm, cuDNN/MIOpen, Triton and Inductor, FBGEMM, NCCL/RCCL, PyTorch's own kernels; each name's
source is kept beside it in tests/fixtures/kernel_names.json). Why this order:

- collectives first: custom all-reduce kernels contain "reduce", and NCCL names contain
  neither GEMM nor attention words;
- memcpy / memset next: the profiler names DMA copies and fills itself (`Memcpy HtoD (Pageable
  -> Device)`, `Memset (Device)`, the same on ROCm), whatever the library that asked for them,
  and ROCm's runtime does some with blit kernels (`__amd_rocclr_copyBuffer`);
- embedding lookups before GEMM: FBGEMM's namespace `fbgemm_gpu::` contains "gemm", and its
  table-batched embedding kernels are memory-bound gathers, not matrix products (FBGEMM's own
  GEMMs are CUTLASS or `f8f8bf16` kernels and are GEMMs by those words). Rotary *position*
  embeddings are elementwise and stay `other`;
- attention before convolution and GEMM: FlashAttention and MLA kernels are built with CUTLASS
  and often say so; PyTorch's memory-efficient attention is `fmha_cutlass*`. SGLang's Triton
  attention backend names its kernels `_fwd_kernel` (extend) and `_fwd_grouped_kernel_stage1`
  / `_fwd_kernel_stage1` (decode), which are attention in a serving trace;
- convolution before GEMM: cuDNN and MIOpen convolutions are implicit GEMMs and say so
  (`sm80_xmma_fprop_implicit_gemm_*`, `implicit_convolve_sgemm`, `igemm_fwd_gtcx*`), but a
  reader asks "did the convolutions get slower", not "did some GEMM";
- GEMM: cuBLAS/cuBLASLt (`nvjet*`, `*xmma_gemm*`, `ampere_sgemm_*`, `cutlass_80_tensorop_*`),
  ROCm's Tensile and hipBLASLt (`Cijk_*`), DeepGEMM, Triton's `matmul_kernel` and Inductor's
  matmul templates (`triton_tem_fused_mm_*`), fused MoE, and ATen op names where a device
  names its kernels after the op (`aten::mm`);
- normalization and softmax: LayerNorm, RMSNorm, BatchNorm, GroupNorm and softmax kernels,
  Inductor's fused ones included (`triton_red_fused__softmax_*`,
  `triton_per_fused_native_layer_norm_*`).

An eager attention (`matmul + softmax + matmul`) is three kernels whose names say GEMM and
softmax: by name alone nobody can tell them from a projection and a sampler's softmax. They
are filed as attention when their launch lies inside one of torch's attention operators in the
trace (SDPA's math path `aten::_scaled_dot_product_attention_math` and the other
`scaled_dot_product` / `*_attention_forward` / `*_attention_backward` ops: `attention_op`,
used by orchestrator/evidence/trace.py). A model's own `Attention` module span is not used:
it also holds the Q/K/V and output projections, which are GEMMs.
"""

from __future__ import annotations

import re

FAMILIES = ("attention", "gemm", "allreduce", "conv", "norm", "memory", "embedding", "other")
FAMILY_LABELS = {"attention": "attention", "gemm": "GEMM", "allreduce": "all-reduce",
                 "conv": "convolution", "norm": "norm/softmax", "memory": "memcpy/memset",
                 "embedding": "embedding", "other": "other"}  # fmt: skip
FAMILY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("allreduce", re.compile(
        r"nccl|rccl|all_?reduce|allgather|all_gather|reduce_?scatter|cross_device_reduce|"
        r"custom_ar|one_shot|two_shot|lamport|mscclpp|quickreduce", re.I)),
    ("memory", re.compile(r"^(?:Memcpy|Memset)\b|__amd_rocclr_(?:copy|fill)", re.I)),
    ("embedding", re.compile(r"(?<!rotary_)(?<!rotary)embedding|embeddingbag", re.I)),
    ("attention", re.compile(
        r"attn|attention|flash_?fwd|flash_?bwd|flash_?mla|fmha|_mla|mla_|paged_?kv|"
        r"paged_attention|batchprefill|batchdecode|merge_state|xqa|sdpa|scaled_dot_product|"
        r"^_fwd_(?:grouped_)?kernel", re.I)),
    ("conv", re.compile(
        r"convolution|convolve|(?<![a-z])conv(?:[123]d)?(?![a-z])|MIOpenConv|scudnn|winograd|"
        r"(?:fprop|dgrad|wgrad)_implicit|implicit_?gemm|igemm_(?:fwd|bwd|wrw)|miopenSp\d", re.I)),
    ("gemm", re.compile(
        r"(?<!fb)gemm|gemv|cublas|cutlass|xmma|nvjet|matmul|_mm_|mm_kernel|fused_moe|"
        r"grouped_mm|deep_?gemm|moe_align|splitk|sm\d+_.*_tn|wgmma|scaled_mm|fp8_.*mm|bmm|"
        r"^Cijk_|^aten::(?:mm|bmm|addmm|baddbmm|matmul|linear)$|triton_tem_fused_\w*mm", re.I)),
    ("norm", re.compile(
        r"softmax|layer_?norm|rms_?norm|batch_?norm|group_?norm|instance_?norm|"
        r"layernorm|rmsnorm|batchnorm|groupnorm|bn_fw|bn_bw|RowwiseMoments|norm_kernel|"
        r"_norm_|norm::", re.I)),
)
COLLECTIVE_RE = re.compile(r"nccl(?:DevKernel|Kernel)_([A-Za-z]+)")
# torch's attention operators: every kernel launched inside one is a piece of an attention
ATTENTION_OP_RE = re.compile(
    r"scaled_dot_product|_(?:flash|efficient|cudnn)_attention|_attention_(?:forward|backward)|"
    r"ScaledDotProduct", re.I)


def family(kernel: str) -> str:
    """The family of a kernel name by `FAMILY_PATTERNS` (`other` when none matches)."""
    for fam, pattern in FAMILY_PATTERNS:
        if pattern.search(kernel):
            return fam
    return "other"


def attention_op(name: str) -> bool:
    """A host operator (cpu_op) all of whose kernels are attention: torch's SDPA and its
    math / flash / efficient / cuDNN implementations, forward and backward."""
    return bool(ATTENTION_OP_RE.search(name))


def collective(kernel: str) -> str | None:
    """The NCCL collective of an NCCL kernel name (`AllReduce`, `AllGather`, ...), else None."""
    m = COLLECTIVE_RE.search(kernel)
    return m.group(1) if m else None
