"""Kernel evidence: the trace reader against a trace in SGLang 0.5.23's format, the family
patterns, the sim's kernel split (adds up to the model's pass time), and the diff's decisions on
noisy restarts. Pure: no processes."""

from __future__ import annotations

import gzip
import json
import math
import random
import re
from pathlib import Path

import pytest

from orchestrator.evidence import kernels as K
from orchestrator.evidence.families import collective, family
from orchestrator.evidence.trace import (
    PassProfile,
    TraceError,
    decode_trace,
    merge_profiles,
    pass_profile,
    read_profile,
    step_mode,
)
from orchestrator.targets.sim import model
from orchestrator.targets.sim.gpu_state import default_state
from orchestrator.targets.sim.kernels import pass_kernels
from orchestrator.targets.sim.profile import Effects

FIXTURES = Path(__file__).parent / "fixtures"
TRACE = FIXTURES / "traces" / "sglang_0_5_23_eagle3_tp0.trace.json"
SURFACE = json.loads((FIXTURES / "sglang_0_5_23" / "profile_surface.json").read_text())
EAGLE = model.LaunchConfig(tp_size=8, speculative_algorithm="EAGLE3", speculative_num_steps=2,
                           speculative_eagle_topk=1, speculative_num_draft_tokens=3,
                           cuda_graph_max_bs=32)  # fmt: skip


def test_fixture_trace_reads_per_mode_per_pass():
    p = read_profile(TRACE.read_bytes())
    assert p.passes == {"extend": 1, "draft": 6, "target_verify": 2}
    verify = p.per_pass("target_verify")
    att = [ms for k, ms in verify.items() if family(k) == "attention"]
    assert att == [pytest.approx(6.1)]
    assert p.pass_ms("target_verify") == pytest.approx(6.1 + 5.2 + 3.1 + 2.4 + 0.4)
    # draft passes: 4 draft steps (0.47 ms) and 2 draft-extends (0.59 ms) over 6 spans
    assert p.pass_ms("draft") == pytest.approx((4 * 0.47 + 2 * 0.59) / 6)
    # the copy outside any step: 0.003 ms over the trace's 9 step spans, 0.3% of its device time
    assert sum(p.per_pass("other").values()) == pytest.approx(0.003 / 9)
    assert p.outside_share() == pytest.approx(0.003 / p.device_ms)


def test_gzip_and_device_only_traces_read_the_same():
    raw = TRACE.read_bytes()
    assert read_profile(gzip.compress(raw)).kernel_ms == read_profile(raw).kernel_ms
    doc = json.loads(raw)
    gpu_only = {"traceEvents": [e for e in doc["traceEvents"]
                                if e.get("cat") in ("kernel", "gpu_user_annotation", "gpu_memcpy")]}
    assert pass_profile(gpu_only).kernel_ms == pytest.approx(read_profile(raw).kernel_ms)
    assert pass_profile(gpu_only).passes == read_profile(raw).passes


@pytest.mark.parametrize("data", [b"", b"{}", b"\x1f\x8bnot gzip", b'{"traceEvents": 3}'])
def test_not_a_trace_is_a_clear_error(data):
    with pytest.raises(TraceError):
        decode_trace(data)


def test_step_spans_follow_sglang_stage_names():
    stages = SURFACE["step_spans"]["stages"]
    assert {step_mode(f"step[{s} bs=4]") for s in stages} == {
        "target_verify", "draft", "extend", "decode", None}  # IDLE has no mode
    assert step_mode("step[EXTEND bs=2 toks=512]") == "extend"
    assert step_mode("step[TARGET_VERIFY bs=1]") == "target_verify"  # releases before the relabel
    assert step_mode("run_batch") is None


@pytest.mark.parametrize(("name", "fam"), [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", "allreduce"),
    ("cross_device_reduce_1stage<__nv_bfloat16, 8>", "allreduce"),
    ("flash_fwd_splitkv_mla_kernel<Flash_fwd_kernel_traits_mla<576, 64, 64, 8>, true>", "attention"),
    ("BatchPrefillWithPagedKVCacheKernel", "attention"),
    ("void cutlass::device_kernel<flash::FlashAttnFwdSm90<...>>", "attention"),
    ("nvjet_tst_128x64_64x8_1x1_v_bz_coopB_TNT", "gemm"),
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "gemm"),
    ("fused_moe_kernel", "gemm"),
    ("void flashinfer::norm::FusedAddRMSNormKernel<8u, __nv_bfloat16>", "norm"),
    ("Memcpy DtoH (Device -> Pinned)", "memory"),
    ("rotary_embedding_kernel", "other"),
])  # fmt: skip
def test_families(name, fam):
    assert family(name) == fam


