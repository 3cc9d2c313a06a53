"""The sim's pure performance model: calibration to the seed, the clock signature, NCCL, faults
and noise parsing. No processes: milliseconds."""

from __future__ import annotations

import random
import statistics

import pytest

from orchestrator.targets.sim import comm, model
from orchestrator.targets.sim.faults import FaultSpecError, parse_faults
from orchestrator.targets.sim.gpu_state import GpuProcess, default_state
from orchestrator.targets.sim.noise import Noise, lognormal_factor
from orchestrator.targets.sim.profile import Effects

BASE = model.LaunchConfig(tp_size=8)
EAGLE = model.LaunchConfig(
    tp_size=8,
    speculative_algorithm="EAGLE3",
    speculative_num_steps=2,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=3,
    cuda_graph_max_bs=32,
)
NODE = default_state()
BEST_NCCL = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Tree",
    "NCCL_MAX_NCHANNELS": "4",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_BUFFSIZE": str(1 << 20),
}


def test_defaults_reproduce_the_seed_numbers():
    base = model.predict(BASE, {}, NODE)
    eagle = model.predict(EAGLE, {}, NODE)
    assert base.decode_ms == pytest.approx(11.2, abs=0.05)
    assert base.tok_s == pytest.approx(89, abs=1)
    assert eagle.verify_ms == pytest.approx(19.0, abs=0.1)
    assert eagle.tok_s == pytest.approx(94, abs=1)
    assert eagle.accept_len == pytest.approx(2.40, abs=0.01)
    assert eagle.verify_cuda_graph is True and base.decode_cuda_graph is True


def test_locked_clock_slows_verify_far_more_than_decode():
    locked = NODE.with_all_gpus(sm_clock_locked_mhz=int(0.6 * model.REFERENCE_SM_CLOCK_MHZ))
    base0, base1 = model.predict(BASE, {}, NODE), model.predict(BASE, {}, locked)
    eagle0, eagle1 = model.predict(EAGLE, {}, NODE), model.predict(EAGLE, {}, locked)
    verify_up = eagle1.verify_ms / eagle0.verify_ms - 1
    decode_up = base1.decode_ms / base0.decode_ms - 1
    assert verify_up == pytest.approx(0.53, abs=0.03)  # seed: 19 -> 29 ms
    assert decode_up == pytest.approx(0.08, abs=0.02)  # seed: 11.2 -> 12.1 ms
    assert base1.tok_s == pytest.approx(82, abs=1.5)


def test_lower_power_limit_throttles_compute_bound_verify_not_decode():
    capped = NODE.with_all_gpus(power_limit_w=450)
    assert model.predict(BASE, {}, capped).decode_ms == pytest.approx(
        model.predict(BASE, {}, NODE).decode_ms
    )
    assert model.predict(EAGLE, {}, capped).verify_ms > 1.2 * model.predict(EAGLE, {}, NODE).verify_ms
    clock, reasons = model.effective_sm_clock_mhz(capped.gpus[0], "verify")
    assert clock < 0.8 * model.REFERENCE_SM_CLOCK_MHZ and "sw_power_cap" in reasons
    assert model.busy_power_w(capped.gpus[0], "verify") == pytest.approx(450)
    assert model.busy_power_w(NODE.gpus[0], "decode") < model.busy_power_w(NODE.gpus[0], "verify")
    assert model.effective_sm_clock_mhz(NODE.gpus[0], "verify") == (model.REFERENCE_SM_CLOCK_MHZ, ())
    # The slowest GPU paces the whole tensor-parallel group.
    one_slow = NODE.with_gpu(5, sm_clock_locked_mhz=1200)
    assert model.predict(EAGLE, {}, one_slow).verify_ms > 1.3 * model.predict(EAGLE, {}, NODE).verify_ms


