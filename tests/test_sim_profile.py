"""The repo's sim profile drives the server: fragment merge, requires, env_effects,
import_error and malformed JSON — merged in isolation and observed on a running server."""

from __future__ import annotations

import json
import os
import urllib.request

import pytest

from orchestrator.bench import prometheus
from orchestrator.targets.sim.profile import (
    NEUTRAL,
    ProfileError,
    load_effects,
    load_fragments,
    resolve_effects,
)
from tests.sim_client import run_sim

FAST = ["--tp-size", "8", "--sim-time-scale", "0.02", "--sim-load-seconds", "2",
        "--sim-noise-restart-cv", "0", "--sim-noise-request-cv", "0"]  # fmt: skip
EAGLE = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", "2",
         "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "3"]  # fmt: skip


def _write(repo, base: dict | None, fragments: dict[str, dict | str]) -> None:
    if base is not None:
        (repo / "sim_profile.json").write_text(json.dumps(base))
    if fragments:
        (repo / "sim_profile.d").mkdir(exist_ok=True)
    for name, doc in fragments.items():
        text = doc if isinstance(doc, str) else json.dumps(doc)
        (repo / "sim_profile.d" / f"{name}.json").write_text(text)


def test_missing_profile_is_neutral(tmp_path):
    assert load_effects(tmp_path / "sim_profile.json", {}) == NEUTRAL


def test_fragments_merge_in_filename_order(tmp_path):
    _write(tmp_path, {"verify_mult": 1.5, "verify_ms_add": 1.0, "import_error": ""}, {
        "20-b": {"verify_mult": 2.0, "verify_ms_add": 0.5, "import_error": "second"},
        "10-a": {"decode_mult": 1.1, "import_error": "first", "verify_cuda_graph": True},
        "30-c": {"verify_cuda_graph": False, "draft_mult": 0.9},
    })  # fmt: skip
    frags = load_fragments(tmp_path / "sim_profile.json")
    assert [f.stem for f in frags] == ["sim_profile", "10-a", "20-b", "30-c"]
    fx = resolve_effects(frags, {})
    assert fx.verify_mult == pytest.approx(3.0)  # multiplicative keys multiply
    assert fx.verify_ms_add == pytest.approx(1.5)  # additive keys add
    assert fx.decode_mult == pytest.approx(1.1) and fx.draft_mult == pytest.approx(0.9)
    assert fx.verify_cuda_graph is False  # any fragment can push verify off the graph
    assert fx.import_error == "first"  # first applied one, in sorted order


def test_requires_applies_a_fragment_only_with_its_partners(tmp_path):
    _write(tmp_path, None, {
        "01-pair-a": {"requires": ["02-pair-b"], "verify_mult": 1.2},
        "02-pair-b": {"requires": ["01-pair-a.json"], "decode_mult": 1.1},
        "03-lonely": {"requires": ["99-missing"], "verify_mult": 10.0, "import_error": "boom"},
    })  # fmt: skip
    fx = load_effects(tmp_path / "sim_profile.json", {})
    assert (fx.verify_mult, fx.decode_mult, fx.import_error) == (pytest.approx(1.2), pytest.approx(1.1), None)
    (tmp_path / "sim_profile.d" / "02-pair-b.json").unlink()
    assert load_effects(tmp_path / "sim_profile.json", {}) == NEUTRAL


def test_env_effects_match_values_and_wildcards(tmp_path):
    _write(tmp_path, {"env_effects": [
        {"var": "NCCL_PROTO", "value": "LL128", "allreduce_mult": 0.8},
        {"var": "NCCL_PROTO", "value": "Simple", "allreduce_mult": 1.1},
        {"var": "NCCL_MAX_NCHANNELS", "value": 4, "allreduce_mult": 1.2},
        {"var": "SGLANG_DEBUG", "value": "*", "verify_ms_add": 2.0},
    ]}, {})  # fmt: skip
    path = tmp_path / "sim_profile.json"
    assert load_effects(path, {}) == NEUTRAL
    assert load_effects(path, {"NCCL_PROTO": "LL128"}).allreduce_mult == pytest.approx(0.8)
    both = load_effects(path, {"NCCL_PROTO": "Simple", "NCCL_MAX_NCHANNELS": "4"})
    assert both.allreduce_mult == pytest.approx(1.32)
    assert load_effects(path, {"SGLANG_DEBUG": "1"}).verify_ms_add == 2.0
    assert load_effects(path, {"SGLANG_DEBUG": ""}).verify_ms_add == 0.0  # "*" = any non-empty


def test_env_effects_with_apply_only_when_every_variable_matches(tmp_path):
    """Two settings that hurt only together (the `env_synergy` scenario)."""
    _write(tmp_path, {"env_effects": [
        {"var": "A", "value": "1", "with": {"B": "16"}, "verify_cuda_graph": False},
    ]}, {})  # fmt: skip
    path = tmp_path / "sim_profile.json"
    assert load_effects(path, {"A": "1"}).verify_cuda_graph
    assert load_effects(path, {"B": "16"}).verify_cuda_graph
    assert not load_effects(path, {"A": "1", "B": "16"}).verify_cuda_graph


