"""Package versions as a factor, end to end: real pip overlays, real server processes, Ray.

On the sim, the node's NCCL wheel (its `packages.json`) is the one it loads unless an overlay
puts another first on LD_LIBRARY_PATH; an overlay that cannot reach the server is
`env_mismatch`. With `target=command`, a small package built here in two versions with `pip
wheel` (2.0 takes 80 ms longer to import) is what isolate must name.
"""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import git
from pkgwheels import build_test_wheels

from orchestrator.commands import compare as compare_cmd
from orchestrator.commands import isolate as isolate_cmd
from orchestrator.commands import trial as trial_cmd
from orchestrator.config.compose import compose_settings
from orchestrator.records import Outcome
from orchestrator.sim_scenarios.generate import generate_scenario
from orchestrator.store import RunStore
from orchestrator.targets.simnode import set_node_state

SIM_FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
            "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
            "bench.repetitions=2", "trial.ready_timeout_s=30", "trial.retries=0"]
BENCH = textwrap.dedent("""\
    import json, time
    t0 = time.perf_counter()
    import slowimp
    print(json.dumps({"value": (time.perf_counter() - t0) * 1000}))
""")


@pytest.fixture(scope="module")
def wheels(tmp_path_factory) -> Path:
    """Two versions of one small package built with `pip wheel`, offline, and a simulated
    NCCL wheel: once per module."""
    return build_test_wheels(tmp_path_factory.mktemp("e2e-wheels"))


def _rows(run_dir: Path):
    store = RunStore.open(run_dir / "trials.db")
    try:
        return store.trials()
    finally:
        store.close()


def test_sim_trial_under_an_overlay_and_one_that_never_reaches_the_server(
        tmp_path, sim_repo, wheels, ray_session):
    """The node has NCCL 2.28.3: a trial pinned to 2.27.5 loads the overlay's library (the
    sim reports it), records it, and measures a shorter verify than the node's own; on a node
    whose launcher drops LD_LIBRARY_PATH (as sudo does), the same pin is env_mismatch."""
    repo, shas = sim_repo
    node = tmp_path / "runs" / ".nodes" / "local-0"
    (tmp_path / "pkgs.json").write_text(json.dumps({"nvidia-nccl-cu12": "2.28.3", "torch": "2.9.1"}))
    set_node_state(node, packages_file=tmp_path / "pkgs.json")
    base = [f"repo={repo}", f"commit={shas[0]}", f"runs_dir={tmp_path / 'runs'}", *SIM_FAST,
            "target.noise_restart_cv=0.003", f"packages.find_links={wheels}"]
    assert trial_cmd.run(compose_settings("trial", [*base, "run_id=node"])) == 0
    assert trial_cmd.run(compose_settings("trial", [*base, "run_id=pinned",
                                                  "packages=[nvidia-nccl-cu12==2.27.5]"])) == 0
    (plain,), (pinned,) = _rows(tmp_path / "runs" / "node"), _rows(tmp_path / "runs" / "pinned")
    fp = pinned.result.fingerprint
    assert fp["packages"]["nvidia-nccl-cu12"] == "2.27.5"
    assert plain.result.fingerprint["packages"]["nvidia-nccl-cu12"] == "2.28.3"
    assert fp["overlay"]["imported"]["nvidia-nccl-cu12"]["version"] == "2.27.5"
    assert fp["overlay"]["libraries"]["libnccl.so.2"][0].startswith(
        fp["overlay"]["dirs"]["nvidia-nccl-cu12==2.27.5"])
    # The upgrade costs verify time: the node's own 2.28.3 against the overlay's 2.27.5.
    assert plain.result.value("verify_ms") / pinned.result.value("verify_ms") - 1 > 0.06
    (tmp_path / "launcher.json").write_text(json.dumps({"drop": ["LD_LIBRARY_PATH"]}))
    set_node_state(node, launcher_file=tmp_path / "launcher.json")
    assert trial_cmd.run(compose_settings("trial", [*base, "run_id=dropped",
                                                  "packages=[nvidia-nccl-cu12==2.27.5]"])) == 1
    (dropped,) = _rows(tmp_path / "runs" / "dropped")
    assert dropped.outcome is Outcome.ENV_MISMATCH and not dropped.result.measurements
    assert ("nvidia-nccl-cu12==2.27.5 requested but the server imports nvidia-nccl-cu12 2.28.3"
            in dropped.detail), dropped.detail


def _command_repo(path: Path) -> str:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "bench.py").write_text(BENCH)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "bench")
    return git(path, "rev-parse", "HEAD")


def test_command_isolate_names_the_package_version(tmp_path, wheels, ray_session):
    repo = tmp_path / "proj"
    _command_repo(repo)
    code = isolate_cmd.run(compose_settings("isolate", [
        "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", "run_id=iso",
        f"target.bench={sys.executable} bench.py", "metric=value", "direction=increase",
        "bench.repetitions=2", "bench.warmup_requests=0", "trial.retries=0", "nodes=2",
        "good.packages=[slowimp==1.0]", "bad.packages=[slowimp==2.0]", "bad.env.HARMLESS=1",
        f"packages.find_links={wheels}"]))
    doc = json.loads((tmp_path / "runs" / "iso" / "findings.json").read_text())
    assert code == 0, doc["message"]
    (finding,) = doc["findings"]
    assert finding["kind"] == "package" and finding["id"] == "slowimp"
    assert finding["summary"] == "slowimp: 1.0 -> 2.0"
    assert finding["effect"]["value"]["ci"][0] > 100  # +80 ms on an import of about 1 ms
    assert [c["key"] for c in doc["cleared"]] == ["HARMLESS"]
    for row in _rows(tmp_path / "runs" / "iso"):
        if row.outcome is Outcome.OK:
            want = row.candidate.package_dict["slowimp"]
            assert row.result.fingerprint["overlay"]["imported"]["slowimp"]["version"] == want