def test_collective_names():
    assert collective("ncclDevKernel_AllGather_RING_LL(x)") == "AllGather"
    assert collective("ncclKernel_AllReduce_RING_LL_Sum_half") == "AllReduce"
    assert collective("fused_moe_kernel") is None


@pytest.mark.parametrize("phase", list(model.PHASES))
@pytest.mark.parametrize("graph", [True, False])
def test_sim_kernels_add_up_to_the_pass_time(phase, graph):
    fx = Effects(verify_mult=1.3, verify_ms_add=0.7, decode_mult=1.1, draft_mult=1.05)
    env = {"NCCL_PROTO": "LL"}
    for state in (default_state(), default_state().with_all_gpus(power_limit_w=450.0)):
        costs = model.PassCostModel(EAGLE, env, state, fx)
        kernels, gap = pass_kernels(costs, phase, 12, graph)
        assert all(ms >= 0 for _, ms in kernels) and gap >= 0
        assert sum(ms for _, ms in kernels) + gap == pytest.approx(
            costs.pass_ms(phase, 12, graph), rel=1e-9)


def _fam_ms(costs, phase="verify", tokens=3):
    out = dict.fromkeys(K.FAMILIES, 0.0)
    for name, ms in pass_kernels(costs, phase, tokens, True)[0]:
        out[family(name)] += ms
    return out


def test_each_planted_cause_has_its_kernel_signature():
    base = _fam_ms(model.PassCostModel(EAGLE, {}, default_state()))
    commit = _fam_ms(model.PassCostModel(EAGLE, {}, default_state(), Effects(verify_mult=1.3)))
    power = _fam_ms(model.PassCostModel(
        EAGLE, {}, default_state().with_all_gpus(power_limit_w=450.0)))
    nccl = _fam_ms(model.PassCostModel(EAGLE, {"NCCL_P2P_DISABLE": "1"}, default_state(),
                                       Effects(allreduce_mult=1.5)))

    def top(after):
        return max(K.FAMILIES, key=lambda f: after[f] - base[f])

    assert (top(commit), top(power), top(nccl)) == ("attention", "gemm", "allreduce")
    assert commit["gemm"] == base["gemm"] and nccl["gemm"] == base["gemm"]
    assert power["allreduce"] == base["allreduce"]


# -- the diff on noisy restarts -----------------------------------------------------------------
BASE_MS = {"target_verify": {"flash_fwd_mla": 7.6, "nvjet_gemm": 6.8, "fused_moe_kernel": 4.5,
                             "ncclDevKernel_AllReduce_Sum": 2.4, "norm": 0.9},
           "draft": {"BatchDecodeWithPagedKVCacheKernel": 0.3, "nvjet_gemm": 1.1,
                     "ncclDevKernel_AllReduce_Sum": 0.15, "norm": 0.4}}  # fmt: skip


def _restart(rng, scale=None, outlier=1.0):
    """One restart's profile: a common restart factor, per-family restart factors (all-reduce
    noisier), heavy-tailed per-kernel jitter (Student-t on the log scale)."""
    from orchestrator.evidence.trace import PassProfile

    common = math.exp(rng.gauss(0, 0.02)) * outlier
    fam_f = {f: math.exp(rng.gauss(0, 0.04 if f == "allreduce" else 0.01)) for f in K.FAMILIES}
    kms = {}
    for mode, ks in BASE_MS.items():
        for k, ms in ks.items():
            t = rng.gauss(0, 1) / math.sqrt(max(rng.gammavariate(1.5, 1 / 1.5), 1e-3))  # t, 3 df
            v = ms * common * fam_f[family(k)] * math.exp(0.005 * t)
            if scale:
                v *= scale.get((mode, family(k)), 1.0)
            kms[(mode, k)] = v * 10
    return PassProfile({"target_verify": 10, "draft": 30}, kms)


@pytest.mark.parametrize(("planted", "expected"), [
    ({("target_verify", "attention"): 1.3}, ("target_verify", "attention")),
    ({("target_verify", "allreduce"): 1.5, ("draft", "allreduce"): 1.5},
     ("target_verify", "allreduce")),
    ({("target_verify", "gemm"): 1.2, ("target_verify", "attention"): 1.2,
      ("draft", "gemm"): 1.1}, ("target_verify", "gemm")),
])  # fmt: skip
def test_diff_names_the_planted_family_in_most_seeds(planted, expected):
    hits = 0
    for seed in range(40):
        rng = random.Random(seed)
        before = [_restart(rng) for _ in range(3)]
        after = [_restart(rng, planted) for _ in range(3)]
        d = K.diff(before, after)
        hits += d.top is not None and (d.top.mode, d.top.family) == expected \
            and d.top.ci[0] > 0
    assert hits >= 36


