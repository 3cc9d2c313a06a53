"""Kernel families by name: attention / GEMM / all-reduce / other (no dependencies, so the
simulated server can import it without the statistics stack).

Checked in order, the first family whose pattern matches a kernel name wins. Collectives come
first (custom all-reduce kernels contain "reduce" and sometimes "cross_device"); attention before
GEMM, because MLA and FlashAttention kernels are built with CUTLASS and often say so in their
names. The patterns cover the kernel names of SGLang's attention backends (FlashInfer
`BatchPrefill*` / `BatchDecode*`, FlashAttention `flash_fwd*`, FlashMLA, TRT-LLM `fmha`), cuBLAS /
cuBLASLt (`nvjet*`, `sm90_xmma*`, `*gemm*`), CUTLASS and DeepGEMM, fused MoE, and NCCL
(`ncclDevKernel_<Collective>_*`) plus SGLang's custom all-reduce. An unknown name is `other`,
never guessed into a family.
"""

from __future__ import annotations

import re

FAMILIES = ("attention", "gemm", "allreduce", "other")
FAMILY_LABELS = {"attention": "attention", "gemm": "GEMM", "allreduce": "all-reduce",
                 "other": "other"}  # fmt: skip
FAMILY_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("allreduce", re.compile(
        r"nccl|all_?reduce|allgather|all_gather|reduce_?scatter|cross_device_reduce|custom_ar|"
        r"one_shot|two_shot|lamport|mscclpp|quickreduce", re.I)),
    ("attention", re.compile(
        r"attn|attention|flash_?fwd|flash_?mla|fmha|_mla|mla_|paged_?kv|paged_attention|"
        r"batchprefill|batchdecode|merge_state|xqa|trtllm_gen_fmha|sdpa|softmax_kernel", re.I)),
    ("gemm", re.compile(
        r"gemm|gemv|cublas|cutlass|xmma|nvjet|matmul|_mm_|mm_kernel|fused_moe|grouped_mm|"
        r"deep_?gemm|moe_align|splitk|sm\d+_.*_tn|wgmma|scaled_mm|fp8_.*mm|bmm", re.I)),
)
COLLECTIVE_RE = re.compile(r"nccl(?:DevKernel|Kernel)_([A-Za-z]+)")


def family(kernel: str) -> str:
    """The family of a kernel name by `FAMILY_PATTERNS` (`other` when none matches)."""
    for fam, pattern in FAMILY_PATTERNS:
        if pattern.search(kernel):
            return fam
    return "other"


def collective(kernel: str) -> str | None:
    """The NCCL collective of an NCCL kernel name (`AllReduce`, `AllGather`, ...), else None."""
    m = COLLECTIVE_RE.search(kernel)
    return m.group(1) if m else None
