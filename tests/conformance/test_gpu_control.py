"""The GPU-control contract (`orchestrator/gpu/base.py`), run by every backend.

Each backend stands on the same two-GPU node: stock 600 W power limits (GPU 0 may go to 700 W,
GPU 1 no higher than 600 W), no clock locks, persistence on. `sim` is the simulated node's
GPU-state file; `nvml` is the real NVML backend over an in-memory `pynvml`
(`fake_pynvml.py`, injected through `sys.modules`); `none` (a node without GPUs) takes only
the tests that make sense without clocks to set.

What every backend must do, because the trial runner relies on it (`runner/trial.py`): read the
node's state; apply a policy's parts and nothing else; restore exactly what the policy changed,
also from a token that went through JSON (a killed node's next actor restores it from disk) and
also twice; leave alone what someone else changed meanwhile; refuse a policy it cannot apply
with an exception *before* anything is left half-set (the trial is then `prepare_failed`); and
raise when a restore fails, so the trial says "clock policy NOT restored" instead of running
the next one on the wrong clocks.
"""

from __future__ import annotations

import inspect
import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from orchestrator.gpu.base import ClockPolicy, GpuControl, GpuSample, NoGpuControl
from orchestrator.runner.trial import clock_problem
from orchestrator.targets.sim import gpu_state
from tests.conformance import fake_pynvml
from tests.conformance.fake_pynvml import FakeGpu, FakeNvml

SETTINGS = ("power_limit_w", "sm_clock_locked_mhz", "mem_clock_locked_mhz",
            "applications_clock_sm_mhz", "persistence_mode")


@dataclass
class Node:
    """A backend on the shared two-GPU node, with the hands a test needs around it."""

    control: GpuControl
    settings: Callable[[], list[dict]]  # per GPU, as the node really has it (locks included)
    set_from_outside: Callable[[int, str, object], None]  # nvidia-smi by someone else
    plant_process: Callable[[int, int], None]  # (gpu, pid): a process using that GPU
    deny_writes: Callable[[], None]  # from now on every change fails (not root, read-only)


def _sim_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Node:
    from orchestrator.targets.sim.gpu_control import SimGpuControl

    path = tmp_path / "gpu_state.json"
    gpu_state.save(path, gpu_state.GpuState(gpus=(
        gpu_state.GpuInfo(index=0, power_limit_max_w=700), gpu_state.GpuInfo(index=1))))

    def settings() -> list[dict]:
        return [{**{k: getattr(g, k) for k in SETTINGS},
                 "applications_clock_sm_mhz": g.applications_clock_sm_mhz or g.sm_clock_max_mhz}
                for g in gpu_state.load(path).gpus]

    def outside(index: int, key: str, value: object) -> None:
        gpu_state.save(path, gpu_state.load(path).with_gpu(index, **{key: value}))

    def plant(index: int, pid: int) -> None:
        state = gpu_state.load(path)
        procs = (*state.gpu(index).processes, gpu_state.GpuProcess(pid, "python", 1024))
        gpu_state.save(path, state.with_gpu(index, processes=procs))

    def deny() -> None:
        def refuse(*_args, **_kwargs):
            raise PermissionError(13, "Permission denied", str(path))

        monkeypatch.setattr(gpu_state, "save", refuse)

    return Node(SimGpuControl(path), settings, outside, plant, deny)


def _nvml_node(monkeypatch: pytest.MonkeyPatch) -> Node:
    from orchestrator.gpu.nvml import NvmlGpuControl

    fake = FakeNvml([FakeGpu(0, power_max_mw=700_000), FakeGpu(1)])
    monkeypatch.setitem(sys.modules, "pynvml", fake.module())

    def plant(index: int, pid: int) -> None:
        fake.gpus[index].processes[pid] = 2**30

    def deny() -> None:
        fake.writable = False

    return Node(NvmlGpuControl(), fake.settings, fake.set_from_outside, plant, deny)