def test_diff_names_no_mover_for_a_harmless_change_in_most_seeds():
    quiet = 0
    for seed in range(60):
        rng = random.Random(1000 + seed)
        d = K.diff([_restart(rng) for _ in range(3)], [_restart(rng) for _ in range(3)])
        quiet += not d.movers
        assert "no kernel family moved" in K.evidence_line(d) or d.movers
    assert quiet >= 54


def test_evidence_line_table_and_json():
    rng = random.Random(7)
    d = K.diff([_restart(rng) for _ in range(3)],
               [_restart(rng, {("target_verify", "attention"): 1.4}) for _ in range(3)])
    line = K.evidence_line(d)
    assert re.match(r"kernels: target_verify: attention `flash_fwd_mla` 7\.\d\d -> 1\d\.\d\d "
                    r"ms/pass \(\+\d\d% \[\+\d\d%, \+\d\d%\]\)", line), line
    assert "all-reduce" in line and "within the noise" in line
    lines = K.table(d)
    assert lines[2].startswith("| target_verify | attention | (all) |") and "| yes |" in lines[2]
    doc = K.to_json(d)
    assert doc["top"] == {"mode": "target_verify", "family": "attention"}
    assert json.loads(json.dumps(doc))["line"] == line
    ar = [k for k in doc["kernels"] if k.get("collective")]
    assert not ar  # only the moved family's kernels are listed


def test_one_trace_a_side_is_shown_as_measured_and_never_judged():
    """One trace a side has no restart noise to judge against: rows and changes as measured,
    no interval, no mover, and the line says why (never "moved", never "within the noise")."""
    p = read_profile(TRACE.read_bytes())
    slow = PassProfile(p.passes, {k: ms * (1.5 if family(k[1]) == "attention" else 1.0)
                                  for k, ms in p.kernel_ms.items()})
    d = K.diff([p], [slow, slow])
    assert not d.intervals and not d.movers and d.rows
    line = K.evidence_line(d)
    assert "no interval" in line and "nothing is called a mover" in line
    assert "target_verify: attention" in line and "+50%" in line
    assert "within the noise" not in line and "no kernel family moved" not in line
    assert all(r["ci"] is None for r in K.to_json(d)["families"])
    assert "| not judged |" in "\n".join(K.table(d))
    with pytest.raises(ValueError, match="one profile"):
        K.diff([], [p])
    assert merge_profiles([p, p]).passes["draft"] == 12


# -- plan and sides -------------------------------------------------------------------------------
@pytest.mark.parametrize(("args", "on"), [
    (["target=sim"], True), (["target=sglang"], False), (["target=sglang", "launcher=sim"], True),
    (["target=command", "target.bench=true"], False),
    (["target=sglang", "evidence.kernels=true"], True), (["target=sim", "evidence.kernels=false"], False),
])  # fmt: skip
def test_kernel_evidence_is_on_by_default_only_where_restarts_are_free(args, on):
    from orchestrator.config.compose import compose_settings
    from orchestrator.evidence import plan

    cfg = compose_settings("investigate", args)
    assert plan.kernels_enabled(cfg.evidence, cfg.target) is on
    line = plan.cost_line(cfg.evidence, cfg.target)
    assert line.startswith("kernel evidence: on" if on else "kernel evidence: off")
    assert "6" in line  # 2 x evidence.restarts restarts per cause, stated
    assert plan.profile_extra(cfg.evidence, cfg.bench, False, plan.KERNELS_PHASE) == {
        "profile": {"requests": 4}}
    assert plan.profile_extra(cfg.evidence, cfg.bench, cfg.trial.profile, "bisect") == {}


def test_bad_evidence_settings_are_refused():
    from orchestrator.config.compose import compose_settings
    from orchestrator.errors import UserError

    with pytest.raises(UserError, match="evidence.restarts"):
        compose_settings("investigate", ["target=sim", "evidence.restarts=1"])


def test_sides_of_a_commit_and_of_a_system_cause():
    from orchestrator.evidence.sides import sides
    from orchestrator.records import Candidate

    good = Candidate.make("a" * 40, (), {"NCCL_PROTO": "LL128"}, "default")
    bad = Candidate.make("b" * 40, (), {}, "default")
    parents = {"c" * 40 + "^": "d" * 40}

    def resolve(ref: str) -> str:
        return parents.get(ref, ref)

    before, after = sides({"kind": "commit", "id": "c" * 40}, bad, good, [], resolve)
    assert (before.commit, after.commit) == ("d" * 40, "c" * 40)
    finding = {"kind": "env", "id": "NCCL_PROTO", "differences": [
        {"factor": "env", "key": "NCCL_PROTO", "good": "LL128", "bad": None}]}
    before, after = sides({"kind": "env", "id": "NCCL_PROTO"}, bad, good,
                          [None, {"findings": [finding]}], resolve)
    assert before.env_dict == {"NCCL_PROTO": "LL128"} and after.env_dict == {}
    assert before.commit == after.commit == good.commit  # profiled alone, on the good state
    assert "not recorded" in sides({"kind": "env", "id": "X"}, bad, good, [], resolve)


