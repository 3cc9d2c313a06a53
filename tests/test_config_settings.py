"""The typed settings tree (orchestrator/config/settings.py): built once from the composed
config, frozen, changed only by making a new record, and a stored run's configuration merged
onto today's schema so that an old run still resumes.

`tests/fixtures/saved_run/` is a run directory (config.yaml + trials.db) written by
`create_run` before the settings were typed: a sim bisect with an env variable and an
experiment knob, its runs_dir rewritten to a neutral path."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
import yaml

from orchestrator.config import settings
from orchestrator.config.compose import compose_config, to_yaml
from orchestrator.config.schema import BenchConf, SimTargetConf, SpaceParamConf
from orchestrator.errors import UserError
from orchestrator.store import RunStore

SAVED = Path(__file__).parent / "fixtures" / "saved_run"


def test_composed_config_becomes_one_frozen_typed_tree():
    cfg = compose_config("sweep", ["target=sim", "space=nccl_quick", "env.NCCL_PROTO=LL",
                                   "bench.requests=7", "experiment.params.restarts=2"])
    s = settings.settings_of(cfg)
    assert isinstance(s.target, SimTargetConf) and s.target.tp_size == 8
    assert isinstance(s.bench, BenchConf) and s.bench.requests == 7
    assert all(isinstance(p, SpaceParamConf) for p in s.space.params.values())
    assert s.env == {"NCCL_PROTO": "LL"}
    assert settings.params(s).restarts == 2
    assert settings.to_yaml(s) == to_yaml(cfg)  # what a run stores did not change
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.bench.requests = 9  # type: ignore[misc]


def test_evolve_returns_a_new_record_and_leaves_the_old_one():
    s = settings.settings_of(compose_config("bisect", ["target=sim"]))
    t = settings.evolve(s, {"trial.retries": 4, "target.seed": 7}, run_id="r1")
    assert (t.trial.retries, t.target.seed, t.run_id) == (4, 7, "r1")
    assert (s.trial.retries, s.target.seed, s.run_id) == (1, None, None)
    assert isinstance(t.target, SimTargetConf)
    with pytest.raises(KeyError):
        settings.evolve(s, {"trial.no_such_setting": 1})


def test_a_run_written_before_the_typed_tree_loads_and_resumes_its_settings(tmp_path):
    run_dir = tmp_path / "saved-bisect"
    shutil.copytree(SAVED, run_dir)
    store = RunStore.open(run_dir / "trials.db")
    try:
        text = store.config_yaml()
        command = store.command
    finally:
        store.close()
    s = settings.load_saved(text)
    assert command == "bisect" and s.command == "bisect"
    assert (s.good, s.bad, s.repo) == ("v1", "v2", "/nonexistent/repo")
    assert isinstance(s.target, SimTargetConf) and s.env == {"NCCL_PROTO": "LL128"}
    assert settings.params(s).min_effect_pct == 5.0
    # What it stored comes back unchanged; settings added since take their defaults.
    now = yaml.safe_load(settings.to_yaml(s))
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    added = {key: now.pop(key) for key in set(now) - set(saved)}
    assert now == saved and added == {
        "was": None, "then": None, "now": None, "mode": None, "from_log": None,
        "log": {"pattern": ""}, "budget": None,
        "live": {"server": "", "restart": False, "restarts": 5, "grace_s": 60.0}}


def test_a_setting_added_later_takes_its_default_and_one_removed_is_dropped():
    values = yaml.safe_load((SAVED / "config.yaml").read_text())
    del values["evidence"], values["target"]["gpu_state"], values["cluster"]["rejoin_timeout_s"]
    values["setting_since_removed"] = 3
    values["bench"]["retired_knob"] = 1
    s = settings.load_saved(yaml.safe_dump(values))
    assert s.evidence.max_causes == 3 and s.evidence.kernels is None
    assert s.target.gpu_state == "" and s.cluster.rejoin_timeout_s == 600.0
    assert not hasattr(s, "setting_since_removed") and not hasattr(s.bench, "retired_knob")
    assert s.bench.requests == values["bench"]["requests"]


def test_a_saved_sweep_keeps_its_space_and_drops_a_retired_level_setting():
    cfg = compose_config("sweep", ["target=sim", "space=nccl_quick"])
    values = yaml.safe_load(to_yaml(cfg))
    first = next(iter(values["space"]["params"]))
    values["space"]["params"][first]["retired"] = True
    s = settings.load_saved(yaml.safe_dump(values))
    assert s.space == settings.settings_of(cfg).space


def test_a_saved_value_of_the_wrong_type_is_one_line():
    values = yaml.safe_load((SAVED / "config.yaml").read_text())
    values["bench"]["requests"] = "many"
    with pytest.raises(UserError, match="does not fit the schema"):
        settings.load_saved(yaml.safe_dump(values))


def test_a_target_reads_its_typed_record_and_a_plain_mapping_gets_the_schema_defaults(tmp_path):
    from orchestrator.config.schema import CommandTargetConf
    from orchestrator.targets.base import NodeContext
    from orchestrator.targets.registry import make_target

    s = settings.settings_of(compose_config("trial", ["target=command", "target.bench=b --n 3",
                                                      "target.shell=true", "bench.requests=5"]))
    node = NodeContext("n0", tmp_path / "node")
    target = make_target(s.target, s.bench, node)
    assert target.settings is s.target and target.bench_settings is s.bench
    assert target.argv("b --n 3") == ["/bin/sh", "-c", "b --n 3"]  # target.shell read typed
    assert not hasattr(target, "conf")  # the typed record only: no dict twin to drift
    bare = make_target({"name": "command", "bench": "b"}, {}, node)
    assert isinstance(bare.settings, CommandTargetConf)
    assert bare.settings.pythonpath == [".", "src"] and bare.bench_settings.requests == 4
    assert len(bare.requests()) == 4
