"""compare's ranking by mechanism, the server's environment as the record, and the caveats
that keep noise from being shown as evidence. Pure: fingerprints come from the system oracle,
which runs the code a trial runs (policy, snapshot, launcher wrapper, environ record)."""

from __future__ import annotations

import random

from experiments.system_oracle import SystemOracle
from orchestrator.records import Candidate
from orchestrator.sim_scenarios import presets as material
from orchestrator.sim_scenarios import system_stories as stories
from orchestrator.stats import caveats
from orchestrator.system import mechanism
from orchestrator.system.fingerprint_diff import Difference, diff

CAND = Candidate.make("0" * 40)


def _story(name: str):
    reference, now, _ = stories.system_story(name, random.Random(3))
    spec = material.PRESETS[name]
    profile = {"verify_mult": 1.0, "decode_mult": 1.0,
               "env_effects": [dict(e) for e in spec.env_effects]}
    return SystemOracle(reference, profile), SystemOracle(now, profile)


def _effects(then: SystemOracle, now: SystemOracle, spread: float = 2.0) -> dict:
    pct = (now.truth(CAND) / then.truth(CAND) - 1) * 100
    return {"verify_ms": {"pct": pct, "ci": [pct - spread, pct + spread], "n": [3, 3]}}


def test_seed_like_scenario_ranks_the_outside_clock_lock_first():
    """An SM lock, NCCL_PROTO stripped by a launcher, 20 harmless variables, a driver and a
    package bump: 24 differences, and the lock must lead (it came 11th of 23 behind
    HF_HUB_OFFLINE by plausibility alone)."""
    then, now = _story("seed_system")
    ref_fp, now_fp = then.fingerprint(CAND), now.fingerprint(CAND)
    diffs = diff(ref_fp, now_fp)
    assert len(diffs) == 24
    signals = mechanism.signals(_effects(then, now), [ref_fp["telemetry"]], [now_fp["telemetry"]])
    assert signals.clock_dropped and "applications_clocks_setting" in signals.new_reasons
    ranked = mechanism.rank(diffs, signals)
    assert ranked[0][0].key == "sm_clock_locked_mhz"
    assert "SM clock under load" in ranked[0][1]
    keys = [d.key for d, _ in ranked]
    assert keys[1] == "NCCL_PROTO" and "dropped before the server" in ranked[1][1]
    assert keys.index("NCCL_PROTO") < min(keys.index(k) for k in stories.SEED_HARMLESS_ENV)
    assert keys.index("driver_version") < keys.index("transformers")


def test_the_server_environment_is_the_record_and_a_stripped_variable_is_named():
    then, now = _story("launcher_strip")
    ref_fp, now_fp = then.fingerprint(CAND), now.fingerprint(CAND)
    assert ref_fp["env"]["server"]["NCCL_ALGO"] == "Tree"
    assert "NCCL_ALGO" not in now_fp["env"]["server"]
    assert now_fp["env"]["not_received"] == {"NCCL_ALGO": "Tree"}
    (d,) = diff(ref_fp, now_fp)
    assert (d.category, d.key, d.reference, d.now) == ("env", "NCCL_ALGO", "Tree", None)
    assert d.controllable and d.factor == ("env", "NCCL_ALGO", "Tree")
    assert "launcher or wrapper drops it" in d.detail
    # A variable the node sets and the wrapper drops both then and now is a finding too.
    (same,) = diff(now_fp, now_fp)
    assert same.category == "env_dropped" and same.key == "NCCL_ALGO" and not same.controllable
    # Asked for explicitly (as isolate does for the reference side), it reaches the server.
    asked = now.fingerprint(Candidate.make("0" * 40, env={"NCCL_ALGO": "Tree"}))
    assert asked["env"]["server"]["NCCL_ALGO"] == "Tree"


def test_clock_settings_without_a_clock_drop_are_not_ranked_first():
    lock = Difference("clock", "sm_clock_locked_mhz", None, 2400, controllable=True)
    nccl = Difference("env", "NCCL_PROTO", "LL128", None, controllable=True)
    flat = mechanism.Signals(compute_pct=8.0, memory_pct=15.0, sm_clock=(2430, 2429),
                             new_reasons=frozenset())
    assert [d.key for d, _ in mechanism.rank([lock, nccl], flat)] == ["NCCL_PROTO",
                                                                       "sm_clock_locked_mhz"]
    raised = Difference("clock", "power_limit_w", 450, 600, controllable=True)
    dropped = mechanism.Signals(30.0, 2.0, (2430, 1800), frozenset({"sw_power_cap"}))
    assert mechanism.assess(raised, dropped)[0] == 3


def test_omp_num_threads_and_perf_variables_are_kept_and_ranked_above_others():
    ref = {"env": {"server": {"OMP_NUM_THREADS": "8", "HF_HUB_OFFLINE": "1", "EDITOR": "vi"}}}
    now = {"env": {"server": {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "0", "EDITOR": "vim"}}}
    assert [d.key for d in diff(ref, now)] == ["OMP_NUM_THREADS", "HF_HUB_OFFLINE", "EDITOR"]
    from orchestrator.system.fingerprint import whole_env

    assert whole_env({"OMP_NUM_THREADS": "1", "RAY_ADDRESS": "x"}) == {"OMP_NUM_THREADS": "1"}


def test_one_restart_intervals_and_client_timings_against_the_server_are_not_evidence():
    effects = {
        "verify_ms": {"pct": 28.0, "ci": [20.0, 36.0], "n": [1, 6]},
        "accept_len": {"pct": -6.0, "ci": [-8.3, -3.7], "n": [1, 6]},
        "output_throughput": {"pct": 104.0, "ci": [55.0, 169.0], "n": [4, 6]},
        "tpot_ms_p50": {"pct": 20.0, "ci": [10.0, 30.0], "n": [4, 6]},
    }
    out = caveats.qualify(effects, headline="verify_ms")
    assert out["verify_ms"]["evidence"] and "assumes" in out["verify_ms"]["assumption"]
    assert not out["accept_len"]["evidence"] and "1 restart" in out["accept_len"]["caveat"]
    # verify got slower, yet tokens/s doubled: the client measured the host.
    assert not out["output_throughput"]["evidence"]
    assert "against the server" in out["output_throughput"]["caveat"]
    assert out["tpot_ms_p50"]["evidence"]  # slower, as the server says
    assert set(caveats.evidence_only(out)) == {"verify_ms", "tpot_ms_p50"}
    loaded = caveats.qualify({"tpot_ms_p50": effects["tpot_ms_p50"]}, headline="verify_ms",
                             loads=(0.4, 3.6), cpus=2)
    assert not loaded["tpot_ms_p50"]["evidence"] and "load average" in \
        loaded["tpot_ms_p50"]["caveat"]