def test_command_server_that_drops_pythonpath_is_env_mismatch(tmp_path, wheels, ray_session):
    """The probe reads the server process itself: a server started through `env -u
    PYTHONPATH` never sees the overlay, whatever sleuth handed its launcher."""
    repo = tmp_path / "proj"
    sha = _command_repo(repo)
    code = trial_cmd.run(compose_settings("trial", [
        "target=command", f"repo={repo}", f"commit={sha}", f"runs_dir={tmp_path / 'runs'}",
        "run_id=t", f"target.server='env -u PYTHONPATH {sys.executable} -m http.server {{port}}"
        " --bind 127.0.0.1'", f"target.bench={sys.executable} bench.py", "metric=value",
        "bench.repetitions=1", "bench.warmup_requests=0", "trial.retries=0",
        "packages=[slowimp==2.0]", f"packages.find_links={wheels}"]))
    assert code == 1
    (row,) = _rows(tmp_path / "runs" / "t")
    assert row.outcome is Outcome.ENV_MISMATCH and not row.result.measurements
    assert "slowimp==2.0 requested but the server imports no slowimp" in row.detail, row.detail


def noisy_reference(tmp_path: Path, base: list[str]) -> str:
    """The run `reference` as a fingerprint file of an old, noisy session: two restarts 40%
    apart around its first verify_ms, so that no compare against it can decide."""
    ref = compare_cmd.load_reference(compose_settings("compare", base), "reference")
    v = ref["values"]["verify_ms"][0]
    path = tmp_path / "old-session.json"
    path.write_text(json.dumps({
        "candidate": ref["candidate"].to_json(), "fingerprint": ref["fingerprint"],
        "repo": ref["repo"], "config": ref["config"],
        "values": {"verify_ms": [0.8 * v, 1.2 * v]}}))
    return str(path)


@pytest.mark.e2e
@pytest.mark.parametrize("reference", ["run", "undecided"])
def test_sim_nccl_upgrade_isolate_names_the_package(tmp_path, ray_session, reference):
    """The `nccl_upgrade` story: since the reference the node's NCCL wheel went 2.27.5 ->
    2.28.3, xgrammar and safetensors were bumped and a variable dropped. `isolate reference=`
    with the node's old wheels names the NCCL package with its verify effect, clears xgrammar
    and the variable, and sets safetensors aside (its old wheel is not there) with pip's
    reason.

    `undecided`: the reference is a fingerprint file of two restarts 40% apart (an old, noisy
    session), so the compare cannot decide whatever "now" measures; the isolate tests the
    differences anyway (it measures the reference's configuration, recreated, against now),
    and the answer's total is that head-to-head, not the undecided compare. A reference of
    one restart lands here now and then by chance (its own noise stays in the compare)."""
    sc = generate_scenario(tmp_path / "sc", 20, 4, "nccl_upgrade")
    runs = tmp_path / "runs"

    def nodes(when: str) -> None:
        for name in ("local-0", "local-1"):
            set_node_state(runs / ".nodes" / name, gpu_state_file=sc.out / f"{when}_gpu_state.json",
                           env_file=sc.out / f"{when}_env.json",
                           packages_file=sc.out / f"{when}_packages.json",
                           launcher_file=sc.out / f"{when}_launcher.json")

    base = [f"repo={sc.repo}", f"runs_dir={runs}", *SIM_FAST, "nodes=2"]
    nodes("reference")
    assert trial_cmd.run(compose_settings("trial", [*base, f"commit={sc.truth['bad']}",
                                                  "run_id=reference"])) == 0
    given = noisy_reference(tmp_path, base) if reference == "undecided" else "reference"
    nodes("now")
    code = isolate_cmd.run(compose_settings("isolate", [
        *base, f"reference={given}", "run_id=iso",
        f"packages.find_links={sc.out / sc.truth['system']['wheels']}"]))
    doc = json.loads((runs / "iso" / "findings-isolate.json").read_text())
    # The package is the cause (0), or it is and the remainder against a three-restart
    # reference stays undecided (3: the reference's own noise is in the total; the one rule,
    # orchestrator/errors.py); never undecided with nothing named.
    assert code in (0, 3), doc["message"]
    (finding,) = doc["findings"]
    assert (finding["kind"], finding["id"]) == ("package", "nvidia-nccl-cu12")
    assert finding["summary"] == "nvidia-nccl-cu12: 2.27.5 -> 2.28.3"
    truth = next(c for c in sc.truth["system"]["changes"] if c.get("name") == "nvidia-nccl-cu12")
    lo, hi = finding["effect"]["verify_ms"]["ci"]
    assert lo > 3 and lo < truth["effect"]["verify_ms"]["pct"] < hi + 3
    assert {c["key"] for c in doc["cleared"]} == {"xgrammar", "TRANSFORMERS_VERBOSITY"}
    compare = json.loads((runs / "iso" / "findings-compare.json").read_text())
    answer = json.loads((runs / "iso" / "findings.json").read_text())["answer"]
    if reference == "undecided":
        assert compare["verdict"] == "unresolved"
        assert answer["total"]["pct"] == doc["total_effect"]["verify_ms"]["pct"]
        assert "against the reference's configuration recreated now" in answer["sentence"]
        assert "nvidia-nccl-cu12" in answer["sentence"], answer["sentence"]
    untested = {f["id"]: f["untested"] for f in compare["findings"]}
    assert untested["safetensors"].startswith("not tested: Could not find a version")
