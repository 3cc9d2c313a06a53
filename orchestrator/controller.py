"""The controller: the Ray driver. The only module that knows about Ray.

It owns the node actors, keeps them busy with the trials an experiment asks for, persists every
trial row *before* dispatching it and its result *before* anyone acts on it, and retries a
failed launch up to `trial.retries` times (each attempt is its own recorded trial). Experiments
talk to it through `submit` / `wait` / `idle_nodes` and never see Ray.
"""

from __future__ import annotations

import dataclasses
import logging
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import ray
from omegaconf import DictConfig, OmegaConf

from orchestrator.errors import UserError
from orchestrator.records import Candidate, Outcome, TrialResult
from orchestrator.runner.node import NodeRunner
from orchestrator.runner.trial import TrialSpec
from orchestrator.store import RunStore, TrialRow

# A Ray node runs trials only if it offers this custom resource (one unit: one trial at a time):
#   ray start --address HEAD:6379 --resources '{"sleuth_node": 1}'
NODE_RESOURCE = "sleuth_node"

# Outcomes worth another attempt: the server, not the candidate, may be at fault.
RETRYABLE = {Outcome.LAUNCH_FAILED, Outcome.NOT_READY, Outcome.CRASHED, Outcome.HUNG,
             Outcome.BENCH_FAILED, Outcome.TEARDOWN_FAILED, Outcome.ERROR}


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


def loopback_only() -> None:
    """Make a local Ray instance bind every service to 127.0.0.1.

    On Linux Ray turns "127.0.0.1" into the host's routable address and listens on all
    interfaces, which would expose an unauthenticated-by-default cluster to the network. Ray
    keeps loopback only when its cluster mode is off, which it reads from this constant at
    call time (it is the switch behind RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER)."""
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    # Recent Ray turns token authentication on for a new local cluster (good) and says so in a
    # warning on every command (noise between sleuth's own lines): keep the first, drop the
    # second. Its other warnings (auth disabled, for one) still show.
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        lambda record: "Token authentication is enabled" not in record.getMessage())


def start_ray(cluster: Mapping) -> bool:
    """Connect to (or start) Ray. Returns True when this call started it (and must stop it)."""
    if ray.is_initialized():
        return False
    if cluster.get("kind", "local") == "local":
        loopback_only()
        # address="local": a private instance even when another Ray runs on this machine
        # (without it Ray joins the last cluster started here, or RAY_ADDRESS).
        ray.init(
            address="local",
            num_cpus=cluster.get("num_cpus") or None,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",  # nothing listens beyond loopback
            log_to_driver=False,
            logging_level=logging.WARNING,  # not "Started a local Ray instance" on every run
            namespace="sleuth",
        )
    elif cluster.get("kind") == "ray":
        # No address: Ray's own discovery (RAY_ADDRESS, or a head started on this machine).
        address = cluster.get("address") or "auto"
        try:
            ray.init(address=address, log_to_driver=False, namespace="sleuth")
        except (ConnectionError, ValueError) as exc:
            raise UserError(f"cannot connect to the Ray cluster at {address}: {exc}") from exc
    else:
        raise UserError(f"unknown cluster.kind {cluster.get('kind')!r} (known: local, ray)")
    return True


def sleuth_nodes() -> list[dict]:
    """Alive Ray nodes offering the `sleuth_node` resource, in a stable order."""
    nodes = [n for n in ray.nodes()
             if n.get("Alive") and n.get("Resources", {}).get(NODE_RESOURCE, 0) >= 1]
    return sorted(nodes, key=lambda n: (n.get("NodeManagerHostname", ""), n["NodeID"]))


