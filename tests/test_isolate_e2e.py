"""`sleuth isolate` end to end on the sim: the seed replayed, and a patch set."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from orchestrator.commands import isolate as isolate_cmd
from orchestrator.commands import trial as trial_cmd
from orchestrator.config.compose import compose_config
from orchestrator.records import Outcome
from orchestrator.store import RunStore
from orchestrator.targets.sim.scenario import generate_scenario
from orchestrator.targets.simnode import set_node_state
from tests.conftest import kill_after_finished

pytestmark = pytest.mark.slow

FAST = ["target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=30", "nodes=2"]


def _set_nodes(tmp_path: Path, out: Path, when: str) -> None:
    for node in ("local-0", "local-1"):
        set_node_state(tmp_path / "runs" / ".nodes" / node,
                       gpu_state_file=out / f"{when}_gpu_state.json",
                       env_file=out / f"{when}_env.json", packages_file=out / f"{when}_packages.json")


def test_seed_replay_names_power_limit_and_nccl_proto(tmp_path, ray_session):
    sc = generate_scenario(tmp_path / "sc", 30, 4, "system_change")
    base = [f"repo={sc.repo}", f"runs_dir={tmp_path / 'runs'}", *FAST]
    _set_nodes(tmp_path, sc.out, "reference")
    assert trial_cmd.run(compose_config("trial", [*base, f"commit={sc.truth['bad']}",
                                                  "run_id=reference", "bench.repetitions=3"])) == 0
    _set_nodes(tmp_path, sc.out, "now")
    code = isolate_cmd.run(compose_config("isolate", [*base, "reference=reference",
                                                      "metric=verify_ms", "run_id=iso",
                                                      "experiment.params.all_env=true"]))
    run_dir = tmp_path / "runs" / "iso"
    doc = json.loads((run_dir / "findings-isolate.json").read_text())
    assert code == 0, doc["message"]
    named = {"clock" if d["factor"] == "clock" else d["key"]
             for f in doc["findings"] for d in f["differences"]}
    assert named == {"clock", "NCCL_PROTO"}, doc["message"]
    cleared = {c["key"] for c in doc["cleared"]}
    assert len(cleared) >= 25  # the harmless env vars
    clock = next(f for f in doc["findings"] if f["kind"] == "clock")
    assert clock["effect"]["verify_ms"]["ci"][0] > 10
    compare = json.loads((run_dir / "findings-compare.json").read_text())
    assert compare["verdict"] == "not_reproduced"
    assert (run_dir / "findings.json").exists()


def test_patch_set_single_and_pair(tmp_path, ray_session):
    sc = generate_scenario(tmp_path / "sc", 30, 8, "patch_set")
    patches = sorted((sc.out / "patches").glob("*.patch"))
    assert len(patches) == 12
    base = [f"repo={sc.repo}", f"runs_dir={tmp_path / 'runs'}", *FAST]
    listing = ",".join(str(p) for p in patches)
    code = isolate_cmd.run(compose_config("isolate", [
        *base, f"good.commit={sc.truth['bad']}", f"bad.patches=[{listing}]", "metric=verify_ms",
        "run_id=iso"]))
    doc = json.loads((tmp_path / "runs" / "iso" / "findings.json").read_text())
    assert code == 0, doc["message"]
    truth = sc.truth["patches"]
    found = [{Path(d["key"]).name for d in f["differences"]} for f in doc["findings"]]
    harmful = {Path(truth["harmful"]).name} if isinstance(truth["harmful"], str) else {
        Path(p).name for p in truth["harmful"]}
    pair = {Path(p).name for p in truth["pair"]}
    assert harmful in found and pair in found, (found, truth)


def test_kill_controller_then_resume_reuses_finished_trials(tmp_path, capsys):
    """An isolate killed mid-run (controller and servers) finishes with `sleuth resume`: every
    trial that had finished is evidence again, untouched; only what was cut short runs again."""
    sc = generate_scenario(tmp_path / "sc", 30, 3, "one_culprit")
    runs = tmp_path / "runs"
    good = sc.truth["good"]
    args = [sys.executable, "-m", "orchestrator", "isolate", f"repo={sc.repo}",
            f"runs_dir={runs}", "run_id=killme", f"good.commit={good}", f"bad.commit={good}",
            "good.env.HARMLESS=1", "good.clock=default", "bad.clock=power:450", *FAST]
    db = runs / "killme" / "trials.db"
    kill_after_finished(args, db, 6)
    store = RunStore.open(db)
    before = {r.id: (r.outcome, r.candidate.key) for r in store.trials() if r.finished}
    store.close()
    assert len(before) >= 6
    from orchestrator.cli import run as cli_run

    capsys.readouterr()
    assert cli_run(["resume", str(runs / "killme")]) == 0
    printed = capsys.readouterr().out
    assert f"resuming killme: {len(before)} finished trials reused" in printed
    store = RunStore.open(db)
    after = {r.id: (r.outcome, r.candidate.key) for r in store.trials()}
    assert all(after[tid] == seen for tid, seen in before.items())
    doc = json.loads((runs / "killme" / "findings.json").read_text())
    assert doc["verdict"] == "found"
    assert [f["kind"] for f in doc["findings"]] == ["clock"]
    assert [c["key"] for c in doc["cleared"]] == ["HARMLESS"]
    # The strategy's answer rests on every trial that ran to the end, the reused ones included
    # (the ones cut short by the kill are not evidence).
    cut = {r.id for r in store.trials() if r.outcome == Outcome.INTERRUPTED}
    assert not cut & set(before)
    assert doc["n_trials"] == len(after) - len(cut)