def test_nccl_optimum_is_not_the_default_and_each_variable_matters():
    default = model.predict(BASE, {}, NODE).tok_s
    best = model.predict(BASE, BEST_NCCL, NODE).tok_s
    assert best > default * 1.05
    for var, value in BEST_NCCL.items():
        alone = model.predict(BASE, {var: value}, NODE).tok_s
        assert alone > default, var
    assert model.predict(BASE, {"NCCL_P2P_LEVEL": "LOC"}, NODE).tok_s < default
    assert model.predict(BASE, {"NCCL_MAX_NCHANNELS": "1"}, NODE).tok_s < default
    assert model.predict(BASE, {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}, NODE).tok_s < default
    # LL halves bandwidth: prefill-sized all-reduces get slower while decode gets faster.
    ll = model.predict(BASE, {"NCCL_PROTO": "LL"}, NODE, prompt_tokens=8000)
    assert ll.prefill_ms > model.predict(BASE, {}, NODE, prompt_tokens=8000).prefill_ms


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_PROTO": "bogus"},
        {"NCCL_ALGO": "NVLS"},
        {"NCCL_ALGO": "Rings"},
        {"NCCL_MAX_NCHANNELS": "0"},
        {"NCCL_MIN_NCHANNELS": "four"},
        {"NCCL_P2P_LEVEL": "NVLINK"},
        {"NCCL_BUFFSIZE": "-1"},
    ],
)
def test_invalid_nccl_values_fail_at_start(env):
    with pytest.raises(model.LaunchError) as info:
        model.predict(BASE, env, NODE)
    assert info.value.kind == "nccl"


def test_nccl_parsing_accepts_what_nccl_accepts():
    s = comm.parse_comm_env(
        {"NCCL_PROTO": "^LL", "NCCL_ALGO": "allreduce:tree;allgather:ring", "NCCL_P2P_LEVEL": "5"}
    )
    assert s.protocols == frozenset({"LL128", "Simple"})
    assert s.algorithms == frozenset({"Tree"})
    assert s.p2p_level == 5
    assert comm.parse_comm_env({"NCCL_MIN_NCHANNELS": "16"}).channels == 16
    assert comm.allreduce_factors(comm.parse_comm_env({}), "2.27.3") == (1.0, 1.0)
    older = comm.allreduce_factors(comm.parse_comm_env({}), "2.21.5")[0]
    assert older > 1.05


def test_tensor_parallel_without_nccl_ignores_nccl_env():
    tp1 = model.LaunchConfig(tp_size=1)
    assert model.predict(tp1, {"NCCL_PROTO": "bogus"}, NODE).allreduce_ms == 0.0


def test_eager_verify_and_graph_batch_limit():
    eager = model.predict(
        model.LaunchConfig(**{**EAGLE.__dict__, "disable_cuda_graph": True}), {}, NODE
    )
    graph = model.predict(EAGLE, {}, NODE)
    assert eager.verify_cuda_graph is False and eager.verify_ms > graph.verify_ms * 1.25
    small = model.LaunchConfig(**{**EAGLE.__dict__, "cuda_graph_max_bs": 2})
    assert model.predict(small, {}, NODE, batch_size=2).verify_cuda_graph is True
    assert model.predict(small, {}, NODE, batch_size=3).verify_cuda_graph is False
    no_graph = model.predict(EAGLE, {}, NODE, Effects(verify_cuda_graph=False))
    assert no_graph.verify_cuda_graph is False and no_graph.verify_ms == pytest.approx(eager.verify_ms)


def test_profile_effects_scale_their_phase():
    eagle = model.predict(EAGLE, {}, NODE)
    slow = model.predict(EAGLE, {}, NODE, Effects(verify_mult=1.5, verify_ms_add=1.0))
    assert slow.verify_ms == pytest.approx(eagle.verify_ms * 1.5 + 1.0)
    assert slow.draft_ms == pytest.approx(eagle.draft_ms)
    worse_accept = model.predict(EAGLE, {}, NODE, Effects(accept_len_mult=0.5))
    assert worse_accept.accept_len - 1 == pytest.approx((eagle.accept_len - 1) * 0.5, rel=1e-6)
    ar = model.predict(BASE, {}, NODE, Effects(allreduce_mult=2.0))
    base = model.predict(BASE, {}, NODE)
    assert ar.decode_ms - base.decode_ms == pytest.approx(base.allreduce_ms)


def test_accept_length_grows_with_steps_and_stays_bounded():
    lengths = [model.expected_accept_len(s, 1, s + 1) for s in range(1, 7)]
    assert lengths == sorted(lengths)
    assert all(1 < a <= s + 1 for s, a in zip(range(1, 7), lengths, strict=True))
    assert model.expected_accept_len(3, 4, 8) > model.expected_accept_len(3, 1, 4)
    assert model.expected_accept_len(5, 4, 3) <= 3  # draft-token budget caps the tree
    assert model.expected_accept_len(3, 1, 4, accept_len_mult=100) == pytest.approx(4.0)