def node_name(node: Mapping) -> str:
    """`<hostname>-<first 8 of the Ray node id>`: readable, and unique even when two Ray nodes
    share a host (several GPU groups on one machine, or a test cluster)."""
    host = str(node.get("NodeManagerHostname") or node.get("NodeManagerAddress") or "node")
    return f"{host.split('.')[0]}-{node['NodeID'][:8]}"


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
        self.on_event = on_event or (lambda _msg: None)
        self._started_ray = False
        self._actors: dict[str, object] = {}
        self._busy: dict[str, _InFlight] = {}
        self._by_ref: dict[object, _InFlight] = {}
        self.retries = int(cfg.trial.retries)
        self._interrupted = False
        self._old_handlers: dict[int, object] = {}
        # cluster=ray: node name -> (Ray node id, address) the node's actor is pinned to.
        self._placement: dict[str, tuple[str, str]] = {}

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> Controller:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _on_signal(self, signum: int, _frame) -> None:
        """First Ctrl-C (or SIGTERM): stop scheduling and tear down. A second one: abort now.

        Ray's blocking calls do not let Python see SIGINT, so `wait` polls this flag."""
        if self._interrupted:
            raise KeyboardInterrupt
        self._interrupted = True
        self.on_event(f"{signal.Signals(signum).name}: stopping; running servers are torn down"
                      " and the run stays resumable")

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _restore_signals(self) -> None:
        for sig, handler in self._old_handlers.items():
            signal.signal(sig, handler)
        self._old_handlers.clear()

    def start(self) -> None:
        self._started_ray = start_ray(OmegaConf.to_container(self.cfg.cluster, resolve=True))
        # After Ray starts: ray.init installs its own SIGTERM handler (it logs "SIGTERM
        # received" and kills the process), which would replace ours, and a SIGTERM would
        # then end the run as killed, neither recorded interrupted nor resumable as such.
        self._install_signals()
        try:
            for name in self._node_names():
                self._actors[name] = self._new_actor(name)
            infos = ray.get([a.info.remote() for a in self._actors.values()])
            for info in infos:
                if info.get("reaped"):
                    self.on_event(f"node {info['name']}: stopped a server left running by an"
                                  f" earlier controller (pids {info['reaped']})")
            problems = ray.get([a.preflight.remote() for a in self._actors.values()])
        except BaseException:
            self.stop()
            raise
        for problem in problems:
            if problem:
                self.stop()
                raise UserError(problem)

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
        for node in offered[:want]:
            self._placement[node_name(node)] = (node["NodeID"], node.get("NodeManagerAddress", ""))
        return list(self._placement)

    def _new_actor(self, name: str):
        target = OmegaConf.to_container(self.cfg.target, resolve=True)
        bench = OmegaConf.to_container(self.cfg.bench, resolve=True)
        state_dir = self.runs_dir / ".nodes" / name
        options: dict = {"num_cpus": 0, "max_concurrency": 4, "max_restarts": 0}
        if name in self._placement:  # pinned to its Ray node; the resource admits one actor
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["resources"] = {NODE_RESOURCE: 1}
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self._placement[name][0], soft=False)
        return ray.remote(NodeRunner).options(**options).remote(name, str(state_dir), target, bench)

    def stop(self) -> None:
        """Tear down running servers and record their trials as interrupted (resumable)."""
        for inflight in list(self._busy.values()):
            try:
                ray.get(self._actors[inflight.node].abort.remote(), timeout=30)
            except Exception:
                pass
            try:
                self.store.finish_trial(inflight.trial_id, TrialResult(
                    Outcome.INTERRUPTED, "the controller stopped while the trial ran",
                    node=inflight.node, started_at=inflight.started, ended_at=time.time()))
            except (KeyError, ValueError):
                pass
        self._busy.clear()
        self._by_ref.clear()
        self._restore_signals()
        for actor in self._actors.values():
            ray.kill(actor)
        self._actors.clear()
        if self._started_ray:
            ray.shutdown()
            self._started_ray = False

    # -- scheduling ----------------------------------------------------------------------------
    @property
    def nodes(self) -> list[str]:
        return list(self._actors)

    def idle_nodes(self) -> list[str]:
        return [n for n in self._actors if n not in self._busy]

    def in_flight(self) -> list[_InFlight]:
        return list(self._busy.values())

    def submit(self, candidate: Candidate, *, phase: str = "", node: str | None = None,
               attempt: int = 1) -> int:
        """Persist a trial row, then dispatch it to an idle node. Returns the trial id."""
        if self._interrupted:
            raise KeyboardInterrupt
        idle = self.idle_nodes()
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
        )
        ref = self._actors[node].run.remote(spec)
        inflight = _InFlight(trial_id, candidate, cand_id, node, phase, attempt, ref, time.time())
        self._busy[node] = inflight
        self._by_ref[ref] = inflight
        self.on_event(f"trial {trial_id} started on {node}: {candidate.label} ({phase or 'trial'})")
        return trial_id

    def wait(self, timeout: float | None = None) -> list[TrialRow]:
        """Block until at least one candidate evaluation is final; persist and return them.

        A retryable failure is resubmitted on the same node (a new trial row); only the final
        attempt is returned, so callers see each requested evaluation exactly once."""
        done_rows: list[TrialRow] = []
        deadline = None if timeout is None else time.monotonic() + timeout
        while not done_rows and self._by_ref:
            if self._interrupted:
                raise KeyboardInterrupt
            ready, _ = ray.wait(list(self._by_ref), num_returns=1, timeout=0.25)
            if not ready:
                if deadline is not None and time.monotonic() > deadline:
                    return done_rows
                continue
            for ref in ready:
                inflight = self._by_ref.pop(ref)
                del self._busy[inflight.node]
                try:
                    result: TrialResult = ray.get(ref)
                except Exception as exc:  # the actor died: the trial is lost, never "slow"
                    result = TrialResult(
                        Outcome.ERROR,
                        f"node {inflight.node} failed: {type(exc).__name__}: {str(exc)[:300]}",
                        node=inflight.node, started_at=inflight.started, ended_at=time.time(),
                    )
                    if isinstance(exc, ray.exceptions.RayActorError):
                        # A fresh actor for the node; it reaps any server the dead one left.
                        self._actors[inflight.node] = self._new_actor(inflight.node)
                        ray.get(self._actors[inflight.node].info.remote())
                result = self._with_node_identity(inflight.node, result)
                self._persist_log(inflight, result)
                self.store.finish_trial(inflight.trial_id, result)
                self.on_event(self._describe(inflight, result))
                if result.outcome in RETRYABLE and inflight.attempt <= self.retries:
                    self.submit(inflight.candidate, phase=inflight.phase, node=inflight.node,
                                attempt=inflight.attempt + 1)
                    continue
                done_rows.append(self.store.trial(inflight.trial_id))
        return done_rows

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
        if not log.exists() and result.log_tail:
            log.parent.mkdir(parents=True, exist_ok=True)
            log.write_text(result.log_tail)

    @staticmethod
    def _describe(inflight: _InFlight, result: TrialResult) -> str:
        took = result.ended_at - result.started_at if result.ended_at else 0.0
        what = result.outcome.value if result.outcome is not Outcome.OK else "ok"
        extra = f": {result.detail}" if result.detail else ""
        return f"trial {inflight.trial_id} on {inflight.node} {what} in {took:.1f}s{extra}"
