"""The target contract (`orchestrator/targets/base.py`), run by every target without a server.

Targets as the registry builds them from the composed config: `sim`; `sglang` (the real
adapter: argv and checks only, nothing is launched); `sglang` with `launcher=sim`; `command`
as a bare benchmark and with a server of its own. Every one must: be found by its name; give
an argv (never a shell string) with its launcher first and, for a server, the port; layer the
environment node < target < candidate, with `<unset>` removing a variable; accept a good
config and name a bad one in one line before any trial; answer "not ready" and "no metrics"
about a port nothing listens on, without raising; turn a measurement that cannot happen into
a `BenchError` (the trial is then classified, never recorded as sleuth's own error); give the
same requests for the same seed; and hand out a GPU backend of the GPU seam (NVML over
`fake_pynvml` here, so a machine with a GPU runs the same test). Server runs against the
sim are in `tests/test_target_sglang.py` and `tests/test_target_command.py`.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from orchestrator.bench.client import BenchError
from orchestrator.config.compose import compose_config
from orchestrator.gpu.base import GpuControl
from orchestrator.records import UNSET
from orchestrator.targets.base import NodeContext, Target
from orchestrator.targets.registry import is_simulated, make_target, target_class
from tests.conformance.fake_pynvml import FakeGpu, FakeNvml

PY = sys.executable


@dataclass(frozen=True)
class Variant:
    """One target configuration: the config group, overrides, and what it is expected to be."""

    group: str
    conf: dict = field(default_factory=dict)
    simulated: bool = False
    server: bool = True
    bad: dict = field(default_factory=dict)  # a change preflight must refuse
    failing: dict = field(default_factory=dict)  # a change that makes measuring fail


VARIANTS = {
    "sim": Variant("sim", simulated=True, bad={"sglang_version": "9.9.9"}),
    "sglang": Variant("sglang", {"model_path": "org/model", "sglang_version": "0.5.23",
                                 "check_flags": False}, bad={"model_path": ""}),
    "sglang+sim": Variant("sglang", {"engine": "sim", "check_flags": False}, simulated=True,
                          bad={"engine": "vllm"}),
    "command": Variant("command", {"bench": f"{PY} -c 'print(1.5)'"}, server=False,
                       bad={"bench": ""}, failing={"bench": f"{PY} -c 'raise SystemExit(3)'"}),
    "command+server": Variant("command", {"bench": f"{PY} -c 'print(1.5)'",
                                          "server": f"{PY} -m http.server {{port}}"},
                              bad={"server": "python 'unclosed"},
                              failing={"bench": f"{PY} -c 'raise SystemExit(3)'"}),
}


@cache
def _composed(group: str) -> tuple[dict, dict]:
    required = ["target.bench=true"] if group == "command" else []  # replaced per variant
    cfg = compose_config("trial", [f"target={group}", *required])
    return (OmegaConf.to_container(cfg.target, resolve=True),
            OmegaConf.to_container(cfg.bench, resolve=True))


def _make(variant: Variant, node_dir: Path, **changes) -> Target:
    conf, bench = _composed(variant.group)
    return make_target({**conf, **variant.conf, **changes}, bench,
                       NodeContext("n0", node_dir))


@pytest.fixture(params=sorted(VARIANTS))
def variant(request) -> Variant:
    return VARIANTS[request.param]


@pytest.fixture
def target(variant, tmp_path) -> Target:
    return _make(variant, tmp_path / "node")


def _closed_port() -> int:
    """A port nothing listens on (bound once by the kernel's choice, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- what it is --------------------------------------------------------------------------------
def test_the_registry_builds_it_by_its_name(variant, target):
    assert target.name == variant.group and isinstance(target, target_class(variant.group))
    assert is_simulated(target.settings) is variant.simulated
    assert target.has_server is variant.server
    assert target.time_scale > 0 and target.own_pids() == []
    assert os.access(target.python_executable(), os.X_OK)


def test_a_good_config_passes_preflight_and_a_bad_one_is_named_in_one_line(variant, tmp_path):
    assert _make(variant, tmp_path / "good").preflight() is None
    problem = _make(variant, tmp_path / "bad", **variant.bad).preflight()
    assert isinstance(problem, str) and problem.strip() and "\n" not in problem


# -- what it runs ------------------------------------------------------------------------------
def test_the_command_is_an_argv_with_the_launcher_first_and_the_port(variant, tmp_path):
    launcher = ["taskset", "-c", "0-3"]
    target = _make(variant, tmp_path / "node", launcher=launcher)
    argv = target.command(tmp_path, 31234)
    assert isinstance(argv, list) and all(isinstance(a, str) for a in argv) and len(argv) > 3
    assert argv[:3] == launcher
    assert ("31234" in " ".join(argv)) is variant.server


def test_the_environment_layers_node_target_and_candidate(variant, tmp_path, monkeypatch):
    monkeypatch.setenv("SLEUTH_T_NODE", "node")
    monkeypatch.setenv("SLEUTH_T_DROPPED", "node")
    target = _make(variant, tmp_path / "node",
                   env={"SLEUTH_T_TARGET": "target", "SLEUTH_T_BOTH": "target"})
    env = target.environment({"SLEUTH_T_BOTH": "candidate", "SLEUTH_T_DROPPED": UNSET})
    assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())
    assert env["SLEUTH_T_NODE"] == "node" and env["SLEUTH_T_TARGET"] == "target"
    assert env["SLEUTH_T_BOTH"] == "candidate" and "SLEUTH_T_DROPPED" not in env


