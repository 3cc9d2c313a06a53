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