@pytest.fixture(params=["sim", "nvml"])
def node(request, tmp_path, monkeypatch) -> Node:
    """Every backend that can set clocks."""
    if request.param == "sim":
        return _sim_node(tmp_path, monkeypatch)
    return _nvml_node(monkeypatch)


@pytest.fixture(params=["sim", "nvml", "none"])
def control(request, tmp_path, monkeypatch) -> GpuControl:
    """Every backend, the one without GPUs included."""
    if request.param == "none":
        return NoGpuControl()
    if request.param == "sim":
        return _sim_node(tmp_path, monkeypatch).control
    return _nvml_node(monkeypatch).control


# -- reading the node --------------------------------------------------------------------------
def test_snapshot_names_its_backend_and_every_gpu(control):
    snap = control.snapshot()
    assert snap["backend"] == control.name and control.name
    json.dumps(snap)  # it goes into the fingerprint as JSON
    gpus = snap.get("gpus", [])
    assert [g["index"] for g in gpus] == ([] if isinstance(control, NoGpuControl) else [0, 1])
    for g in gpus:
        assert g["power_limit_w"] == 600 and g["power_limit_default_w"] == 600
        assert g["sm_clock_max_mhz"] == 2430 and g["persistence_mode"] is True
        assert g["applications_clock_sm_mhz"] == 2430  # never set: reads as its default


def test_snapshot_gives_what_a_policy_is_checked_against(node):
    """`clock_problem` refuses a policy beyond the GPUs' limits before anything is set, with
    one line: every backend reports the limits it needs."""
    snap = node.control.snapshot()
    assert [g["power_limit_max_w"] for g in snap["gpus"]] == [700, 600]
    assert "above GPU 1's maximum power limit of 600 W" in clock_problem(
        ClockPolicy.parse("power:650"), snap)
    assert "beyond GPU 0's maximum SM clock of 2430 MHz" in clock_problem(
        ClockPolicy.parse("locked:3000"), snap)
    assert clock_problem(ClockPolicy.parse("locked:1500,power:600"), snap) == ""


def test_samples_one_per_gpu_and_own_processes_are_not_foreign(node):
    node.plant_process(0, 4242)
    node.plant_process(1, 5151)
    samples = node.control.sample(own_pids={4242})
    assert [s.index for s in samples] == [0, 1]
    assert all(isinstance(s, GpuSample) and s.sm_clock_mhz > 0 for s in samples)
    assert samples[0].foreign_pids == () and samples[1].foreign_pids == (5151,)


def test_without_gpus_nothing_is_sampled():
    assert NoGpuControl().sample() == []


# -- applying and restoring a policy -----------------------------------------------------------
POLICIES = {
    "power:450": {"power_limit_w": 450},
    "locked:1500": {"sm_clock_locked_mhz": 1500},
    "mem_locked:1000": {"mem_clock_locked_mhz": 1000},
    "app:1500": {"applications_clock_sm_mhz": 1500},
    "persistence:off": {"persistence_mode": False},
    "locked:1980,power:500": {"sm_clock_locked_mhz": 1980, "power_limit_w": 500},
}


def test_the_default_policy_leaves_the_node_as_it_is(control):
    before = control.snapshot()
    token = control.apply(ClockPolicy.parse("default"))
    assert control.snapshot() == before
    control.restore(token)
    assert control.snapshot() == before


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_a_policy_sets_its_parts_on_every_gpu_and_nothing_else(node, policy):
    before = node.settings()
    node.control.apply(ClockPolicy.parse(policy))
    assert node.settings() == [{**g, **POLICIES[policy]} for g in before]


