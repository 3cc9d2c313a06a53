"""Kernel evidence on real-format traces made here: CPU torch 2.13 traces (as recorded, and
relabelled with device events where one is needed), hand-made Kineto traces with a second
launching thread, ROCm- and cuDNN-named kernels, an empty trace and a CPU-only pair; and the
family patterns against a corpus of real kernel names. Pure: no processes."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from orchestrator.evidence import kernels as K
from orchestrator.evidence.families import FAMILIES, family
from orchestrator.evidence.trace import OTHER_MODE, TraceError, pass_profile, read_profile
from tests.kineto_traces import BACKWARD_TID, TORCH_CPU, KinetoTrace, relabel, torch_cpu

CORPUS = json.loads((Path(__file__).parent / "fixtures" / "kernel_names.json").read_text())


# -- families against real kernel names ----------------------------------------------------------
@pytest.mark.parametrize("fam", FAMILIES)
def test_family_pattern_on_the_real_names_of_its_family(fam):
    """Each family's names (with their sources in the fixture) land in it, and every family
    has names there: a pattern no real name exercises is not tested."""
    names = [n["name"] for n in CORPUS["names"] if n["family"] == fam]
    assert len(names) >= 2, f"no corpus names for {fam}"
    assert {n: family(n) for n in names} == dict.fromkeys(names, fam)


def test_corpus_names_each_say_where_they_come_from():
    assert all(n["source"].strip() for n in CORPUS["names"])
    assert len({n["name"] for n in CORPUS["names"]}) == len(CORPUS["names"])


# -- a second launching thread ------------------------------------------------------------------
def _training_trace(bwd_gemm_us: float = 800.0, nccl_us: float = 300.0) -> KinetoTrace:
    """Two `ProfilerStep#N` spans on the main thread; forward kernels launched there, backward
    GEMMs from autograd's thread and the all-reduce from the NCCL thread while the step is
    open; a warm-up copy and an optimizer kernel launched outside any step."""
    t = KinetoTrace()
    t.kernel("Memcpy HtoD (Pageable -> Device)", 10, 40, cat="gpu_memcpy")  # before step 1
    for i, start in enumerate((1_000, 11_000)):
        t.step(f"ProfilerStep#{i + 1}", start, 9_000)
        t.kernel("ampere_sgemm_128x64_tn", start + 100, 400)
        t.kernel("void at::native::vectorized_elementwise_kernel<4, add>", start + 600, 50)
        t.kernel("ampere_sgemm_128x64_tn", start + 3_000, bwd_gemm_us, tid=4300)  # autograd
        t.kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)",
                 start + 6_000, nccl_us, tid=4400, stream=13)  # the NCCL thread
    t.kernel("void at::native::vectorized_elementwise_kernel<4, sgd>", 20_500, 100)  # after
    return t


def test_a_launch_from_another_thread_belongs_to_the_step_open_in_its_process():
    p = pass_profile(_training_trace().doc())
    assert p.passes == {"step": 2}
    fams = {}
    for (mode, kernel), ms in p.kernel_ms.items():
        fams[(mode, family(kernel))] = fams.get((mode, family(kernel)), 0.0) + ms
    assert fams[("step", "gemm")] == pytest.approx(2 * (0.4 + 0.8))  # forward + backward
    assert fams[("step", "allreduce")] == pytest.approx(2 * 0.3)
    # `other` holds only what was launched outside any step: the warm-up copy, the last kernel
    assert {k for m, k in p.kernel_ms if m == OTHER_MODE} == {
        "Memcpy HtoD (Pageable -> Device)", "void at::native::vectorized_elementwise_kernel<4, sgd>"}
    assert p.outside_share() == pytest.approx(0.14 / p.device_ms)


def test_a_step_span_of_another_process_never_takes_a_launch():
    t = KinetoTrace()
    t.step("ProfilerStep#1", 0, 5_000)
    other = KinetoTrace(pid=5151)  # rank 1's process in the same trace
    other.kernel("ampere_sgemm_128x64_tn", 1_000, 300)
    t.events += other.events
    p = pass_profile(t.doc())
    assert p.kernel_ms == {(OTHER_MODE, "ampere_sgemm_128x64_tn"): pytest.approx(0.3)}


def test_the_diff_sees_backward_and_collective_kernels_launched_from_other_threads():
    """A slower backward GEMM (autograd's thread) and a slower all-reduce (NCCL thread) are
    movers of the step; before, they were `other` and left out of the diff."""
    def restarts(scale: float, nccl: float, jitter: tuple[float, ...]) -> list:
        return [pass_profile(_training_trace(800 * scale * j, 300 * nccl * j).doc())
                for j in jitter]

    d = K.diff(restarts(1.0, 1.0, (1.0, 1.02, 0.98)), restarts(1.5, 2.0, (1.01, 0.99, 1.0)))
    movers = {(r.mode, r.family) for r in d.movers}
    assert movers == {("step", "gemm"), ("step", "allreduce")}
    assert all(r.family != "other" or not r.mover for r in d.rows)
    line = K.evidence_line(d)
    assert line.startswith("kernels: step: GEMM `ampere_sgemm_128x64_tn`")


# -- relabelled CPU torch traces: real timings, real step structure -----------------------------
def test_relabelled_torch_traces_file_backward_work_under_the_step():
    p = pass_profile(relabel(torch_cpu("fast", 0)))
    assert p.passes == {"step": 2}
    backward = [e for e in relabel(torch_cpu("fast", 0))["traceEvents"]
                if e.get("cat") == "cuda_runtime" and e.get("tid") == BACKWARD_TID]
    assert backward, "the relabelled trace launches backward kernels from a second thread"
    assert p.outside_share() < 0.01  # nothing of a training step falls outside it
    # SDPA's kernels are attention by name; the hand-written matmul + softmax + matmul are not
    # (no attention operator around them): GEMM and norm/softmax
    fams = {family(k) for m, k in p.kernel_ms}
    assert {"attention", "gemm", "norm", "other"} <= fams
    assert family("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"


def test_relabelled_torch_traces_diff_names_the_bigger_gemms():
    """`slow` runs the same step at hidden 160 instead of 64: its GEMMs are the mover. One of
    its real restarts has a 10x slower attention call (a busy host): an outlier, left out."""
    before = [pass_profile(relabel(torch_cpu("fast", i))) for i in range(3)]
    after = [pass_profile(relabel(torch_cpu("slow", i))) for i in range(3)]
    d = K.diff(before, after)
    assert d.top is not None and (d.top.mode, d.top.family) == ("step", "gemm")
    assert d.top.ci[0] > 0 and d.outliers == 1
    assert "1 outlier restart left out" in K.evidence_line(d)
    # the levels are the geometric means the change is computed from
    gemm = d.top
    assert gemm.after_ms / gemm.before_ms == pytest.approx(1 + gemm.pct / 100)


# -- ROCm and cuDNN names in a ROCm / CUDA trace -------------------------------------------------
def test_rocm_and_cudnn_kernels_are_filed_by_family():
    t = KinetoTrace(launch="hipLaunchKernel")
    t.step("ProfilerStep#1", 0, 10_000)
    t.kernel("Cijk_Alik_Bljk_SB_MT64x128x16_SN_1LDSB0_", 100, 500)
    t.kernel("igemm_fwd_gtcx3_nhwc_fp16_bx0_ex1_bt128x128x32_wt32x32x8_ws1x1_wr2x2_ta1x8x2x1_"
             "1x4x1x64_tb1x8x2x1_1x4x1x64_gkgs", 700, 300)
    t.kernel("ncclDevKernel_Generic_1(ncclDevKernelArgsStorage<4096ul>)", 1_100, 200)
    t.kernel("__amd_rocclr_copyBuffer", 1_400, 20)
    t.kernel("sm80_xmma_fprop_implicit_gemm_f16f16_f16f32_f32_nhwckrsc_nhwc_tilesize128x32x32_"
             "stage4_warpsize4x1x1_g1_tensor16x8x16_execute_kernel__5x_cudnn", 1_500, 250)
    t.kernel("void cudnn::bn_fw_inf_1C11_kernel_NHWC<__half, float, true, 1>", 1_800, 30)
    p = pass_profile(t.doc())
    by_family = {}
    for (fam, _), ms in p.per_pass_families("step", family).items():
        by_family[fam] = by_family.get(fam, 0.0) + ms
    assert by_family == pytest.approx({"gemm": 0.5, "conv": 0.55, "allreduce": 0.2,
                                       "memory": 0.02, "norm": 0.03})


def test_an_eager_attention_inside_torch_s_attention_operator_is_attention():
    """SDPA's math path is matmul + softmax + matmul: inside `aten::_scaled_dot_product_
    attention_math` its GEMMs and softmax are attention; the same kernels outside are not."""
    t = KinetoTrace()
    t.step("ProfilerStep#1", 0, 10_000)
    t.kernel("ampere_sgemm_128x64_tn", 100, 400)  # a projection
    t.op("aten::scaled_dot_product_attention", 1_000, 2_000)
    t.op("aten::_scaled_dot_product_attention_math", 1_010, 1_980)
    t.kernel("ampere_sgemm_128x64_tn", 1_100, 300)
    t.kernel("void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, false,"
             " false>(float*, float const*, int, int, int, bool const*, int, bool)", 1_500, 100)
    t.kernel("ampere_sgemm_128x64_tn", 1_700, 300)
    t.kernel("void (anonymous namespace)::softmax_warp_forward<float, float, float, 4, false,"
             " false>(float*, float const*, int, int, int, bool const*, int, bool)", 4_000, 50)
    by_family = {}
    for (fam, _), ms in pass_profile(t.doc()).per_pass_families("step", family).items():
        by_family[fam] = by_family.get(fam, 0.0) + ms
    assert by_family == pytest.approx({"attention": 0.7, "gemm": 0.4, "norm": 0.05})


# -- empty and CPU-only traces -------------------------------------------------------------------
# Named ids, and no time in the gzip header: every xdist worker must collect the same ids.
@pytest.mark.parametrize("data", [
    (TORCH_CPU / "empty-export.trace.json.gz").read_bytes(),  # exported after the last step
    gzip.compress(b'{"traceEvents": []}', mtime=0),
], ids=["exported-after-the-last-step", "no-events"])  # fmt: skip
def test_an_empty_trace_is_a_failed_profile(data, tmp_path):
    from orchestrator.evidence.capture import store

    with pytest.raises(TraceError, match="no profiled event"):
        read_profile(data)
    with pytest.raises(TraceError):
        store(data, tmp_path)
    assert not list(tmp_path.iterdir())  # nothing kept


def test_a_cpu_only_trace_pair_says_no_device_time_never_no_family_moved():
    """The slow side runs 2.5x the work; without CUPTI the traces hold host events only."""
    before = [read_profile((TORCH_CPU / f"fast-{i}.trace.json.gz").read_bytes())
              for i in range(3)]
    after = [read_profile((TORCH_CPU / f"slow-{i}.trace.json.gz").read_bytes())
             for i in range(3)]
    assert all(p.device_ms == 0 and p.host_events > 0 and p.passes == {"step": 2}
               for p in (*before, *after))
    d = K.diff(before, after)
    line = K.evidence_line(d)
    assert line.startswith("kernels: the traces hold no device time:")
    assert "no kernel family moved" not in line
    assert "the traces hold no device time" in "\n".join(K.table(d))
    assert K.to_json(d)["no_device"] and K.to_json(d)["top"] is None
    # one side without device time: said so, and that the sides were not profiled alike
    gpu = [pass_profile(relabel(torch_cpu("slow", i))) for i in range(3)]
    assert "the before side's traces hold none" in K.evidence_line(K.diff(before, gpu))
