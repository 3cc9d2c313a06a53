from __future__ import annotations

import pytest

from orchestrator.config.compose import compose_config
from orchestrator.errors import UserError


def test_defaults_compose_with_groups():
    cfg = compose_config("trial", [])
    assert cfg.target.name == "sglang"  # the real server; the sim only when named
    assert compose_config("demo", []).target.name == "sim"  # the demo is the sim's story
    assert cfg.bench.repetitions == 3
    assert cfg.cluster.kind == "local"
    assert cfg.experiment.name == "trial"
    assert cfg.command == "trial"


def test_overrides_and_open_env_keys():
    cfg = compose_config("trial", ["target=sim", "env.NCCL_PROTO=LL128", "bench.repetitions=5",
                                   "target.env.NCCL_ALGO=Ring", "target.time_scale=0.1"])
    assert cfg.env == {"NCCL_PROTO": "LL128"}
    assert cfg.target.env == {"NCCL_ALGO": "Ring"}
    assert cfg.bench.repetitions == 5
    assert cfg.target.time_scale == pytest.approx(0.1)


@pytest.mark.parametrize("override", [
    "bench.nope=1", "bench.repetitions=abc", "target=nope", "foo", "nodes=x", "nope=1",
    "confidence=high",
])
def test_bad_overrides_are_user_errors(override):
    with pytest.raises(UserError) as err:
        compose_config("trial", [override])
    assert "\n" not in str(err.value)


def test_user_config_dir_adds_groups(tmp_path):
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "long.yaml").write_text("defaults:\n  - base_bench\noutput_len: 512\n")
    cfg = compose_config("trial", ["bench=long"], config_dir=tmp_path)
    assert cfg.bench.output_len == 512
    with pytest.raises(UserError):
        compose_config("trial", ["bench=long"])


def test_compose_does_not_change_cwd(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    compose_config("trial", [])
    import os

    assert os.getcwd() == str(tmp_path)


def test_experiment_params_are_one_typed_record():
    """Every knob typed once at composition; readers get the record, never the mapping."""
    from orchestrator.config import params as experiment_params

    cfg = compose_config("sweep", ["experiment.params.restarts=4", "experiment.params.prune=off",
                                   "experiment.params.min_effect_pct=10"])
    p = experiment_params.of(cfg)
    assert (p.restarts, p.prune, p.min_effect_pct, p.batch) == (4, False, 10.0, None)
    assert p.given == {"restarts", "prune", "min_effect_pct"}
    with pytest.raises(UserError, match="confirm_min_rounds <= confirm_rounds"):
        compose_config("sweep", ["experiment.params.confirm_min_rounds=9",
                                 "experiment.params.confirm_rounds=4"])
    with pytest.raises(UserError, match="importance must be one of"):
        compose_config("sweep", ["experiment.params.importance=shap"])


@pytest.mark.parametrize("command, overrides, want", [
    ("bisect", ["good=HEAD~3", "bad=v1.2^"], {"good": "HEAD~3", "bad": "v1.2^"}),
    ("bisect", ["good=main@{1}", "bad=HEAD^{commit}"], {"good": "main@{1}", "bad": "HEAD^{commit}"}),
    ("bisect", ["good=0123456", "bad=HEAD~1^2"], {"good": "0123456", "bad": "HEAD~1^2"}),
    ("trial", ["commit=HEAD~2", "repo=~/src/sglang"], {"commit": "HEAD~2", "repo": "~/src/sglang"}),
    ("investigate", ["bad=origin/main~4", "reference=~/runs/ref"],
     {"bad": "origin/main~4", "reference": "~/runs/ref"}),
])
def test_git_revision_syntax_is_taken_as_typed(command, overrides, want):
    """`HEAD~3` is what people type: Hydra's grammar cannot read it, so the value is kept as a
    string exactly as given (and a SHA of digits keeps its leading zero)."""
    cfg = compose_config(command, overrides)
    assert {key: cfg[key] for key in want} == want


def test_revision_syntax_in_an_isolate_side():
    cfg = compose_config("isolate", ["good.commit=HEAD~3", "bad.commit=HEAD^",
                                     "bad.env.NCCL_PROTO=LL"])
    assert cfg.good.commit == "HEAD~3" and cfg.bad.commit == "HEAD^"
    assert cfg.bad.env.NCCL_PROTO == "LL"


def test_relative_target_files_are_taken_from_where_sleuth_started(tmp_path, monkeypatch):
    """The server starts in a worktree: `target.gpu_state=state.json` means the file beside
    the user, so it is made absolute before anything runs (and is stored that way)."""
    from orchestrator.commands.common import absolute_paths
    from orchestrator.config.compose import compose_settings

    monkeypatch.chdir(tmp_path)
    cfg = absolute_paths(compose_settings("trial", ["target=sim", "target.gpu_state=state.json",
                                                    "repo=my-repo"]))
    assert cfg.target.gpu_state == str(tmp_path / "state.json")
    assert cfg.repo == str(tmp_path / "my-repo")
    real = compose_settings("trial", ["target=sglang", "target.python=venv/bin/python"])
    assert absolute_paths(real).target.python == str(tmp_path / "venv" / "bin" / "python")
    on_path = compose_settings("trial", ["target=sglang", "target.python=python3"])
    assert absolute_paths(on_path).target.python == "python3"  # a name on PATH stays one
