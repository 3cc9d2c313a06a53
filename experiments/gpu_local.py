"""A controller without Ray: one in-process node, for the device check on the borrowed GPU.

The GPU machine has no Ray (its wheel alone is larger than everything a call may carry), and
one GPU needs no cluster. This object has the surface `control.drive.drive` and
`commands.bisect.execute` use (`store`, `retries`, `nodes`, `idle_nodes`, `in_flight`,
`submit`, `wait`), and behind it the node is a plain `runner.node.NodeRunner` called in this
process: the same trial runner, workspace, NVML control and telemetry, fingerprint and store
rows as a Ray run. It keeps the controller's order (a trial row is persisted before the trial
runs, its result before anyone reads it) and its retries of retryable outcomes. It does not
handle a lost node (nothing can be lost in-process) or signals (the check is one short call).

The trial spec is built as `control.controller.Controller.submit` builds it; were this to
become a product mode (`cluster=inprocess` for a one-GPU box), that construction would move
into one shared function of `control/`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.settings import as_dict
from orchestrator.control.settings import ControlSettings
from orchestrator.control.specs import trial_spec
from orchestrator.records import RETRYABLE, Candidate, Outcome, TrialResult
from orchestrator.runner.node import NodeRunner
from orchestrator.store import RunStore, TrialRow

NODE = "local-0"


@dataclass
class Pending:
    trial_id: int
    candidate: Candidate
    phase: str
    attempt: int
    repetitions: int | None


class LocalController:
    def __init__(self, settings: ControlSettings, store: RunStore, run_dir: Path, *,
                 on_event: Callable[[str], None] | None = None,
                 runner: NodeRunner | None = None, deadline: float | None = None):
        """``deadline`` (a `time.monotonic()` value): no trial starts after it; the drive loop
        then ends with the verdict it has, as at a budget, and the findings are written."""
        self.settings = settings
        self.deadline = deadline
        self.store = store
        self.run_dir = run_dir
        self.runs_dir = settings.runs_dir
        self.retries = settings.trial.retries
        self.on_event = on_event or (lambda _msg: None)
        self._runner = runner
        self._pending: Pending | None = None
        self._candidate_ids: dict[str, int] = {}

    def __enter__(self) -> LocalController:
        if self._runner is None:
            self._runner = NodeRunner(
                NODE, str(self.runs_dir / ".nodes" / NODE),
                as_dict(self.settings.target),
                as_dict(self.settings.bench), self.store.run_id)
        hello = self._runner.hello(list(self.settings.clocks))
        if hello.get("held_by"):
            raise RuntimeError(f"node {NODE} is held by another run: {hello['held_by']}")
        if hello.get("problem"):
            raise RuntimeError(str(hello["problem"]))
        return self

    def __exit__(self, *exc) -> None:
        if self._runner is not None:
            self._runner.close()

    @property
    def nodes(self) -> list[str]:
        return [NODE]

    def idle_nodes(self) -> list[str]:
        late = self.deadline is not None and time.monotonic() > self.deadline
        return [] if self._pending is not None or late else [NODE]

    def in_flight(self) -> list[Pending]:
        return [self._pending] if self._pending is not None else []

    def submit(self, candidate: Candidate, *, phase: str = "", node: str | None = None,
               attempt: int = 1, repetitions: int | None = None) -> int:
        """Persist the trial row; the trial itself runs in `wait` (one node, one at a time)."""
        if self._pending is not None:
            raise RuntimeError("no idle node")
        cand_id = self._candidate_ids.get(candidate.key)
        if cand_id is None:
            cand_id = self._candidate_ids[candidate.key] = self.store.candidate_id(candidate)
        trials = self.run_dir / "trials"
        trial_id = self.store.begin_trial(cand_id, node=NODE, phase=phase, attempt=attempt,
                                          log_path=lambda tid: str(trials / str(tid) / "server.log"))
        self._pending = Pending(trial_id, candidate, phase, attempt, repetitions)
        self.on_event(f"trial {trial_id} started on {NODE}: {candidate.label} ({phase or 'trial'})")
        return trial_id

    def wait(self, timeout: float | None = None) -> list[TrialRow]:
        """Run the submitted trial (and its retries) to its final attempt; its row."""
        while self._pending is not None:
            p = self._pending
            spec = trial_spec(self.settings, self.run_dir, p.trial_id, p.candidate, p.phase,
                              p.repetitions)
            try:
                result = self._runner.run(spec)
            except Exception as exc:  # the trial raised: never "slow"
                result = TrialResult(Outcome.ERROR, f"node {NODE} failed: {type(exc).__name__}:"
                                     f" {str(exc)[:300]}", node=NODE, started_at=time.time(),
                                     ended_at=time.time())
            self.store.finish_trial(p.trial_id, result)
            took = result.ended_at - result.started_at if result.ended_at else 0.0
            self.on_event(f"trial {p.trial_id} on {NODE} {result.outcome.value} in {took:.1f}s"
                          + (f": {result.detail}" if result.detail else ""))
            self._pending = None
            if result.outcome in RETRYABLE and p.attempt <= self.retries:
                self.submit(p.candidate, phase=p.phase, attempt=p.attempt + 1,
                            repetitions=p.repetitions)
                continue
            return [self.store.trial(p.trial_id)]
        return []
