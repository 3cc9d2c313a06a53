"""`sleuth sweep` end to end: real sim servers, real Ray, real Optuna storage, kill and resume."""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path

import optuna
import pytest

from orchestrator.cli import main as cli_main
from orchestrator.cli import run as cli_run
from orchestrator.commands import sweep
from orchestrator.config.compose import compose_settings
from orchestrator.control.drive import observation
from orchestrator.store import RunStore
from tests.conftest import kill_after_finished

FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=30"]
TINY = """\
defaults:
  - base_space
name: tiny
params:
  NCCL_PROTO:
    values: [null, LL]
  NCCL_P2P_LEVEL:
    values: [null, LOC, SYS]
"""


def _conf_dir(tmp_path: Path) -> Path:
    conf = tmp_path / "conf"
    (conf / "space").mkdir(parents=True)
    (conf / "space" / "tiny.yaml").write_text(TINY)
    return conf


def _evidence(rows, phase_prefix: str) -> list:
    """Final attempts of finished trials (a launch that failed and was retried is not one)."""
    final_attempt = 2  # trial.retries defaults to 1
    return [r for r in rows if (r.phase or "").startswith(phase_prefix)
            and observation(r, 0, "verify_ms", final_attempt) is not None]


@pytest.mark.e2e
def test_sweep_finds_faster_nccl_settings_on_sim(tmp_path, ray_session, sim_repo):
    repo, shas = sim_repo
    cfg = compose_settings("sweep", [
        f"repo={repo}", f"commit={shas[0]}", f"runs_dir={tmp_path / 'runs'}", "space=tiny",
        "metric=verify_ms", "trials=8", "nodes=2", "seed=1", "target.noise_restart_cv=0.005",
        "experiment.params.confirm_min_rounds=2", "experiment.params.confirm_rounds=3", *FAST,
    ], config_dir=_conf_dir(tmp_path))
    code = sweep.run(cfg)
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    doc = json.loads((run_dir / "findings.json").read_text())
    assert code == 0, doc["message"]
    assert doc["experiment"] == "sweep" and doc["verdict"] == "found"
    assert doc["direction"] == "minimize" and doc["space_size"] == 6
    top = doc["findings"][0]
    assert top["rank"] == 1 and top["kind"] == "env"
    assert top["config"].get("NCCL_P2P_LEVEL") != "LOC"  # P2P off is slower, never the best
    assert top["effect"]["verify_ms"]["ci"][1] < 0  # verify got faster, interval excludes 0
    # a 6-point space and 8 trials may measure too few configurations to rank the knobs; the
    # acceptance test checks the ranking on a real-sized space
    assert doc["importance_evaluator"] == "additive"
    if doc["n_configurations"] >= 4:
        assert set(doc["importance"]) == {"NCCL_PROTO", "NCCL_P2P_LEVEL"}
    else:
        assert not doc["importance"] and "at least" in doc["importance_note"]
    settings = doc["findings"][1:]
    assert settings and {f["parameter"] for f in settings} <= {"NCCL_PROTO", "NCCL_P2P_LEVEL"}
    for f in settings:  # each changed setting, with its main effect and interval
        shown = "unset" if f["level"] is None else f["level"]
        assert f["id"] == f"{f['parameter']}={shown}"
        lo, hi = f["effect"]["verify_ms"]["ci"]
        assert lo <= f["effect"]["verify_ms"]["pct"] <= hi
    store = RunStore.open(run_dir / "trials.db")
    rows = store.trials()
    assert len({r.node for r in rows}) == 2
    search = _evidence(rows, "sweep/search") + _evidence(rows, "sweep/baseline")
    assert len(search) == 8
    confirm = _evidence(rows, "sweep/confirm")
    assert {r.candidate.key for r in confirm} == {top["before_key"], top["after_key"]}
    for row in search:  # each trial's server really got the configuration's variables
        if row.outcome.measured:
            env = row.result.fingerprint.get("env", {}) if row.result else {}
            for name, value in row.candidate.env:
                assert env.get(name, value) == value
    study = optuna.load_study(study_name=run_dir.name,
                              storage=f"sqlite:///{run_dir / 'optuna.db'}")
    states = {t.state for t in study.trials}
    assert optuna.trial.TrialState.RUNNING not in states
    assert any(t.user_attrs.get("baseline") for t in study.trials)
    store.close()


@pytest.mark.e2e
def test_killed_sweep_resumes_without_repeating_trials(tmp_path, sim_repo):
    repo, shas = sim_repo
    runs = tmp_path / "runs"
    conf = _conf_dir(tmp_path)
    args = [sys.executable, "-m", "orchestrator", "sweep", "--config-dir", str(conf),
            f"repo={repo}", f"commit={shas[0]}", f"runs_dir={runs}", "space=tiny",
            "metric=verify_ms", "trials=10", "nodes=2", "run_id=killme",
            "experiment.params.confirm_min_rounds=2", "experiment.params.confirm_rounds=2",
            *FAST]
    db = runs / "killme" / "trials.db"
    kill_after_finished(args, db, 4, pause=0.3)
    store = RunStore.open(db)
    before = {r.id: (r.outcome, r.candidate.key, r.phase) for r in store.trials() if r.finished}
    store.close()
    assert len(before) >= 4
    code = cli_run(["sweep", f"runs_dir={runs}", "run_id=killme"])
    assert code in (0, 4)  # answered, or its two confirmation rounds decided neither way
    store = RunStore.open(db)
    rows = store.trials()
    after = {r.id: (r.outcome, r.candidate.key, r.phase) for r in rows}
    for tid, record in before.items():
        assert after[tid] == record  # untouched and still there
    searched = _evidence(rows, "sweep/search") + _evidence(rows, "sweep/baseline")
    assert len(searched) == 10  # the budget: nothing finished was measured again
    assert (runs / "killme" / "findings.json").is_file()
    with sqlite3.connect(runs / "killme" / "optuna.db") as conn:
        running = conn.execute("SELECT COUNT(*) FROM trials WHERE state = 'RUNNING'").fetchone()
    assert running == (0,)
    store.close()


def test_bad_input_exits_2_and_writes_nothing(tmp_path, capsys, sim_repo):
    repo, _ = sim_repo
    runs = tmp_path / "runs"
    for extra, message in (([], "space=NAME"),
                           (["space=nccl_pcie", "trials=3"], "too small"),
                           (["space=nccl_pcie", "sampler=bayes"], "sampler must be"),
                           (["space=nccl_pcie", "experiment.params.restart=2"], "restart"),
                           (["space=nccl_pcie", "metric=tok_s"], "unknown metric"),
                           (["space=spec_decode", "sampler=grid",
                             "space.params.cuda_graph_max_bs.values=[]",
                             "space.params.cuda_graph_max_bs.low=1"], "needs values")):
        with pytest.raises(SystemExit) as exc:
            cli_main(["sweep", "target=sim", f"repo={repo}", f"runs_dir={runs}", *extra])
        err = capsys.readouterr().err.strip()
        assert exc.value.code == 2 and message in err, err
        assert len(err.splitlines()) == 1
    assert not runs.exists()
