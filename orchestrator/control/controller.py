"""The controller: the Ray driver. With `node_pool` and `ray_cluster`, the only code that
knows about Ray.

It keeps the nodes busy with the trials an experiment asks for, persists every trial row
*before* dispatching it and its result *before* anyone acts on it, and retries a failed launch
up to `trial.retries` times (each attempt is its own recorded trial). Experiments talk to it
through `submit` / `wait` / `idle_nodes` and never see Ray.

A node whose actor or Ray node dies mid-trial, or a server killed from outside, is not the
candidate's fault: the trial is recorded `interrupted` (never evidence), the same evaluation
is queued and runs on the next live node without using up `trial.retries`, and the run goes on (`NodePool` replaces the node
or finds it again when it comes back). A full disk, met by a node or by the store, stops the
run as `interrupted` with every finished trial kept.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ray

from orchestrator.config.settings import as_dict
from orchestrator.control.concurrency import HeldBack
from orchestrator.control.node_pool import NodePool, first_line
from orchestrator.control.ray_cluster import (
    NODE_RESOURCE,
    loopback_only,
    node_name,
    sleuth_nodes,
    start_ray,
)
from orchestrator.control.settings import ControlSettings
from orchestrator.control.specs import trial_spec
from orchestrator.errors import DiskFull
from orchestrator.records import RETRYABLE, Candidate, Outcome, TrialResult
from orchestrator.run import blocks
from orchestrator.runner.trial_checks import NO_SPACE, is_no_space
from orchestrator.store import RunStore, TrialRow
from orchestrator.util import wallclock
from orchestrator.util.safe_text import printable

__all__ = ["NODE_RESOURCE", "RETRYABLE", "Controller", "loopback_only", "node_name",
           "sleuth_nodes", "start_ray"]

# An evaluation whose node was lost this many times is given up (recorded `error`): a candidate
# that takes its node down with it must not take down every node in turn.
MAX_NODE_LOSSES = 3


@dataclass
class _InFlight:
    trial_id: int
    candidate: Candidate
    candidate_id: int
    node: str
    phase: str
    attempt: int
    ref: object
    started: float
    losses: int = 0
    repetitions: int | None = None
    live: tuple[str, ...] = ()


@dataclass
class _Queued:
    """An evaluation waiting for a node (its trial was lost with its node)."""

    candidate: Candidate
    phase: str
    attempt: int
    losses: int
    node: str = ""
    repetitions: int | None = None
    live: tuple[str, ...] = ()


class Controller:
    def __init__(
        self,
        settings: ControlSettings,
        store: RunStore,
        run_dir: Path,
        *,
        on_event: Callable[[str], None] | None = None,
    ):
        """`settings`: the part of the run's settings the controller reads, cut by the command
        (`commands/parts.control`), with every clock policy its trials set: each node checks
        them against its GPUs before the first trial."""
        self.settings = settings
        self.store = store
        self.run_dir = run_dir
        self.runs_dir = settings.runs_dir
        sink = on_event or (lambda _msg: None)
        self.on_event = lambda msg: sink(printable(msg, newlines=False))
        self.pool = NodePool(settings, store.run_id, self.on_event)
        self._busy: dict[str, _InFlight] = {}
        self._by_ref: dict[object, _InFlight] = {}
        self._queue: list[_Queued] = []
        self._held_back = HeldBack()  # fewer trials at once than nodes: said once, with why
        self._candidate_ids: dict[str, int] = {}
        self._blocks_of: dict[int, list[int]] = {}  # first block row -> all of its lifetime
        # Called before every restart with the run's trials; raises to stop the run.
        self.before_restart: Callable[..., None] | None = None
        self.retries = settings.trial.retries
        self._interrupted = False
        self._starting = False
        self._old_handlers: dict[int, object] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Controller:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _on_signal(self, signum: int, _frame) -> None:
        """First Ctrl-C (or SIGTERM): stop scheduling and tear down. A second one: abort now.
        While Ray and the nodes are still starting there is nothing to tear down: abort now.

        Ray's blocking calls do not let Python see SIGINT, so `wait` polls this flag."""
        if self._interrupted or self._starting:
            raise KeyboardInterrupt
        self._interrupted = True
        self.on_event(f"{signal.Signals(signum).name}: stopping; running servers are torn down"
                      " and the run stays resumable")

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            old = signal.signal(sig, self._on_signal)
            if sig not in self._old_handlers:  # installed twice: keep what was there first
                self._old_handlers[sig] = old

    def _ignore_signals(self) -> None:
        if threading.current_thread() is threading.main_thread() and self._old_handlers:
            for sig in self._old_handlers:
                signal.signal(sig, signal.SIG_IGN)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def start(self) -> None:
        self._starting = True
        self._install_signals()
        try:
            self.store.ensure_reserve()
            start_ray(as_dict(self.settings.cluster), nodes=self.settings.nodes)
            # Again after Ray starts: ray.init installs its own SIGTERM handler (it logs
            # "SIGTERM received" and kills the process), which would replace ours, and a
            # SIGTERM would then end the run as killed, neither recorded interrupted nor
            # resumable as such.
            self._install_signals()
            self.pool.start()
        except BaseException:
            self.stop()
            raise
        finally:
            self._starting = False

    @property
    def _actors(self) -> dict[str, object]:
        return self.pool.actors

    def stop(self) -> None:
        """Record running trials as interrupted (resumable), tear their servers down, stop the
        actors. Recording comes first (it is quick, and a second Ctrl-C during the teardown
        must not lose it); every step is best effort, so a dead node or a full disk cannot
        turn a clean stop into a traceback."""
        if not ray.is_initialized():  # refused before Ray ran: any Ray call would start it
            self._restore_signals()
            return
        try:
            for inflight in list(self._busy.values()):
                try:
                    self.store.finish_trial(inflight.trial_id, TrialResult(
                        Outcome.INTERRUPTED, "the controller stopped while the trial ran",
                        node=inflight.node, started_at=inflight.started, ended_at=wallclock.now()))
                except Exception:
                    pass
            aborts = []
            for inflight in self._busy.values():
                try:
                    aborts.append(self._actors[inflight.node].abort.remote())
                except Exception:
                    pass
            try:
                if aborts:
                    ray.get(aborts, timeout=30)
            except Exception:
                pass
        finally:
            self._busy.clear()
            self._by_ref.clear()
            self._queue.clear()
            # Quick, and must not be cut short (an actor half given back holds its node). Ray
            # itself stays up for the rest of the command (`ray_cluster.start_ray`): a next
            # controller of the same command starts no instance of its own.
            self._ignore_signals()
            self.pool.kill_all()
            self._restore_signals()

    # -- scheduling ----------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return list(self._actors)

    def idle_nodes(self) -> list[str]:
        """Nodes free for a new evaluation (queued retries come first)."""
        idle = [n for n in self._actors if n not in self._busy]
        return idle[len(self._queue):]

    def in_flight(self) -> list[_InFlight | _Queued]:
        """Evaluations not yet final: running, or waiting for a node."""
        return [*self._busy.values(), *self._queue]

    def submit(self, candidate: Candidate, *, phase: str = "", node: str | None = None,
               attempt: int = 1, losses: int = 0, repetitions: int | None = None,
               live: tuple[str, ...] = ()) -> int:
        """Persist a trial row, then dispatch it to an idle node. Returns the trial id.
        ``repetitions``: the benchmark repetitions of this trial (default
        ``bench.repetitions``); a retry keeps the count of the attempt it repeats. ``live``:
        clock policies measured in interleaved blocks within this one lifetime
        (:mod:`orchestrator.runner.lifetime`); a retry keeps them too."""
        if self._interrupted:
            raise KeyboardInterrupt
        if self.before_restart is not None:  # a run's budget (orchestrator/run/plan.py)
            self.before_restart(self.store.trials(), len(live) or 1)
        idle = [n for n in self._actors if n not in self._busy]
        if not idle:
            raise RuntimeError("no idle node")
        node = node if node in idle else idle[0]
        cand_id = self._candidate_ids.get(candidate.key)
        if cand_id is None:  # a candidate's id never changes within a store
            cand_id = self._candidate_ids[candidate.key] = self.store.candidate_id(candidate)
        trials = self.run_dir / "trials"
        trial_id = self.store.begin_trial(cand_id, node=node,
                                          phase=blocks.LIFETIME_PHASE if live else phase,
                                          attempt=attempt,
                                          log_path=lambda tid: str(trials / str(tid) / "server.log"))
        spec = trial_spec(self.settings, self.run_dir, trial_id, candidate, phase, repetitions,
                          live=live)
        ref = self._actors[node].run.remote(spec)
        inflight = _InFlight(trial_id, candidate, cand_id, node, phase, attempt, ref, wallclock.now(),
                             losses, repetitions, tuple(live))
        self._busy[node] = inflight
        self._by_ref[ref] = inflight
        self.on_event(f"trial {trial_id} started on {node}: {candidate.label} ({phase or 'trial'})")
        fresh = attempt == 1 and losses == 0  # the experiment's choice, not a retry
        if fresh and (why := self._held_back.submitted()) is not None:
            self.on_event(why)
        return trial_id

    def wait(self, timeout: float | None = None) -> list[TrialRow]:
        """Block until at least one candidate evaluation is final; persist and return them.

        A retryable failure is resubmitted on the same node (a new trial row); a trial lost
        with its node is resubmitted on the next free one; only the final attempt is returned,
        so callers see each requested evaluation exactly once. With nothing running it returns
        at once, unless there is no node at all: then it waits for one to join."""
        done_rows: list[TrialRow] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        self._held_back.waiting([f.trial_id for f in self._busy.values()], len(self._actors))
        while not done_rows:
            if self._interrupted:
                raise KeyboardInterrupt
            self.pool.poll()
            self._dispatch_queued()
            if not self._by_ref:
                if not self._queue and (self._actors or not self.pool.may_grow()):
                    return done_rows
                if deadline is not None and time.monotonic() > deadline:
                    return done_rows
                time.sleep(0.25)
                continue
            ready, _ = ray.wait(list(self._by_ref), num_returns=1, timeout=0.25)
            if not ready:
                if deadline is not None and time.monotonic() > deadline:
                    return done_rows
                continue
            for ref in ready:
                row = self._finish(ref)
                if row is not None:
                    done_rows.append(row)
        return done_rows

    def _finish(self, ref) -> TrialRow | None:
        """Record one returned trial; resubmit it if it deserves another attempt. Returns its
        row when the evaluation is final."""
        inflight = self._by_ref.pop(ref)
        del self._busy[inflight.node]
        lost = False
        try:
            result: TrialResult = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # the node actor (or its Ray node) died
            lost = inflight.losses + 1 < MAX_NODE_LOSSES
            self.pool.lost(inflight.node, first_line(exc))
            result = TrialResult(
                Outcome.INTERRUPTED if lost else Outcome.ERROR,
                f"node {inflight.node} was lost during the trial ({first_line(exc)})"
                + ("; it runs again on the next free node" if lost else
                   f"; lost {MAX_NODE_LOSSES} nodes in a row, given up"),
                node=inflight.node, started_at=inflight.started, ended_at=wallclock.now())
        except Exception as exc:  # the trial raised on the node: never "slow"
            result = TrialResult(
                Outcome.ERROR,
                f"node {inflight.node} failed: {type(exc).__name__}: {str(exc)[:300]}",
                node=inflight.node, started_at=inflight.started, ended_at=wallclock.now(),
            )
        if (result.outcome is Outcome.INTERRUPTED and not self._interrupted and not lost
                and not result.detail.startswith(NO_SPACE)):
            # The server was killed from outside (runner/exits.py): like a lost node, not the
            # candidate's doing; it runs again without using up a retry, a few times at most.
            lost = inflight.losses + 1 < MAX_NODE_LOSSES
            if not lost:
                result = dataclasses.replace(
                    result, outcome=Outcome.ERROR,
                    detail=f"{result.detail} (interrupted {MAX_NODE_LOSSES} times in a row,"
                           " given up)")
        result = self._with_node_identity(inflight.node, result)
        self._persist_log(inflight, result)
        self.store.finish_trial(inflight.trial_id, result)
        self.on_event(self._describe(inflight, result))
        if result.detail.startswith(NO_SPACE):
            raise DiskFull(result.detail)
        if self.store.space_exhausted:
            raise DiskFull(f"no space left on device for {self.store.path}")
        if lost:
            self._queue.append(_Queued(inflight.candidate, inflight.phase, inflight.attempt,
                                       inflight.losses + 1, repetitions=inflight.repetitions,
                                       live=inflight.live))
            return None
        if result.outcome in RETRYABLE and inflight.attempt <= self.retries:
            self.submit(inflight.candidate, phase=inflight.phase, node=inflight.node,
                        attempt=inflight.attempt + 1, repetitions=inflight.repetitions,
                        live=inflight.live)
            return None
        if inflight.live:  # one restart, several candidates: a block row for each
            return self._record_blocks(inflight, result)
        return self.store.trial(inflight.trial_id)

    def _record_blocks(self, inflight: _InFlight, result: TrialResult) -> TrialRow:
        """The block rows of a finished lifetime; the evaluation's row is the first of them."""
        ids = blocks.record(self.store, inflight.trial_id, inflight.candidate, inflight.live,
                            result, node=inflight.node, phase=inflight.phase,
                            attempt=inflight.attempt)
        self._blocks_of[ids[0]] = ids
        return self.store.trial(ids[0])

    def blocks_of(self, row: TrialRow) -> list[TrialRow]:
        """Every block row of the lifetime whose first block row is `row` (just `row` for a
        trial of one candidate)."""
        ids = self._blocks_of.pop(row.id, None)
        return [row] if not ids else [row, *(self.store.trial(i) for i in ids[1:])]

    def _dispatch_queued(self) -> None:
        while self._queue:
            idle = [n for n in self._actors if n not in self._busy]
            if not idle:
                return
            q = self._queue.pop(0)
            self.submit(q.candidate, phase=q.phase, node=idle[0], attempt=q.attempt,
                        losses=q.losses, repetitions=q.repetitions, live=q.live)

    # -- results ---------------------------------------------------------------------------------
    def _with_node_identity(self, node: str, result: TrialResult) -> TrialResult:
        """On a cluster the Ray node a trial ran on is part of its fingerprint."""
        if node not in self.pool.placement or not result.fingerprint:
            return result
        node_id, address = self.pool.placement[node]
        fp = dict(result.fingerprint)
        fp["host"] = {**fp.get("host", {}), "ray_node_id": node_id, "ray_node_address": address}
        return dataclasses.replace(result, fingerprint=fp)

    def _persist_log(self, inflight: _InFlight, result: TrialResult) -> None:
        """On a remote node the log lives there; keep its tail in the run directory."""
        log = self.run_dir / "trials" / str(inflight.trial_id) / "server.log"
        try:
            if not log.exists() and result.log_tail:
                log.parent.mkdir(parents=True, exist_ok=True)
                log.write_text(result.log_tail)
        except OSError as exc:
            if is_no_space(exc):
                self.store.space_exhausted = True  # the result itself is recorded next
                return
            raise

    @staticmethod
    def _describe(inflight: _InFlight, result: TrialResult) -> str:
        took = result.ended_at - result.started_at if result.ended_at else 0.0
        what = result.outcome.value if result.outcome is not Outcome.OK else "ok"
        extra = f": {result.detail}" if result.detail else ""
        return f"trial {inflight.trial_id} on {inflight.node} {what} in {took:.1f}s{extra}"
