"""The trial spec a node gets for one evaluation, built from the run's control settings.

One function shared by the Ray controller and any controller without Ray (the device check's
in-process node), so that both hand a node exactly the same settings for a trial. No Ray here.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.control.settings import ControlSettings
from orchestrator.evidence.plan import profile_extra
from orchestrator.records import Candidate
from orchestrator.runner.trial import TrialSpec


def trial_spec(cs: ControlSettings, run_dir: Path, trial_id: int, candidate: Candidate,
               phase: str = "", repetitions: int | None = None, *,
               live: tuple[str, ...] = ()) -> TrialSpec:
    """``repetitions``: this trial's benchmark repetitions (default ``bench.repetitions``;
    with ``live`` clock policies, the rounds of one block per policy within the lifetime:
    :mod:`orchestrator.runner.lifetime`)."""
    return TrialSpec(
        trial_id=trial_id,
        candidate=candidate,
        repo=cs.repo,
        cache_dir=str(cs.runs_dir / ".cache" / "worktrees"),
        trial_dir=str(run_dir / "trials" / str(trial_id)),
        ready_timeout_s=cs.trial.ready_timeout_s,
        grace_s=cs.trial.grace_s,
        telemetry_interval_s=cs.trial.telemetry_interval_s,
        repetitions=int(repetitions if repetitions is not None else cs.bench.repetitions),
        warmup_requests=cs.bench.warmup_requests,
        phase=phase,
        cache_max_bytes=cs.cache_max_bytes,
        extra={"packages": cs.overlays.to_json(),
               **profile_extra(cs.evidence, cs.bench, cs.trial.profile, phase),
               **({"live": list(live)} if live else {})},
    )