def test_prepare_leaves_the_checkout_as_it_is(target, tmp_path):
    worktree, trial_dir = tmp_path / "wt", tmp_path / "trial"
    worktree.mkdir()
    (worktree / "a.py").write_text("x = 1\n")
    trial_dir.mkdir()
    target.prepare(worktree, trial_dir)
    assert sorted(p.name for p in worktree.iterdir()) == ["a.py"]


# -- probing and measuring ---------------------------------------------------------------------
def test_a_port_nothing_listens_on_is_not_ready_and_has_no_metrics(target):
    url = f"http://127.0.0.1:{_closed_port()}"
    assert target.is_ready(url) is False
    assert target.scrape(url) is None


def test_a_measurement_that_cannot_happen_is_a_bench_error(variant, tmp_path):
    """No server where the target expects one, or a benchmark that exits non-zero: the trial
    runner classifies a BenchError (bench_failed, hung, crashed); anything else would be
    recorded as sleuth's own bug."""
    target = _make(variant, tmp_path / "node", **variant.failing)
    target.bench_settings = dataclasses.replace(target.bench_settings, request_timeout_s=5.0)
    worktree, trial_dir = tmp_path / "wt", tmp_path / "trial"
    worktree.mkdir()
    trial_dir.mkdir()
    target.prepare(worktree, trial_dir)
    target.environment({})
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(BenchError):
        target.measure(url, target.requests(1), trial_dir / "server.log")
    with pytest.raises(BenchError):
        target.warm_up(url, 1)


def test_the_same_seed_gives_the_same_requests(target):
    first = target.requests(3)
    assert len(first) == 3 and first == target.requests(3)
    assert target.requests(3, seed_offset=1) != first


# -- the GPU seam --------------------------------------------------------------------------------
def test_it_hands_out_a_backend_of_the_gpu_seam(variant, target, monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml([FakeGpu(0)]).module())
    control = target.gpu_control()
    assert isinstance(control, GpuControl)
    assert control.name == ("sim" if variant.simulated else "nvml")
    snap = control.snapshot()
    assert snap["backend"] == control.name and snap["gpus"]
    if variant.simulated:  # the node's own GPU state, in its state directory
        assert (target.node.state_dir / "gpu_state.json").is_file()
