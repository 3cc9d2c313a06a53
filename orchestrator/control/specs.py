"""The trial spec a node gets for one evaluation, built from the run's configuration.

One function shared by the Ray controller and any controller without Ray (the device check's
in-process node), so that both hand a node exactly the same settings for a trial. No Ray here.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.settings import RunSettings
from orchestrator.control import packages
from orchestrator.evidence.plan import profile_extra
from orchestrator.records import Candidate
from orchestrator.run.rundir import runs_root
from orchestrator.runner.trial import TrialSpec


def cache_max_bytes(cfg: RunSettings) -> int | None:
    """`cache.max_gb` in bytes (None: uncapped)."""
    gb = cfg.cache.max_gb
    return int(float(gb) * 2**30) if gb else None


def trial_spec(cfg: RunSettings, run_dir: Path, trial_id: int, candidate: Candidate,
               phase: str = "", repetitions: int | None = None, *,
               overlays: dict | None = None, max_bytes: int | None = None,
               live: tuple[str, ...] = ()) -> TrialSpec:
    """``repetitions``: this trial's benchmark repetitions (default ``bench.repetitions``;
    with ``live`` clock policies, the rounds of one block per policy within the lifetime:
    :mod:`orchestrator.runner.lifetime`);
    ``overlays`` / ``max_bytes``: precomputed package-overlay settings and cache cap (a
    controller computes them once), else read from ``cfg``."""
    runs_dir = runs_root(cfg)
    return TrialSpec(
        trial_id=trial_id,
        candidate=candidate,
        repo=str(cfg.repo),
        cache_dir=str(runs_dir / ".cache" / "worktrees"),
        trial_dir=str(run_dir / "trials" / str(trial_id)),
        ready_timeout_s=cfg.trial.ready_timeout_s,
        grace_s=cfg.trial.grace_s,
        telemetry_interval_s=cfg.trial.telemetry_interval_s,
        repetitions=int(repetitions if repetitions is not None else cfg.bench.repetitions),
        warmup_requests=cfg.bench.warmup_requests,
        phase=phase,
        cache_max_bytes=max_bytes if max_bytes is not None else cache_max_bytes(cfg),
        extra={"packages": overlays if overlays is not None
               else packages.settings(cfg).to_json(), **profile_extra(cfg.evidence, cfg.bench, cfg.trial.profile, phase),
               **({"live": list(live)} if live else {})},
    )
