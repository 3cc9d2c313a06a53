"""Run store: everything a run measured, in SQLite inside the run directory."""

from orchestrator.store.sqlite import RunStore, TrialRow

__all__ = ["RunStore", "TrialRow"]