@pytest.mark.parametrize("policy", [*sorted(POLICIES), "reset", "power:default", "app:default"])
def test_restore_puts_back_exactly_what_was_there(node, policy):
    """From a node someone had already changed (power lowered on one GPU, an applications
    clock and persistence changed on the other): restore gives that node back, not a stock one."""
    node.set_from_outside(1, "power_limit_w", 550)
    node.set_from_outside(0, "applications_clock_sm_mhz", 2000)
    node.set_from_outside(0, "persistence_mode", False)
    before = node.settings()
    token = node.control.apply(ClockPolicy.parse(policy))
    assert node.settings() != before, "the policy changed nothing: the test proves nothing"
    node.control.restore(token)
    assert node.settings() == before


def test_restore_works_from_a_token_read_back_from_disk_and_twice(node):
    before = node.settings()
    token = node.control.apply(ClockPolicy.parse("locked:1500,power:450,persistence:off"))
    saved = json.loads(json.dumps(token))  # as the node actor persists it for its successor
    node.control.restore(saved)
    node.control.restore(saved)
    assert node.settings() == before


def test_restore_leaves_alone_what_someone_else_changed_during_the_trial(node):
    before = node.settings()
    token = node.control.apply(ClockPolicy.parse("power:450"))
    node.set_from_outside(0, "sm_clock_locked_mhz", 1800)
    node.control.restore(token)
    after = node.settings()
    assert after[0] == {**before[0], "sm_clock_locked_mhz": 1800}
    assert after[1] == before[1]


# -- failures -----------------------------------------------------------------------------------
def test_a_policy_one_gpu_cannot_take_leaves_every_gpu_as_it_was(node):
    """GPU 1 cannot go to 650 W: the policy is refused with an exception (the trial is then
    `prepare_failed`), and neither GPU keeps the parts set before the refusal."""
    before = node.settings()
    with pytest.raises(Exception) as refused:
        node.control.apply(ClockPolicy.parse("locked:1500,power:650"))
    assert isinstance(refused.value, Exception) and str(refused.value)
    assert node.settings() == before


def test_without_permission_a_policy_is_refused_and_nothing_changes(node):
    before = node.settings()
    node.deny_writes()
    with pytest.raises(Exception) as refused:
        node.control.apply(ClockPolicy.parse("power:450"))
    assert str(refused.value)
    assert node.settings() == before


def test_a_restore_that_fails_says_so(node):
    """The trial runner reports "clock policy NOT restored" only if restore raises: a backend
    that swallowed the failure would let the next trial run on this trial's clocks."""
    token = node.control.apply(ClockPolicy.parse("power:450"))
    node.deny_writes()
    with pytest.raises(Exception) as failed:
        node.control.restore(token)
    assert str(failed.value)
    assert [g["power_limit_w"] for g in node.settings()] == [450, 450]


def test_a_node_without_gpus_refuses_any_clock_policy():
    with pytest.raises(RuntimeError, match="no GPU control"):
        NoGpuControl().apply(ClockPolicy.parse("power:450"))


# -- the fake is pynvml --------------------------------------------------------------------------
def test_the_fake_pynvml_has_the_real_names_values_and_arguments():
    """Every constant, error class and function the fake offers exists in the installed
    nvidia-ml-py with the same value or the same positional arguments: the NVML backend's
    conformance is checked against the API it will meet."""
    real = pytest.importorskip("pynvml")
    assert hasattr(real, "_nvmlGetFunctionPointer"), "the real pynvml, not a fake"
    for name, value in fake_pynvml.CONSTANTS.items():
        assert getattr(real, name) == value, name
    for error in fake_pynvml.ERRORS:
        assert issubclass(getattr(real, error.__name__), real.NVMLError), error.__name__
    fake = FakeNvml([]).module()
    functions = [n for n, f in vars(fake).items() if n.startswith("nvml") and callable(f)]
    assert len(functions) >= 30
    for name in functions:
        ours = list(inspect.signature(getattr(fake, name)).parameters)
        theirs = list(inspect.signature(getattr(real, name)).parameters)
        assert ours == theirs, f"{name}: fake takes {ours}, pynvml takes {theirs}"
