"""The system watch: changes of a node's settled state between trials, from a real store."""

from __future__ import annotations

import copy

import pytest

from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.store import RunStore
from orchestrator.system.watch import SystemWatch, system_changes, system_differences


def _fingerprint(**changes) -> dict:
    fp = {
        "git": {"sha": "a" * 40, "patches": {}},
        "env": {"server": {"NCCL_PROTO": "LL128"}},
        "python": "3.11.9",
        "packages": {"torch": "2.9.1", "flashinfer-python": "0.5.2"},
        "host": {"kernel": "6.8.0", "boot_id": "b1", "hostname": "gpu-node-1"},
        "gpu": {"driver_version": "590.48.01", "cuda_driver_version": 13010,
                "nccl_version": "2.27.3",
                "gpus": [{"index": i, "name": "H200", "power_limit_w": 700,
                          "sm_clock_locked_mhz": None, "pcie_gen": 5, "processes": []}
                         for i in range(2)]},
    }
    for path, value in changes.items():
        node = fp
        *parents, leaf = path.split("__")
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[leaf] = value
    return fp


@pytest.fixture()
def store(tmp_path):
    s = RunStore.create(tmp_path / "trials.db", run_id="w", command="bisect", config_yaml="{}")
    yield s
    s.close()


def _trial(store: RunStore, fp: dict | None, *, node: str = "local-0", commit: str = "a",
           clock: str = "default", outcome: Outcome = Outcome.OK, phase: str = "search") -> int:
    cand = Candidate.make(commit * 40, clock=clock)
    tid = store.begin_trial(store.candidate_id(cand), node=node, phase=phase)
    reps = (Measurement(0, {"verify_ms": 19.0}),) if outcome == Outcome.OK else ()
    store.finish_trial(tid, TrialResult(outcome, measurements=reps, node=node,
                                        fingerprint=fp or {}))
    return tid


def test_a_driver_upgrade_between_trials_is_reported_where_it_happened(store):
    first = _trial(store, _fingerprint())
    second = _trial(store, _fingerprint(commit="b"), commit="b")
    third = _trial(store, _fingerprint(gpu__driver_version="595.10.02"), commit="c")
    _trial(store, _fingerprint(gpu__driver_version="595.10.02"), commit="d")
    (change,) = system_changes(store.trials())
    assert first < second and (change.before, change.after) == (second, third)
    assert change.node == "local-0"
    assert [d.key for d in change.differences] == ["driver_version"]
    assert "590.48.01 -> 595.10.02" in change.message and "local-0" in change.message


def test_code_env_and_unsettled_readings_are_not_system_changes(store):
    """Candidates differ in code and env on purpose; PCIe link speed drops at idle, foreign
    processes come and go (telemetry marks those trials), a reboot alone changes nothing."""
    _trial(store, _fingerprint())
    moved = _fingerprint(gpu__gpus__0__pcie_gen=1, host__boot_id="b2", host__hostname="other")
    moved["git"]["sha"] = "b" * 40
    moved["env"]["server"]["NCCL_PROTO"] = "Simple"
    moved["gpu"]["gpus"][1]["processes"] = [{"pid": 4242, "name": "python",
                                              "used_memory_mib": 900}]
    _trial(store, moved, commit="b")
    assert system_changes(store.trials()) == []


def test_a_clock_policy_a_trial_asks_for_is_not_a_change_but_an_outside_one_is(store):
    _trial(store, _fingerprint())
    _trial(store, _fingerprint(gpu__gpus__0__power_limit_w=450, gpu__gpus__1__power_limit_w=450),
           clock="power:450")
    _trial(store, _fingerprint())  # policy restored: like the last default trial
    assert system_changes(store.trials()) == []
    outside = _trial(store, _fingerprint(gpu__gpus__0__power_limit_w=500,
                                         gpu__gpus__1__power_limit_w=500))
    (change,) = system_changes(store.trials())
    assert change.after == outside and [d.key for d in change.differences] == ["power_limit_w"]
    assert (change.differences[0].reference, change.differences[0].now) == (700, 500)


def test_nodes_are_watched_separately_and_failed_reads_are_not_changes(store):
    """Nodes of a cluster may differ from each other; that is not a change over time. A trial
    that failed before its fingerprint, or whose GPU read failed, is skipped for the GPU part."""
    _trial(store, _fingerprint(), node="local-0")
    _trial(store, _fingerprint(packages={"torch": "2.8.0"}), node="local-1")
    _trial(store, _fingerprint(gpu__gpus__1__power_limit_w=None, gpu__driver_version=""),
           node="local-0")
    _trial(store, None, node="local-0", outcome=Outcome.PREPARE_FAILED)
    _trial(store, _fingerprint(gpu={}), node="local-0")
    _trial(store, _fingerprint(), node="local-0")
    _trial(store, _fingerprint(packages={"torch": "2.8.0"}), node="local-1")
    assert system_changes(store.trials()) == []
    later = _trial(store, _fingerprint(packages={"torch": "2.9.1", "triton": "3.5.0"}),
                   node="local-1")
    (change,) = system_changes(store.trials())
    assert (change.node, change.after) == ("local-1", later)
    assert {d.key for d in change.differences} == {"torch", "triton"}


def test_a_trial_stopped_before_its_fingerprint_was_read_is_not_a_change(store):
    """A trial stopped between launch and the fingerprint (a full disk, Ctrl-C) keeps only what
    its teardown wrote: no package listing, no host. Compared as read, every installed package
    would be "unset -> version" on the next trial."""
    _trial(store, _fingerprint())
    _trial(store, {"teardown": {"signal": "SIGTERM", "exit_code": 0, "clean": True},
                   "telemetry": {"suspect": False}}, outcome=Outcome.INTERRUPTED)
    _trial(store, _fingerprint())
    assert system_changes(store.trials()) == []
    later = _trial(store, _fingerprint(packages={"torch": "2.9.1"}))
    (change,) = system_changes(store.trials())
    assert change.after == later and [d.key for d in change.differences] == ["flashinfer-python"]


def test_reference_trials_measure_the_old_system_on_purpose(store):
    """A run that replays the reference (the node as it was then) before its own trials."""
    _trial(store, _fingerprint(gpu__driver_version="580.1"), phase="reference")
    _trial(store, _fingerprint())
    _trial(store, _fingerprint(gpu__driver_version="580.1"), phase="reference")
    _trial(store, _fingerprint())
    assert system_changes(store.trials()) == []


def test_incremental_feed_reports_each_change_once(store):
    watch = SystemWatch()
    _trial(store, _fingerprint())
    _trial(store, _fingerprint(python="3.12.1", host__kernel="6.8.1"))
    _trial(store, _fingerprint(python="3.12.1", host__kernel="6.8.1"))
    rows = store.trials()
    seen = [watch.feed(r) for r in rows]
    assert seen[0] is None and seen[2] is None
    assert {d.key for d in seen[1].differences} == {"python", "kernel"}
    assert watch.changes == [seen[1]]
    assert seen[1].to_json()["after_trial"] == rows[1].id


def test_differences_are_symmetric_in_what_they_name():
    before, after = _fingerprint(), copy.deepcopy(_fingerprint(gpu__nccl_version="2.28.0"))
    forward = system_differences(before, after)
    backward = system_differences(after, before)
    assert [d.key for d in forward] == [d.key for d in backward] == ["nccl_version"]
