"""A profiled trial end to end (real git repo, real sim server, real local Ray, real SQLite):
the trace is taken after the measured repetitions and kept, compressed, in the trial directory."""

from __future__ import annotations

from pathlib import Path

from orchestrator.commands import trial as trial_cmd
from orchestrator.config.compose import compose_settings
from orchestrator.evidence.capture import TRACE_NAME
from orchestrator.evidence.families import family
from orchestrator.evidence.trace import read_profile
from orchestrator.records import Outcome
from orchestrator.store import RunStore

FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "trial.ready_timeout_s=30", "trial.retries=0"]


def test_profiled_trial_keeps_its_trace(tmp_path, sim_repo, ray_session):
    repo, shas = sim_repo
    cfg = compose_settings("trial", [f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", *FAST,
                                   f"commit={shas[0]}", "bench.repetitions=2", "trial.profile=true"])
    assert trial_cmd.run(cfg) == 0
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(run_dir / "trials.db").trials()
    assert row.outcome is Outcome.OK, row.detail
    assert len(row.result.measurements) == 2  # profiling adds no repetition
    prof = row.result.fingerprint["profile"]
    assert "error" not in prof, prof
    trace = Path(row.log_path).parent / prof["trace"]
    assert trace.name == TRACE_NAME and trace.read_bytes()[:2] == b"\x1f\x8b"
    assert not (trace.parent / "profile-raw").exists()
    p = read_profile(trace.read_bytes())
    assert p.passes == prof["passes"] and p.passes["target_verify"] > 0
    assert {family(k) for k in p.per_pass("target_verify")} >= {"attention", "gemm", "allreduce"}
