"""Search spaces: loading from the config group, checks, conditional parameters, candidates."""

from __future__ import annotations

import optuna
import pytest

from orchestrator.config import sweep as setup
from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import as_dict
from orchestrator.errors import UserError
from orchestrator.records import Candidate
from orchestrator.strategies.sweep.space import SearchSpace

BASE = Candidate.make("a" * 40, env={"NCCL_DEBUG": "WARN"})


def _space(name: str, *overrides: str) -> tuple[SearchSpace, dict]:
    cfg = compose_settings("sweep", ["target=sim", f"space={name}", *overrides])
    target = as_dict(cfg.target)
    return setup.space(cfg, target), target


def test_nccl_pcie_space_is_large_and_conditional():
    space, target = _space("nccl_pcie")
    assert space.names[:2] == ["NCCL_PROTO", "NCCL_ALGO"]
    assert {"NCCL_MAX_NCHANNELS", "NCCL_MIN_NCHANNELS", "NCCL_P2P_LEVEL", "NCCL_BUFFSIZE",
            "CUDA_DEVICE_MAX_CONNECTIONS"} <= set(space.names)
    size = space.size()
    product = 1
    for p in space.params:
        product *= len(p.values)
    # The floor is only swept without a ceiling, so there are fewer distinct configurations
    # than grid points, and still far more than 200.
    assert 200 <= size < product
    configs = list(space.configurations())
    assert len(configs) == size
    assert all("NCCL_MIN_NCHANNELS" not in c for c in configs if c["NCCL_MAX_NCHANNELS"] is not None)
    assert len({space.candidate(BASE, c, target).key for c in configs}) == size


def test_baseline_is_the_base_candidate_and_levels_become_env():
    space, target = _space("nccl_pcie")
    baseline = space.baseline(target)
    assert all(v is None for v in baseline.values())
    assert space.candidate(BASE, baseline, target) == BASE  # same key: shares its trials
    cand = space.candidate(BASE, {**baseline, "NCCL_PROTO": "LL", "NCCL_BUFFSIZE": 1048576}, target)
    assert cand.env_dict == {"NCCL_DEBUG": "WARN", "NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "1048576"}
    assert space.label({**baseline, "NCCL_PROTO": "LL"}, baseline) == "NCCL_PROTO=LL"


def test_spec_decode_server_settings_and_baseline_from_target():
    space, target = _space("spec_decode")
    kinds = {p.name: p.kind for p in space.params}
    assert kinds["speculative_num_steps"] == "server"
    assert kinds["clock"] == "clock"
    baseline = space.baseline(target)
    # unset baselines of server settings are what the target runs today
    assert baseline["speculative_num_steps"] == target["speculative_num_steps"]
    assert baseline["speculative_eagle_topk"] == target["speculative_eagle_topk"]
    assert "speculative_num_draft_tokens" not in baseline  # only swept for tree drafts (topk>1)
    assert space.candidate(BASE, baseline, target) == BASE
    tree = {**baseline, "speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
    cand = space.candidate(BASE, tree, target)
    assert cand.server_dict == {"speculative_eagle_topk": 4, "speculative_num_draft_tokens": 8}
    chain = {**baseline, "speculative_num_steps": 3, "speculative_num_draft_tokens": 8}
    assert "speculative_num_draft_tokens" not in space.candidate(BASE, chain, target).server_dict
    locked = space.candidate(BASE, {**baseline, "clock": "locked:1800"}, target)
    assert locked.clock == "locked:1800"


def test_suggest_follows_conditions_and_optuna_accepts_the_baseline():
    space, target = _space("spec_decode")
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    seen_tree = seen_chain = False
    for _ in range(40):
        trial = study.ask()
        a = space.suggest(trial)
        tree = a["speculative_eagle_topk"] > 1
        assert ("speculative_num_draft_tokens" in a) == tree
        seen_tree |= tree
        seen_chain |= not tree
        study.tell(trial, 1.0)
    assert seen_tree and seen_chain
    baseline = space.baseline(target)
    assert space.representable(baseline)
    study.add_trial(optuna.trial.create_trial(params=baseline,
                                              distributions=space.distributions(baseline),
                                              value=1.0))


@pytest.mark.parametrize("params, message", [
    ({}, "no parameters"),
    ({"NCCL_PROTO": {"values": ["LL"], "kind": "gpu"}}, "kind must be"),
    ({"NCCL_PROTO": {}}, "needs values"),
    ({"NCCL_PROTO": {"values": ["LL", "LL"]}}, "repeated"),
    ({"1BAD": {"values": ["x"]}}, "environment variable"),
    ({"A": {"values": [1, 2]}, "B": {"values": [1], "when": {"C": [1]}}}, "declared before"),
    ({"A": {"values": [1, 2]}, "B": {"values": [1], "when": {"A": [3]}}}, "not a level"),
    ({"A": {"values": [1, 2], "baseline": 5}}, "baseline 5"),
    ({"A": {"low": 2, "high": 1}}, "low < high"),
    ({"A": {"low": 0, "high": 4, "log": True}}, "log range"),
    ({"clock": {"kind": "clock", "values": ["default", "locked=1800"]}}, "bad clock policy"),
])
def test_bad_spaces_are_rejected_with_the_parameter_named(params, message):
    with pytest.raises(UserError, match=message):
        SearchSpace.from_conf({"name": "bad", "params": params})


def test_server_parameter_must_be_a_target_setting():
    space = SearchSpace.from_conf(
        {"name": "s", "params": {"speculative_num_step": {"kind": "server", "values": [1, 2]}}})
    from orchestrator.strategies.sweep.space import check_server_params

    with pytest.raises(UserError, match="speculative_num_step.*not a setting"):
        check_server_params(space, {"name": "sim", "speculative_num_steps": 2})


def test_ranges_have_grids_only_when_stepped():
    stepped = SearchSpace.from_conf({"name": "r", "params": {
        "A": {"low": 1, "high": 9, "step": 4, "integer": True},
        "B": {"low": 0.5, "high": 1.5, "step": 0.5}}})
    assert stepped.grid() == {"A": [1, 5, 9], "B": [0.5, 1.0, 1.5]}
    assert stepped.size() == 9
    continuous = SearchSpace.from_conf({"name": "c", "params": {"A": {"low": 0.1, "high": 1.0,
                                                                      "log": True}}})
    assert continuous.grid() is None and continuous.size() is None


def test_no_space_is_bad_input():
    cfg = compose_settings("sweep", ["target=sim"])
    with pytest.raises(UserError, match="space=NAME"):
        setup.space(cfg, {})


def test_the_clock_policies_a_command_sets_are_its_sides_and_its_space_s_levels():
    """What each node checks against its GPUs before the first trial (besides the run's own
    clock): an isolate passes its sides' clocks, a sweep its space's clock levels."""
    from orchestrator.commands.parts import control

    cfg = compose_settings("sweep", ["target=sim", "repo=/r"])
    space, _ = _space("spec_decode")
    levels = {str(v) for p in space.params if p.kind == "clock" for v in p.values
              if v is not None}
    assert levels and set(control(cfg, space=space).clocks) == levels | {"default"}
    sides = ({"clock": "locked:1500"}, {"commit": "HEAD"}, "HEAD")
    assert control(cfg, sides=sides).clocks == ("default", "locked:1500")
    assert control(cfg).clocks == ("default",) == control(cfg, space=None).clocks
