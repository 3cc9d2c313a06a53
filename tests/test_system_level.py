"""System level on the sim: clock policy restored, suspect trials, fingerprints, compare."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.commands import compare as compare_cmd
from orchestrator.commands import trial as trial_cmd
from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import as_dict
from orchestrator.gpu.base import ClockPolicy
from orchestrator.records import Outcome
from orchestrator.store import RunStore
from orchestrator.targets.sim import gpu_state
from orchestrator.targets.sim.gpu_control import SimGpuControl

FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=30", "trial.retries=0",
        "trial.telemetry_interval_s=0.1"]


def _runs(tmp_path: Path) -> list[Path]:
    root = tmp_path / "runs"
    return sorted((p for p in root.iterdir() if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime)


def _node_state(tmp_path: Path) -> Path:
    return tmp_path / "runs" / ".nodes" / "local-0" / "gpu_state.json"


def test_clock_policy_parse():
    assert ClockPolicy.parse("default").is_default
    assert ClockPolicy.parse("locked:1980,power:450") == ClockPolicy(1980, 450)
    from orchestrator.errors import UserError

    for bad in ("locked", "power:-3", "turbo:1", "locked:abc"):
        with pytest.raises(UserError):
            ClockPolicy.parse(bad)


def test_sim_gpu_control_apply_restore(tmp_path):
    ctl = SimGpuControl(tmp_path / "gpu.json")
    before = gpu_state.load(tmp_path / "gpu.json")
    token = ctl.apply(ClockPolicy.parse("locked:1500,power:400"))
    mid = gpu_state.load(tmp_path / "gpu.json")
    assert {g.sm_clock_locked_mhz for g in mid.gpus} == {1500}
    assert {g.power_limit_w for g in mid.gpus} == {400}
    (s0, *_) = ctl.sample(own_pids={1})
    assert s0.sm_clock_mhz <= 1500 and "applications_clocks_setting" in s0.throttle_reasons
    ctl.restore(token)
    assert gpu_state.load(tmp_path / "gpu.json") == before
    assert ctl.apply(ClockPolicy.parse("default")) is None


def test_clock_restored_after_server_crash(tmp_path, sim_repo, ray_session):
    repo, _ = sim_repo
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST,
                                   "clock=power:350", "target.fault=crash_after:1"])
    assert trial_cmd.run(cfg) == 1
    (row,) = RunStore.open(_runs(tmp_path)[0] / "trials.db").trials()
    assert row.outcome is Outcome.CRASHED
    state = gpu_state.load(_node_state(tmp_path))
    assert {g.power_limit_w for g in state.gpus} == {600}  # restored to the node's own limit


def test_clock_policy_changes_the_measurement(tmp_path, sim_repo, ray_session):
    repo, _ = sim_repo
    values = {}
    for clock in ("default", "locked:1200"):
        cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST,
                                       f"clock={clock}"])
        assert trial_cmd.run(cfg) == 0
        (row,) = RunStore.open(_runs(tmp_path)[-1] / "trials.db").trials()
        values[clock] = row.result.value("verify_ms")
        fp = row.result.fingerprint
        assert fp["clock_policy"] == clock
        assert fp["telemetry"]["n_samples"] > 0
        assert fp["gpu"]["driver_version"] and len(fp["gpu"]["gpus"]) == 8
    assert values["locked:1200"] > 1.3 * values["default"]


def test_foreign_process_marks_trial_suspect(tmp_path, sim_repo, ray_session):
    repo, _ = sim_repo
    path = _node_state(tmp_path)
    path.parent.mkdir(parents=True)
    st = gpu_state.default_state().with_gpu(
        3, processes=(gpu_state.GpuProcess(pid=4242, name="python3", used_memory_mib=2048),))
    gpu_state.save(path, st)
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST])
    assert trial_cmd.run(cfg) == 0
    (row,) = RunStore.open(_runs(tmp_path)[0] / "trials.db").trials()
    assert row.suspect and "4242" in row.result.suspect_reason
    assert row.result.fingerprint["telemetry"]["foreign_pids"] == [4242]


def test_compare_measures_the_reference_configuration_not_the_command_line(tmp_path, sim_repo,
                                                                           ray_session):
    """The issue's case: a trial with target.speculative_num_steps=4, then a plain compare. It
    re-measures steps=4 (and the reference's bench settings): never "system level"; an
    override that changes the configuration is refused before anything is written.

    The reference is one restart and the node runs without restart noise: with it, a lone
    reference restart 4% off its mean reads "not reproduced" at 99% about one run in fifty,
    an honest answer about noise, not the configuration under test (which the compare adopts,
    restart noise included, so a wrong configuration would still show)."""
    repo, shas = sim_repo
    base = [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST]
    assert trial_cmd.run(compose_settings("trial", [*base, f"commit={shas[0]}", "run_id=ref",
                                                  "target.speculative_num_steps=4",
                                                  "target.noise_restart_cv=0"])) == 0
    cfg = compose_settings("compare", ["target=sim", f"repo={repo}",
                                     f"runs_dir={tmp_path / 'runs'}", "reference=ref", "run_id=cmp"])
    code = compare_cmd.run(cfg)
    doc = json.loads((tmp_path / "runs" / "cmp" / "findings.json").read_text())
    assert doc["verdict"] != "not_reproduced", doc["message"]
    assert "system level" not in doc["message"]
    assert (code, doc["verdict"]) in ((0, "reproduced"), (3, "unresolved"))
    (row, *_) = RunStore.open(tmp_path / "runs" / "cmp" / "trials.db").trials()
    command = (Path(row.log_path).parent / "command.txt").read_text()
    assert "--speculative-num-steps 4" in command and "--sim-noise-restart-cv 0" in command
    from orchestrator.errors import UserError

    with pytest.raises(UserError, match="speculative_num_steps=3"):
        compare_cmd.run(compose_settings("compare", [*base, "reference=ref", "run_id=cmp2",
                                                   "target.speculative_num_steps=3"]))
    assert not (tmp_path / "runs" / "cmp2").exists()


def test_thermally_throttled_trial_is_suspect(tmp_path, sim_repo, ray_session):
    repo, _ = sim_repo
    path = _node_state(tmp_path)
    path.parent.mkdir(parents=True)
    gpu_state.save(path, gpu_state.default_state().with_gpu(2, temperature_c=93))
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST])
    assert trial_cmd.run(cfg) == 0
    (row,) = RunStore.open(_runs(tmp_path)[0] / "trials.db").trials()
    assert row.suspect and "thermal" in row.result.suspect_reason


def test_suspect_trial_does_not_flip_a_bisect_decision():
    from orchestrator.strategies.base import Observation
    from orchestrator.strategies.bisect import BisectStrategy

    clean = [Observation(0, 19.0 + 0.2 * (i % 3), trial_id=i) for i in range(4)] + [
        Observation(9, 29.0 + 0.2 * (i % 3), trial_id=10 + i) for i in range(4)] + [
        Observation(p, 19.1 if p < 6 else 29.1, trial_id=100 + p) for p in (2, 4, 5, 6, 7)]
    # A throttled restart of a good commit measured like a bad one: marked suspect.
    noisy = [*clean, Observation(3, 31.0, suspect=True, trial_id=500)]
    a = BisectStrategy(10).verdict(clean)
    b = BisectStrategy(10).verdict(noisy)
    trusted = BisectStrategy(10).verdict([*clean, Observation(3, 31.0, trial_id=500)])
    assert max(a.posterior) > 0.5  # the clean evidence already points somewhere
    assert trusted.posterior != a.posterior  # the same value, not suspect, would move it
    assert a.posterior == b.posterior
    assert [c.point for c in a.culprits] == [c.point for c in b.culprits]


def _reference(**target) -> dict:
    from orchestrator.records import Candidate

    return {"candidate": Candidate.make("a" * 40, env={"NCCL_PROTO": "LL128"}),
            "config": {"target": {**as_dict(compose_settings("compare", []).target), **target},
                       "bench": as_dict(compose_settings("compare", []).bench)}}


def test_reference_configuration_is_adopted_and_a_changing_override_refused():
    from orchestrator.errors import UserError
    from orchestrator.system.redact import REDACTED

    ref = _reference(speculative_num_steps=4, extra_args=["--api-key", REDACTED])
    with pytest.raises(UserError, match="secret that was not recorded"):
        compare_cmd.adopt_reference_config(compose_settings("compare", []), ref)
    cfg = compose_settings("compare", ["target.extra_args=[--api-key,k3y]"])
    adopted_cfg, adopted = compare_cmd.adopt_reference_config(cfg, ref)
    assert "target.speculative_num_steps=4" in adopted
    assert adopted_cfg.target.speculative_num_steps == 4
    assert list(adopted_cfg.target.extra_args)[1] == "k3y"
    assert cfg.target.speculative_num_steps is None  # the settings given are not changed
    for override, needle in (("target.speculative_num_steps=3", "speculative_num_steps=3"),
                             ("env.NCCL_PROTO=Simple", "env"), ("clock=power:300", "clock"),
                             ("bench.output_len=7", "bench.output_len=7")):
        with pytest.raises(UserError, match=needle):
            compare_cmd.adopt_reference_config(
                compose_settings("compare", ["target.extra_args=[--api-key,k3y]", override]), ref)
    same = compose_settings("compare", ["target.extra_args=[--api-key,k3y]",
                                      "target.speculative_num_steps=4", "env.NCCL_PROTO=LL128"])
    compare_cmd.adopt_reference_config(same, ref)  # agreeing overrides are fine
    other = _reference()
    other["config"]["target"] = {"name": "command", "bench": "x"}
    with pytest.raises(UserError, match="target=command"):
        compare_cmd.adopt_reference_config(compose_settings("compare", []), other)
