"""The controller: the Ray driver. With `ray_cluster`, the only code that knows about Ray.

It owns the node actors, keeps them busy with the trials an experiment asks for, persists every
trial row *before* dispatching it and its result *before* anyone acts on it, and retries a
failed launch up to `trial.retries` times (each attempt is its own recorded trial). Experiments
talk to it through `submit` / `wait` / `idle_nodes` and never see Ray.

Nodes come and go. A node whose actor or Ray node dies mid-trial is not the candidate's fault:
the trial is recorded `interrupted` (never evidence), the same evaluation is queued and runs on
the next live node without using up `trial.retries`, and the run goes on. A local node gets a
fresh actor at once; on a cluster the controller looks for `sleuth_node` Ray nodes every few
seconds and starts an actor on any that (re)joined, so a node that comes back is used again.
Nodes start asynchronously (`hello`: info and preflight in one call), so a joining node never
stalls the trials running elsewhere.
"""

from __future__ import annotations

import dataclasses
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import ray
from omegaconf import DictConfig, OmegaConf

from orchestrator.errors import DiskFull, NodeBusy, NodesLost, UserError
from orchestrator.ray_cluster import (
    NODE_RESOURCE,
    loopback_only,
    node_name,
    sleuth_nodes,
    start_ray,
)
from orchestrator.records import Candidate, Outcome, TrialResult
from orchestrator.runner.node import NodeRunner
from orchestrator.runner.trial import NO_SPACE, TrialSpec, is_no_space
from orchestrator.safe_text import printable
from orchestrator.store import RunStore, TrialRow

__all__ = ["NODE_RESOURCE", "RETRYABLE", "Controller", "loopback_only", "node_name",
           "sleuth_nodes", "start_ray"]

# Outcomes worth another attempt: the server, not the candidate, may be at fault.
RETRYABLE = {Outcome.LAUNCH_FAILED, Outcome.NOT_READY, Outcome.CRASHED, Outcome.HUNG,
             Outcome.BENCH_FAILED, Outcome.TEARDOWN_FAILED, Outcome.ERROR}

# An evaluation whose node was lost this many times is given up (recorded `error`): a candidate
# that takes its node down with it must not take down every node in turn.
MAX_NODE_LOSSES = 3
SCAN_INTERVAL_S = 2.0


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


@dataclass
class _Queued:
    """An evaluation waiting for a node (its trial was lost with its node)."""

    candidate: Candidate
    phase: str
    attempt: int
    losses: int
    node: str = ""


