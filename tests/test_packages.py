"""The packages factor without servers: pins, candidates, differences, overlays (real pip, from a
wheel directory built here), the probe of what a Python process imports, and the sim's view of
its packages and what NCCL's version costs in its model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from pkgwheels import build_test_wheels

from orchestrator.config.compose import compose_settings
from orchestrator.config.requests import BisectRequest
from orchestrator.errors import UserError
from orchestrator.packages import trial as pkg_trial
from orchestrator.packages.overlay import OverlayCache, OverlayError, OverlaySet, OverlaySettings
from orchestrator.packages.probe import mapped_libraries, python_invocation, report_of_command
from orchestrator.records import Candidate
from orchestrator.sim_scenarios.presets import EAGLE_LAUNCH, effects_of
from orchestrator.system.differences import apply, changes_between, changes_from_system, level_of
from orchestrator.system.fingerprint_diff import diff
from orchestrator.targets.sim import model
from orchestrator.targets.sim import packages as sim_packages
from orchestrator.targets.sim.gpu_state import default_state
from orchestrator.util.pins import parse_pin, pins_of


@pytest.fixture(scope="session")
def wheels(tmp_path_factory) -> Path:
    """Two versions of one small package built with `pip wheel`, offline, and a simulated
    NCCL wheel: once per session."""
    return build_test_wheels(tmp_path_factory.mktemp("wheels"))


def _settings(root: Path, wheels: Path, **kw) -> OverlaySettings:
    return OverlaySettings(str(root), find_links=(str(wheels),), **kw)


# -- pins, candidates, configuration ----------------------------------------------------------
def test_pins_are_exact_and_normalized():
    assert parse_pin("Flashinfer_Python==0.2.3") == ("flashinfer-python", "0.2.3")
    assert pins_of(["b==1", "A.b==2.9.1+cu128"]) == {"a-b": "2.9.1+cu128", "b": "1"}
    for bad in ("torch>=2.0", "torch", "torch==", "torch===2", "x y==1", "torch==2.0; os"):
        with pytest.raises(UserError):
            parse_pin(bad)
    with pytest.raises(UserError, match="pinned twice"):
        pins_of(["a==1", "A==2"])


def test_a_candidate_without_pins_keeps_its_key():
    plain = Candidate.make("a" * 40, env={"X": "1"})
    assert "packages" not in plain.to_json()
    pinned = Candidate.make("a" * 40, env={"X": "1"}, packages=["Torch==2.9.1"])
    assert pinned.packages == ("torch==2.9.1",) and pinned.key != plain.key
    assert Candidate.from_json(pinned.to_json()) == pinned
    assert "torch==2.9.1" in pinned.label
    # The key of a plain candidate is the hash of exactly the document it had before pins.
    import hashlib

    doc = {"commit": "a" * 40, "patches": [], "env": {"X": "1"}, "clock": "default"}
    assert plain.key == hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def test_pins_on_the_command_line():
    cfg = compose_settings("bisect", ["packages=[flashinfer-python==0.2.3,torch==2.9.1]",
                                    "packages.find_links=/tmp"])
    assert list(cfg.packages.pins) == ["flashinfer-python==0.2.3", "torch==2.9.1"]
    assert cfg.packages.find_links == "/tmp"
    cfg = compose_settings("isolate", ["good.packages=[nvidia-nccl-cu12==2.27.5]",
                                     "bad.packages=nvidia-nccl-cu12==2.28.3"])
    assert list(cfg.good["packages"]) == ["nvidia-nccl-cu12==2.27.5"]
    assert list(cfg.bad["packages"]) == ["nvidia-nccl-cu12==2.28.3"]


# -- the difference model ---------------------------------------------------------------------
def test_package_changes_between_specs():
    good, changes = changes_between({"packages": ["a==1", "b==1"]},
                                    {"packages": ["a==2", "c==3"]})
    assert [(c.factor, c.key, c.good, c.bad) for c in changes] == [
        ("package", "a", "1", "2"), ("package", "b", "1", None), ("package", "c", None, "3")]
    assert changes[1].label == "b: 1 -> as the node has it"

    def same(ref: str) -> str:
        return "0" * 40

    only_a = apply(good, changes, [0], same)
    assert only_a.package_dict == {"a": "2", "b": "1"}
    assert [level_of(c, only_a, same) for c in changes] == [True, False, False]
    assert apply(good, changes, [0, 1, 2], same).package_dict == {"a": "2", "c": "3"}


def test_fingerprint_package_changes_are_controllable_when_the_reference_had_them():
    ref = {"packages": {"nvidia-nccl-cu12": "2.27.5", "rich": "13.9.4", "sleuth": "0.1.0"}}
    now = {"packages": {"nvidia-nccl-cu12": "2.28.3", "rich": "13.9.4", "extra": "1.0",
                        "sleuth": "0.2.0"}}
    diffs = {d.key: d for d in diff(ref, now)}
    assert diffs["nvidia-nccl-cu12"].controllable and diffs["nvidia-nccl-cu12"].category == "nccl"
    assert not diffs["extra"].controllable and "not remove" in diffs["extra"].detail
    assert not diffs["sleuth"].controllable  # an overlay of the tool would replace the tool
    (change,) = changes_from_system(diffs.values())
    assert (change.factor, change.key, change.good, change.bad) == \
        ("package", "nvidia-nccl-cu12", "2.27.5", None)
    assert change.label == "nvidia-nccl-cu12: 2.27.5 -> 2.28.3" and change.kind == "package"


def test_pinned_packages_are_not_a_system_change():
    from orchestrator.records import Outcome, TrialResult
    from orchestrator.store import TrialRow
    from orchestrator.system.watch import SystemWatch

    def row(i: int, cand: Candidate, pkgs: dict) -> TrialRow:
        result = TrialResult(Outcome.OK, fingerprint={"packages": pkgs, "gpu": {}})
        return TrialRow(i, i, cand, "local-0", "isolate", 1, "done", Outcome.OK, "", 0.0, 1.0,
                        "", False, result)

    watch = SystemWatch()
    plain = Candidate.make("0" * 40)
    pinned = Candidate.make("0" * 40, packages=["nvidia-nccl-cu12==2.27.5"])
    assert watch.feed(row(1, plain, {"nvidia-nccl-cu12": "2.28.3", "rich": "1"})) is None
    assert watch.feed(row(2, pinned, {"nvidia-nccl-cu12": "2.27.5", "rich": "1"})) is None
    change = watch.feed(row(3, plain, {"nvidia-nccl-cu12": "2.28.3", "rich": "2"}))
    assert change is not None and [d.key for d in change.differences] == ["rich"]


# -- overlays ---------------------------------------------------------------------------------
def test_overlay_is_built_once_and_reused(tmp_path, wheels):
    cache = OverlayCache(_settings(tmp_path / "ov", wheels))
    first = cache.ensure("slowimp==2.0")
    assert first.version == "2.0" and (first.path / "slowimp" / "__init__.py").is_file()
    again = OverlayCache(_settings(tmp_path / "ov", wheels)).ensure("slowimp==2.0")
    assert again == first
    nccl = cache.ensure("nvidia-nccl-cu12==2.27.5")
    assert nccl.lib_dirs == ("nvidia/nccl/lib",) and nccl.libraries == ("libnccl.so.2",)
    held = OverlaySet.lease(_settings(tmp_path / "ov", wheels),
                            {"slowimp": "2.0", "nvidia-nccl-cu12": "2.27.5"}, sys.executable)
    got = held.variables({"PYTHONPATH": "/mine", "LD_LIBRARY_PATH": "/usr/lib/x"})
    assert got["PYTHONPATH"].split(os.pathsep) == [str(nccl.path), str(first.path), "/mine"]
    assert got["LD_LIBRARY_PATH"].split(os.pathsep) == [str(nccl.path / "nvidia/nccl/lib"),
                                                        "/usr/lib/x"]
    held.release()


def test_an_unresolvable_pin_fails_with_pips_reason_in_one_line(tmp_path, wheels):
    cache = OverlayCache(_settings(tmp_path / "ov", wheels))
    with pytest.raises(OverlayError) as info:
        cache.ensure("slowimp==3.0")
    assert "\n" not in str(info.value)
    assert "satisfies the requirement slowimp==3.0" in str(info.value)
    assert not [p for p in (tmp_path / "ov").iterdir() if p.name.startswith(".tmp-")]
    assert cache.entries() == []


def test_only_the_configured_sources_are_searched(tmp_path, wheels, monkeypatch):
    """A user's shell may name pip sources of its own (PIP_FIND_LINKS, PIP_INDEX_URL): with
    packages.find_links given, the overlay comes from there alone, as its cache key and the
    findings say, never from a directory the run did not record."""
    from orchestrator.packages.wheels import write_wheel

    elsewhere = tmp_path / "elsewhere"
    write_wheel(elsewhere, "slowimp", "3.0", {"slowimp/__init__.py": "__version__ = '3.0'\n"})
    monkeypatch.setenv("PIP_FIND_LINKS", str(elsewhere))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", elsewhere.as_uri())
    cache = OverlayCache(_settings(tmp_path / "ov", wheels))
    with pytest.raises(OverlayError, match="satisfies the requirement slowimp==3.0"):
        cache.ensure("slowimp==3.0")
    assert cache.ensure("slowimp==2.0").version == "2.0"


def test_two_builders_of_one_overlay_build_it_once(tmp_path, wheels):
    settings = _settings(tmp_path / "ov", wheels)
    calls, lock = [], threading.Lock()
    real_pip = OverlayCache._pip

    def counting(self, *args):
        with lock:
            calls.append(args)
        return real_pip(self, *args)

    results: list = []
    barrier = threading.Barrier(3)

    def build() -> None:
        barrier.wait()
        results.append(OverlayCache(settings).ensure("slowimp==1.0"))

    OverlayCache._pip = counting
    try:
        threads = [threading.Thread(target=build) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        OverlayCache._pip = real_pip
    assert len(calls) == 1 and len({r.path for r in results}) == 1 and len(results) == 3
    assert sorted(p.name for p in (tmp_path / "ov").iterdir() if not p.name.startswith(".")) \
        == [results[0].path.name]


def test_the_cache_cap_removes_the_least_recently_used_but_never_a_held_one(tmp_path, wheels):
    root = tmp_path / "ov"
    unbounded = OverlayCache(_settings(root, wheels))
    a = unbounded.ensure("slowimp==1.0")
    b = unbounded.ensure("slowimp==2.0")
    os.utime(unbounded._state_path(a.path.name), (1, 1))  # a: used long ago
    held = OverlaySet.lease(_settings(root, wheels), {"slowimp": "1.0"}, sys.executable)
    try:  # leasing marked it used now, so b is the oldest; hold a and age it again
        os.utime(unbounded._state_path(a.path.name), (1, 1))
        os.utime(unbounded._state_path(b.path.name), (2, 2))
        capped = OverlayCache(_settings(root, wheels, max_bytes=a.size_bytes))
        assert capped.evict() == [b.path.name]  # a is older, but a trial holds it
    finally:
        held.release()
    assert a.path.is_dir() and not b.path.exists()


# -- what a process imported ------------------------------------------------------------------
def test_python_invocation_reads_the_flags_that_change_sys_path():
    assert python_invocation(["/v/bin/python", "-u", "server.py"], "/w") == (["/v/bin/python"],
                                                                             "/w")
    assert python_invocation(["numactl", "-N0", "python3", "-I", "-m", "x"], "/w") == (
        ["python3", "-I"], "-")
    assert python_invocation(["python", "-sE", "-m", "x"], "/w") == (["python", "-Es"], "/w")
    assert python_invocation(["bash", "-c", "python x.py"], "/w") is None
    # letters joined with -m / -c, and options that take a value
    assert python_invocation(["python", "-Im", "x"], "/w") == (["python", "-I"], "-")
    assert python_invocation(["python", "-sc", "print(1)"], "/w") == (["python", "-s"], "/w")
    assert python_invocation(["python", "-X", "importtime", "-m", "x"], "/w") == (["python"], "/w")
    assert python_invocation(["python", "-m", "x", "-I"], "/w") == (["python"], "/w")


def test_the_probe_sees_what_the_interpreter_imports(tmp_path, wheels):
    held = OverlaySet.lease(_settings(tmp_path / "ov", wheels), {"slowimp": "2.0"},
                            sys.executable)
    try:
        env = {**os.environ, **held.variables({})}
        report = report_of_command([sys.executable, "bench.py"], env, str(tmp_path),
                                   ["slowimp"], sys.executable)
        assert report["packages"]["slowimp"]["version"] == "2.0"
        assert pkg_trial.problems_of(held, report) == []
        # The same command in isolated mode ignores PYTHONPATH: the pin does not take effect.
        isolated = report_of_command([sys.executable, "-I", "bench.py"], env, str(tmp_path),
                                     ["slowimp"], sys.executable)
        assert isolated["packages"]["slowimp"] is None
        (why,) = pkg_trial.problems_of(held, isolated)
        assert why.startswith("slowimp==2.0 requested but the server imports no slowimp")
        # A module of that name earlier on sys.path (the script's directory) shadows it.
        (tmp_path / "slowimp.py").write_text("")
        shadowed = report_of_command([sys.executable, "bench.py"], env, str(tmp_path),
                                     ["slowimp"], sys.executable)
        (why,) = pkg_trial.problems_of(held, shadowed)
        assert "module slowimp is imported from" in why and "not from the overlay" in why
    finally:
        held.release()


def test_mapped_libraries_reads_proc_maps():
    proc = subprocess.Popen([sys.executable, "-c", "import ssl, time; time.sleep(30)"])
    try:
        import time

        deadline = time.monotonic() + 10
        found = {}
        while not found and time.monotonic() < deadline:
            found = mapped_libraries([proc.pid], ["libssl.so.3", "libssl.so.1.1"])
            time.sleep(0.1)
    finally:
        proc.kill()
        proc.wait()
    if not found:
        pytest.skip("this Python's ssl module does not map a libssl")
    assert all(p.startswith("/") for paths in found.values() for p in paths)


def test_a_library_loaded_from_elsewhere_is_a_mismatch(tmp_path, wheels):
    held = OverlaySet.lease(_settings(tmp_path / "ov", wheels), {"nvidia-nccl-cu12": "2.27.5"},
                            sys.executable)
    try:
        (o,) = held.overlays
        report = {"source": "t", "packages": {"nvidia-nccl-cu12": {
            "version": "2.27.5", "location": str(o.path), "modules": {}}},
            "libraries": {"libnccl.so.2": ["/usr/lib/x86_64-linux-gnu/libnccl.so.2"]}}
        (why,) = pkg_trial.problems_of(held, report)
        assert "libnccl.so.2 is loaded from /usr/lib/x86_64-linux-gnu" in why
        fp = {"packages": {"nvidia-nccl-cu12": "2.28.3", "torch": "2.9.1"}}
        pkg_trial.record(fp, held, report)
        assert fp["packages"] == {"nvidia-nccl-cu12": "2.27.5", "torch": "2.9.1"}
        assert fp["overlay"]["pins"] == ["nvidia-nccl-cu12==2.27.5"]
        assert fp["key_versions"]["nvidia-nccl-cu12"] == "2.27.5"
    finally:
        held.release()


# -- the sim's packages and what NCCL costs -----------------------------------------------------
def test_the_sim_loads_nccl_from_ld_library_path_not_from_pythonpath(tmp_path, wheels):
    held = OverlaySet.lease(_settings(tmp_path / "ov", wheels),
                            {"nvidia-nccl-cu12": "2.27.5", "slowimp": "1.0"}, sys.executable)
    try:
        node = {"nvidia-nccl-cu12": "2.28.3", "torch": "2.9.1", "slowimp": "0.9"}
        both = sim_packages.find(held.variables({}), node)
        assert both.nccl_version == "2.27.5"
        assert both.packages["slowimp"].version == "1.0"  # PYTHONPATH first
        assert both.packages["torch"] == sim_packages.Found("2.9.1", sim_packages.NODE)
        python_only = sim_packages.find({"PYTHONPATH": held.variables({})["PYTHONPATH"]}, node)
        assert python_only.nccl_version == "2.28.3"  # the node's libnccl, as torch finds it
        assert python_only.report()["packages"]["nvidia-nccl-cu12"]["version"] == "2.28.3"
        assert sim_packages.find({}, {}).nccl_version is None  # the GPU state's system NCCL
    finally:
        held.release()


def test_nccl_228_costs_verify_time_in_the_sims_model():
    effects = effects_of({"verify_mult": 1.0, "verify_cuda_graph": True})
    times = {}
    for version in ("2.27.5", "2.28.3", "2.28.7"):
        state = default_state()
        state = type(state)(state.gpus, nccl_version=version)
        times[version] = model.predict(EAGLE_LAUNCH, {}, state, effects).verify_ms
    assert times["2.28.3"] / times["2.27.5"] - 1 > 0.08
    assert times["2.28.7"] <= times["2.27.5"]


# -- every candidate of a run under a fixed overlay ----------------------------------------------
def test_a_bisect_runs_every_candidate_under_the_fixed_overlay(tmp_path, wheels):
    from conftest import make_sim_repo

    from orchestrator.commands import bisect

    shas = make_sim_repo(tmp_path / "repo", [{}, {}, {"verify_mult": 1.5}])
    cfg = compose_settings("bisect", [f"repo={tmp_path / 'repo'}", f"good={shas[0]}",
                                    f"bad={shas[2]}", f"runs_dir={tmp_path / 'runs'}", "target=sim",
                                    "packages=[slowimp==2.0]", f"packages.find_links={wheels}"])
    from orchestrator.commands import common

    common.check_common(cfg)
    _, points, _ = bisect.plan(cfg, BisectRequest.stored(cfg))
    assert [p.commit for p in points] == shas and {p.packages for p in points} == {
        ("slowimp==2.0",)}
    assert not (tmp_path / "runs").exists() or not [
        p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]


def test_a_sweep_keeps_the_fixed_overlay():
    from orchestrator.strategies.sweep.space import SearchSpace

    space = SearchSpace.from_conf({"name": "s", "params": {
        "NCCL_PROTO": {"kind": "env", "values": ["LL", "Simple"]}}})
    base = Candidate.make("0" * 40, packages=["torch==2.9.1"])
    cand = space.candidate(base, {"NCCL_PROTO": "LL"}, {})
    assert cand.packages == ("torch==2.9.1",) and cand.env_dict == {"NCCL_PROTO": "LL"}


def test_compare_refuses_pins_that_change_the_reference():
    from orchestrator.commands import compare

    ref = {"candidate": Candidate.make("a" * 40, packages=["torch==2.9.1"]), "config": {}}
    compare.adopt_reference_config(compose_settings("compare", ["packages=[torch==2.9.1]"]), ref)
    with pytest.raises(UserError, match=r"packages=\[torch==2\.8\.0\] \(the reference ran "
                                        r"torch==2\.9\.1\)"):
        compare.adopt_reference_config(compose_settings("compare", ["packages=[torch==2.8.0]"]),
                                       ref)