def test_an_outlier_restart_is_left_out_not_taken_for_a_cause():
    """A restart 3x slower than its side (a slow ring, a JIT compile) moves every family at
    once; left in, it hides a real mover or fakes one. Left out, it is counted in the line."""
    quiet = found = 0
    for seed in range(30):
        rng = random.Random(7000 + seed)
        before = [_restart(rng), _restart(rng, outlier=3.0), _restart(rng)]
        d = K.diff(before, [_restart(rng) for _ in range(3)])
        assert d.outliers == 1 and K.outlier_restarts(before) == [1]
        quiet += not d.movers
        d = K.diff(before, [_restart(rng, {("target_verify", "attention"): 1.3})
                            for _ in range(3)])
        found += d.top is not None and d.top.family == "attention"
        assert "1 outlier restart left out" in K.evidence_line(d)
    assert quiet >= 26 and found >= 27
    assert K.outlier_restarts([_restart(random.Random(1)) for _ in range(2)]) == []


def test_two_slow_restarts_of_three_are_never_taken_for_the_side():
    """The fast restart is right even when the two slow ones agree with each other (a median
    would keep the slow pair and report a confident 3x change of every family)."""
    for seed in range(20):
        rng = random.Random(9000 + seed)
        before = [_restart(rng), _restart(rng, outlier=3.0), _restart(rng, outlier=3.0)]
        assert K.outlier_restarts(before) == [1, 2]
        d = K.diff(before, [_restart(rng) for _ in range(3)])
        assert d.outliers == 0  # one good restart is no interval: all kept, intervals wide
        assert not d.movers, K.evidence_line(d)


# -- which sides: other causes restored, related causes together, a line for every cause ---------
class _NoProfiles:
    """A controller whose restarts all fail to profile: records what would be launched."""

    def __init__(self):
        from types import SimpleNamespace

        self.store = SimpleNamespace(trials=lambda: [])
        self.submitted, self._done = [], []

    def idle_nodes(self):
        return True

    def submit(self, cand, phase, repetitions):
        from types import SimpleNamespace

        from orchestrator.records import Outcome

        self.submitted.append(cand)
        self._done.append(SimpleNamespace(outcome=Outcome.CRASHED, candidate=cand, id=len(
            self.submitted), result=None))

    def wait(self):
        done, self._done = self._done, []
        return done


def test_overlapping_causes_are_profiled_together_others_restored_and_every_cause_has_a_line():
    """Four variables set on the node since the reference: A and B overlap, C and D hurt alone;
    evidence.max_causes=2. A + B is one pair of sides (restore both vs. now); C is profiled with
    A, B and D restored (before, they rode along from the node); D gets a line saying why it
    was not profiled."""
    from orchestrator.evidence.collect import for_causes
    from orchestrator.records import UNSET, Candidate

    names = ["VAR_A", "VAR_B", "VAR_C", "VAR_D"]
    diffs = [{"factor": "env", "key": v, "good": UNSET, "bad": None} for v in names]
    findings = [{"kind": "env", "id": v, "differences": [d]} for v, d in zip(names, diffs, strict=True)]
    isolate = {"experiment": "isolate", "findings": findings, "differences": diffs}
    causes = [{"kind": "env", "id": v, "label": v} for v in names]
    attribution = {"causes": [{"id": v, "label": v} for v in names],
                   "relations": [{"causes": [0, 1], "kind": "overlap"}]}
    good = bad = Candidate.make("a" * 40, (), {}, "default")
    ctl, said = _NoProfiles(), []
    out = for_causes(ctl, causes, bad, good, [None, isolate], lambda r: r, restarts=2,
                     max_causes=2, say=said.append, attribution=attribution)
    assert [e["cause"] for e in out] == ["VAR_A + VAR_B", "VAR_C", "VAR_D"]
    assert out[0]["relation"] == "overlap" and "restore both vs. now" in out[0]["sides_rule"]
    assert "evidence.max_causes=2" in out[2]["line"] and "not profiled" in out[2]["line"]
    assert all(e["line"].startswith("kernels: ") for e in out)
    envs = {tuple(sorted(c.env_dict.items())) for c in ctl.submitted}
    restored = {v: UNSET for v in names}
    assert tuple(sorted(restored.items())) in envs  # before: every variable restored
    pair_now = {k: v for k, v in restored.items() if k not in ("VAR_A", "VAR_B")}
    c_now = {k: v for k, v in restored.items() if k != "VAR_C"}
    assert envs == {tuple(sorted(restored.items())), tuple(sorted(pair_now.items())),
                    tuple(sorted(c_now.items()))}