class Controller:
    def __init__(
        self,
        cfg: DictConfig,
        store: RunStore,
        run_dir: Path,
        *,
        on_event: Callable[[str], None] | None = None,
    ):
        self.cfg = cfg
        self.store = store
        self.run_dir = run_dir
        self.runs_dir = Path(cfg.runs_dir)
        sink = on_event or (lambda _msg: None)
        self.on_event = lambda msg: sink(printable(msg, newlines=False))
        self._started_ray = False
        self._actors: dict[str, object] = {}
        self._busy: dict[str, _InFlight] = {}
        self._by_ref: dict[object, _InFlight] = {}
        self._queue: list[_Queued] = []
        self._joining: dict[object, tuple[str, object]] = {}  # hello ref -> (name, actor)
        self._refused: set[str] = set()  # nodes that joined but cannot be used (held, preflight)
        self._dead_ids: set[str] = set()  # Ray node ids that could not take an actor again
        self._next_scan = 0.0
        self._alone_since: float | None = None
        self.retries = int(cfg.trial.retries)
        self._interrupted = False
        self._starting = False
        self._old_handlers: dict[int, object] = {}
        # cluster=ray: node name -> (Ray node id, address) the node's actor is pinned to.
        self._placement: dict[str, tuple[str, str]] = {}
        self._clocks = clock_policies(cfg)
        cache = cfg.get("cache") or {}
        gb = cache.get("max_gb") if hasattr(cache, "get") else None
        self._cache_max_bytes = int(float(gb) * 2**30) if gb else None

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
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

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
            self._started_ray = start_ray(OmegaConf.to_container(self.cfg.cluster, resolve=True))
            actors = {name: self._new_actor(name) for name in self._node_names()}
            hellos = ray.get([a.hello.remote(self._clocks) for a in actors.values()])
            held = []
            for (name, actor), hello in zip(actors.items(), hellos, strict=True):
                if hello.get("held_by"):
                    held.append(self._held_message(name, hello["held_by"]))
                    ray.kill(actor)
                    continue
                if hello.get("problem"):
                    raise UserError(hello["problem"])
                self._actors[name] = actor
                self._say_hello(hello)
            if held and not self._actors:
                raise NodeBusy(held[0] + ": wait for that run to finish (a node's server and"
                               " clocks belong to the run holding it)")
            for line in held:
                self.on_event(f"{line}: not used")
        except BaseException:
            self.stop()
            raise
        finally:
            self._starting = False

    @staticmethod
    def _held_message(name: str, holder: Mapping) -> str:
        since = holder.get("since")
        when = time.strftime(" since %H:%M:%S", time.localtime(since)) if since else ""
        return (f"node {name} is held by another sleuth run ({holder.get('run_id') or 'run ?'},"
                f" pid {holder.get('pid')} on {holder.get('host', '?')}{when})")

    def _say_hello(self, hello: Mapping) -> None:
        if hello.get("reaped"):
            self.on_event(f"node {hello['name']}: stopped a server left running by an"
                          f" earlier controller (pids {hello['reaped']})")

    def _node_names(self) -> list[str]:
        """`local-<i>` actors on the local Ray; on a cluster, one per `sleuth_node` Ray node."""
        want = int(self.cfg.nodes)
        if self.cfg.cluster.kind != "ray":
            return [f"local-{i}" for i in range(want)]
        offered = sleuth_nodes()
        if not offered:
            raise UserError(f"no Ray node offers the {NODE_RESOURCE!r} resource: start each GPU"
                            " node with ray start --address HEAD:PORT --resources"
                            f" '{{\"{NODE_RESOURCE}\": 1}}'")
        if len(offered) < want:
            self.on_event(f"nodes={want} but the cluster offers {len(offered)} sleuth node(s):"
                          f" using {len(offered)}")
        names = []
        for node in offered[:want]:
            names.append(self._place(node))
        return names

    def _place(self, node: Mapping) -> str:
        name = node_name(node)
        self._placement[name] = (node["NodeID"], node.get("NodeManagerAddress", ""))
        return name

    def _new_actor(self, name: str, adopt: tuple[str, ...] = (), wait_s: float = 0.0):
        target = OmegaConf.to_container(self.cfg.target, resolve=True)
        bench = OmegaConf.to_container(self.cfg.bench, resolve=True)
        state_dir = self.runs_dir / ".nodes" / name
        options: dict = {"num_cpus": 0, "max_concurrency": 4, "max_restarts": 0}
        if name in self._placement:  # pinned to its Ray node; the resource admits one actor
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["resources"] = {NODE_RESOURCE: 1}
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self._placement[name][0], soft=False)
        return ray.remote(NodeRunner).options(**options).remote(
            name, str(state_dir), target, bench, self.store.run_id, adopt, wait_s)

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
                        node=inflight.node, started_at=inflight.started, ended_at=time.time()))
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
            # Quick, and must not be cut short: a Ctrl-C inside ray.shutdown() leaves Ray's
            # core worker half torn down, and it then ends the process with exit 1.
            self._ignore_signals()
            for actor in [*self._actors.values(), *(a for _, a in self._joining.values())]:
                try:
                    ray.kill(actor)
                except Exception:
                    pass
            self._actors.clear()
            self._joining.clear()
            if self._started_ray:
                self._started_ray = False
                try:
                    ray.shutdown()
                except Exception:
                    pass
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
               attempt: int = 1, losses: int = 0) -> int:
        """Persist a trial row, then dispatch it to an idle node. Returns the trial id."""
        if self._interrupted:
            raise KeyboardInterrupt
        idle = [n for n in self._actors if n not in self._busy]
        if not idle:
            raise RuntimeError("no idle node")
        node = node if node in idle else idle[0]
        cand_id = self.store.candidate_id(candidate)
        trial_id = self.store.begin_trial(cand_id, node=node, phase=phase, attempt=attempt)
        trial_dir = self.run_dir / "trials" / str(trial_id)
        self.store.set_log_path(trial_id, str(trial_dir / "server.log"))
        spec = TrialSpec(
            trial_id=trial_id,
            candidate=candidate,
            repo=str(self.cfg.repo),
            cache_dir=str(self.runs_dir / ".cache" / "worktrees"),
            trial_dir=str(trial_dir),
            ready_timeout_s=float(self.cfg.trial.ready_timeout_s),
            grace_s=float(self.cfg.trial.grace_s),
            telemetry_interval_s=float(self.cfg.trial.telemetry_interval_s),
            repetitions=int(self.cfg.bench.repetitions),
            warmup_requests=int(self.cfg.bench.warmup_requests),
            phase=phase,
            cache_max_bytes=self._cache_max_bytes,
        )
        ref = self._actors[node].run.remote(spec)
        inflight = _InFlight(trial_id, candidate, cand_id, node, phase, attempt, ref, time.time(),
                             losses)
        self._busy[node] = inflight
        self._by_ref[ref] = inflight
        self.on_event(f"trial {trial_id} started on {node}: {candidate.label} ({phase or 'trial'})")
        return trial_id

    def wait(self, timeout: float | None = None) -> list[TrialRow]:
        """Block until at least one candidate evaluation is final; persist and return them.

        A retryable failure is resubmitted on the same node (a new trial row); a trial lost
        with its node is resubmitted on the next free one; only the final attempt is returned,
        so callers see each requested evaluation exactly once. With nothing running it returns
        at once, unless there is no node at all: then it waits for one to join."""
        done_rows: list[TrialRow] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done_rows:
            if self._interrupted:
                raise KeyboardInterrupt
            self._poll_nodes()
            self._dispatch_queued()
            if not self._by_ref:
                if not self._queue and (self._actors or not self._joining_possible()):
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
            self._node_lost(inflight.node, exc)
            result = TrialResult(
                Outcome.INTERRUPTED if lost else Outcome.ERROR,
                f"node {inflight.node} was lost during the trial ({_first_line(exc)})"
                + ("; it runs again on the next free node" if lost else
                   f"; lost {MAX_NODE_LOSSES} nodes in a row, given up"),
                node=inflight.node, started_at=inflight.started, ended_at=time.time())
        except Exception as exc:  # the trial raised on the node: never "slow"
            result = TrialResult(
                Outcome.ERROR,
                f"node {inflight.node} failed: {type(exc).__name__}: {str(exc)[:300]}",
                node=inflight.node, started_at=inflight.started, ended_at=time.time(),
            )
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
                                       inflight.losses + 1))
            return None
        if result.outcome in RETRYABLE and inflight.attempt <= self.retries:
            self.submit(inflight.candidate, phase=inflight.phase, node=inflight.node,
                        attempt=inflight.attempt + 1)
            return None
        return self.store.trial(inflight.trial_id)

    def _dispatch_queued(self) -> None:
        while self._queue:
            idle = [n for n in self._actors if n not in self._busy]
            if not idle:
                return
            q = self._queue.pop(0)
            self.submit(q.candidate, phase=q.phase, node=idle[0], attempt=q.attempt,
                        losses=q.losses)

    # -- nodes that leave and join -------------------------------------------------------------
    def _node_lost(self, name: str, exc: BaseException) -> None:
        actor = self._actors.pop(name, None)
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception:
                pass
        self.on_event(f"node {name} lost: {_first_line(exc)}")
        if name not in self._placement:  # a local node: a fresh actor; it reaps what is left
            fresh = self._new_actor(name, wait_s=15.0)  # while the dead one's lock is freed
            self._joining[fresh.hello.remote(self._clocks)] = (name, fresh)
        else:
            self._next_scan = 0.0  # look for it (or another node) again right away

    def _joining_possible(self) -> bool:
        return bool(self._joining) or self.cfg.cluster.kind == "ray"

    def _poll_nodes(self) -> None:
        """Admit nodes that finished starting; on a cluster, start actors on sleuth nodes that
        (re)joined; give up when no node has been there for `cluster.rejoin_timeout_s`."""
        if self._joining:
            ready, _ = ray.wait(list(self._joining), num_returns=len(self._joining), timeout=0)
            for ref in ready:
                self._admit(ref)
        now = time.monotonic()
        want = int(self.cfg.nodes)
        if (self._placement and now >= self._next_scan
                and len(self._actors) + len(self._joining) < want):
            self._next_scan = now + SCAN_INTERVAL_S
            self._scan(want)
        if self._actors:
            self._alone_since = None
            return
        if self._alone_since is None:
            self._alone_since = now
            wait_s = float(self.cfg.cluster.get("rejoin_timeout_s", 600.0))
            self.on_event(f"no node left: waiting up to {wait_s:g}s for a sleuth node to join")
        elif now - self._alone_since > float(self.cfg.cluster.get("rejoin_timeout_s", 600.0)):
            raise NodesLost("every node was lost and none joined again within"
                            f" {self.cfg.cluster.get('rejoin_timeout_s', 600.0):g}s")

    def _admit(self, ref) -> None:
        name, actor = self._joining.pop(ref)
        try:
            hello = ray.get(ref)
        except Exception as exc:  # its Ray node is gone for good
            if name in self._placement:
                self._dead_ids.add(self._placement[name][0])
            self.on_event(f"node {name} cannot run trials any more: {_first_line(exc)}")
            return
        problem = (self._held_message(name, hello["held_by"]) if hello.get("held_by")
                   else hello.get("problem"))
        if problem:
            self._refused.add(name)
            self.on_event(f"{problem}: node {name} not used")
            try:
                ray.kill(actor)
            except Exception:
                pass
            return
        self._actors[name] = actor
        self._say_hello(hello)
        self.on_event(f"node {name} joined the run")

    def _scan(self, want: int) -> None:
        alive = [n for n in sleuth_nodes() if n["NodeID"] not in self._dead_ids]
        names = {node_name(n) for n in alive}
        for node in alive:
            if len(self._actors) + len(self._joining) >= want:
                return
            name = node_name(node)
            if name in self._actors or name in self._refused or any(
                    name == j for j, _ in self._joining.values()):
                continue
            self._place(node)
            host = name.rsplit("-", 1)[0]
            adopt = tuple(str(d) for d in sorted((self.runs_dir / ".nodes").glob(f"{host}-*"))
                          if d.is_dir() and d.name not in names)
            actor = self._new_actor(name, adopt)
            self._joining[actor.hello.remote(self._clocks)] = (name, actor)

    # -- results ---------------------------------------------------------------------------------
    def run_one(self, candidate: Candidate, *, phase: str = "") -> TrialRow:
        """Submit one evaluation and wait for its final attempt."""
        self.submit(candidate, phase=phase)
        while True:
            rows = self.wait()
            if rows:
                return rows[0]

    def _with_node_identity(self, node: str, result: TrialResult) -> TrialResult:
        """On a cluster the Ray node a trial ran on is part of its fingerprint."""
        if node not in self._placement or not result.fingerprint:
            return result
        node_id, address = self._placement[node]
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


def clock_policies(cfg: DictConfig) -> list[str]:
    """Every clock policy the configuration asks for (the run's, each side's of an isolate, a
    sweep's clock levels): each node checks them against its GPUs before the first trial."""
    out = {str(cfg.get("clock") or "default")}
    for side in ("good", "bad"):
        spec = cfg.get(side)
        if OmegaConf.is_dict(spec) and spec.get("clock"):
            out.add(str(spec.get("clock")))
    space = cfg.get("space")
    if OmegaConf.is_dict(space) and space.get("params"):
        for param in space.params.values():
            if param.get("kind") == "clock":
                out.update(str(v) for v in param.get("values") or [] if v is not None)
    return sorted(out)


def _first_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:200]}"