def test_deterministic_acceptance_counts_exact_cycles():
    a = model.expected_accept_len(2, 1, 3)
    per_cycle = [
        model.tokens_after_cycles(k, a) - model.tokens_after_cycles(k - 1, a) for k in range(1, 200)
    ]
    assert set(per_cycle) <= {2, 3} and abs(statistics.fmean(per_cycle) - a) < 0.01
    for tokens in (1, 2, 7, 100, 255):
        k = model.cycles_for_tokens(tokens, a)
        assert model.tokens_after_cycles(k, a) >= tokens > model.tokens_after_cycles(k - 1, a)


def test_node_checks():
    with pytest.raises(model.LaunchError) as info:
        model.predict(BASE, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, NODE)
    assert info.value.kind == "device"
    hog = NODE.with_gpu(3, processes=(GpuProcess(4242, "python", 80000),))
    with pytest.raises(model.LaunchError) as info:
        model.predict(BASE, {}, hog)
    assert info.value.kind == "oom"
    # ... unless that GPU is not one of ours.
    assert model.predict(model.LaunchConfig(tp_size=2), {"CUDA_VISIBLE_DEVICES": "0,1"}, hog)
    small = NODE.with_gpu(3, processes=(GpuProcess(4242, "python", 4000),))
    assert model.predict(BASE, {}, small).decode_ms > model.predict(BASE, {}, NODE).decode_ms * 1.05
    assert model.predict(BASE, {}, small, own_pid=4242).decode_ms == pytest.approx(11.202)
    downtrained = NODE.with_gpu(2, pcie_gen=1)
    assert model.predict(BASE, {}, downtrained).allreduce_ms > 1.5 * model.predict(BASE, {}, NODE).allreduce_ms


def test_expected_request_time_adds_prefill_and_cycles():
    eagle = model.predict(EAGLE, {}, NODE, prompt_tokens=64)
    cycles = model.cycles_for_tokens(99, eagle.accept_len)
    assert model.expected_request_ms(eagle, 100) == pytest.approx(
        eagle.prefill_ms + cycles * eagle.step_ms
    )
    base = model.predict(BASE, {}, NODE)
    assert model.expected_decode_tok_s(base, 50) == pytest.approx(base.tok_s)


def test_noise_has_mean_one_and_zero_cv_is_exact():
    rng = random.Random(1)
    draws = [lognormal_factor(rng, 0.05) for _ in range(20000)]
    assert statistics.fmean(draws) == pytest.approx(1.0, abs=0.002)
    assert statistics.pstdev(draws) == pytest.approx(0.05, rel=0.05)
    off = Noise(seed=3, restart_cv=0.0, request_cv=0.0)
    assert off.restart_factor == 1.0 and off.pass_factor(100.0) == 1.0 and not off.stochastic
    assert Noise(7, 0.02, 0.01).restart_factor == Noise(7, 0.02, 0.01).restart_factor
    drift = Noise(seed=1, restart_cv=0.0, request_cv=0.0, drift_pct_per_hour=10.0)
    assert drift.pass_factor(3600.0) == pytest.approx(1.10)


def test_fault_specs():
    plan = parse_faults("degrade:5, crash_after:3,hang_mid_stream")
    assert plan.degrade_pct == 5 and plan.crash_after == 3 and plan.hang_at_request == 0
    assert plan.degrade_factor(2) == pytest.approx(1.1025)
    assert parse_faults("hang_mid_stream:4").hang_at_request == 4
    assert parse_faults(None) == parse_faults("")
    held = parse_faults("hold_from:2:/some/dir/hold")
    assert (held.hold_from, held.hold_path) == (2, "/some/dir/hold")
    assert parse_faults("hold_loading:/some/dir/load").hold_loading == "/some/dir/load"
    for bad in ("explode", "crash_after", "crash_after:x", "degrade:fast", "never_ready:1",
                "hold_from:2", "hold_from:x:/p", "hold_loading"):
        with pytest.raises(FaultSpecError):
            parse_faults(bad)