@pytest.mark.parametrize(
    "text",
    ['{"verify_mult": 1.5,', '[1, 2]', '{"verify_mult": "fast"}', '{"verify_cuda_graph": 0}',
     '{"env_effects": [{"var": "X"}]}', '{"requires": "01-a"}',
     '{"env_effects": [{"var": "X", "value": "1", "with": ["Y"]}]}'],
)  # fmt: skip
def test_malformed_profiles_are_errors(tmp_path, text):
    (tmp_path / "sim_profile.json").write_text(text)
    with pytest.raises(ProfileError):
        load_fragments(tmp_path / "sim_profile.json")


def _verify_ms(sim) -> float:
    with urllib.request.urlopen(sim.base_url + "/metrics") as resp:
        samples = prometheus.parse(resp.read().decode())
    seconds = prometheus.total(samples, "sglang:forward_execution_seconds_total", category="target_verify")
    return 1000 * seconds / prometheus.total(samples, "sglang:cuda_graph_passes_total", mode="decode_cuda_graph")


def test_profile_and_env_effects_change_the_running_server(tmp_path):
    """The same server binary, three checkouts: neutral, a verify regression, an env effect."""
    request = {"input_ids": list(range(50, 80)), "sampling_params": {"max_new_tokens": 40}}
    results = {}
    for name, base, env_extra in (
        ("neutral", None, {}),
        ("regressed", {"verify_mult": 1.5}, {}),
        ("env", {"env_effects": [{"var": "SIM_TEST_FLAG", "value": "on", "verify_ms_add": 5.0}]},
         {"SIM_TEST_FLAG": "on"}),
    ):  # fmt: skip
        repo = tmp_path / name
        repo.mkdir()
        _write(repo, base, {})
        env = {**os.environ, "SGLANG_ENABLE_METRICS_DEVICE_TIMER": "1", **env_extra}
        with run_sim([*FAST, *EAGLE, "--enable-metrics"], cwd=repo, log_path=repo / "s.log", env=env) as sim:
            sim.post_json("/generate", request)
            results[name] = _verify_ms(sim)
    assert results["regressed"] == pytest.approx(1.5 * results["neutral"], rel=1e-6)
    assert results["env"] == pytest.approx(results["neutral"] + 5.0, rel=1e-6)


def test_profile_can_push_verify_off_the_cuda_graph(tmp_path):
    _write(tmp_path, None, {"01-eager-verify": {"verify_cuda_graph": False}})
    args = [*FAST, *EAGLE, "--decode-log-interval", "2"]
    with run_sim(args, cwd=tmp_path, log_path=tmp_path / "s.log") as sim:
        sim.post_json("/generate", {"text": "x y z", "sampling_params": {"max_new_tokens": 20}})
        decode_lines = [line for line in sim.log().splitlines() if "Decode batch" in line]
    assert decode_lines and all("cuda graph: False" in line for line in decode_lines)


def test_import_error_fails_like_unbuildable_code(tmp_path):
    message = "cannot import name 'fused_verify' from 'sgl_kernel' (unknown location)"
    _write(tmp_path, {"import_error": message}, {})
    with run_sim(FAST, cwd=tmp_path, log_path=tmp_path / "s.log", wait_ready=False) as sim:
        code = sim.wait_exit(timeout=10)
        log = sim.log()
    assert code == 1
    lines = log.strip().splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert lines[-1] == f"ImportError: {message}"
    assert "Load weight begin" not in log  # dies at import, before loading anything


def test_malformed_profile_fails_at_start(tmp_path):
    _write(tmp_path, {"verify_mult": 1.0}, {"05-broken": '{"decode_mult": 1.1,,}'})
    with run_sim(FAST, cwd=tmp_path, log_path=tmp_path / "s.log", wait_ready=False) as sim:
        code = sim.wait_exit(timeout=10)
        log = sim.log()
    assert code == 1
    assert "05-broken.json" in log and "malformed JSON" in log and "Traceback" in log


def test_explicit_profile_path_and_env_fallback(tmp_path):
    elsewhere = tmp_path / "conf"
    elsewhere.mkdir()
    _write(elsewhere, {"import_error": "ModuleNotFoundError: No module named 'flashinfer'"}, {})
    env = {**os.environ, "SLEUTH_SIM_PROFILE": str(elsewhere / "sim_profile.json")}
    with run_sim(FAST, cwd=tmp_path, log_path=tmp_path / "s.log", env=env, wait_ready=False) as sim:
        assert sim.wait_exit(timeout=10) == 1
        assert sim.log().strip().endswith("ModuleNotFoundError: No module named 'flashinfer'")
