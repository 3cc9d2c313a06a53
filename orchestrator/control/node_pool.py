"""The node actors of one run: which are ready, which are starting, which were lost.

Part of the controller (with `controller.py` and `ray_cluster.py`, the only code that knows
Ray). Nodes come and go: a local node whose actor died gets a fresh one at once; on a cluster
the pool looks for `sleuth_node` Ray nodes every few seconds and starts an actor on any that
(re)joined, so a node that comes back is used again. A node starts asynchronously (`hello`: its
info and preflight in one call), so a joining node never stalls trials running elsewhere; one
that another run holds, or whose preflight fails, is left alone with one line.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

import ray

from orchestrator.control.ray_cluster import NODE_RESOURCE, node_name, sleuth_nodes
from orchestrator.control.settings import ControlSettings
from orchestrator.errors import NodeBusy, NodesLost, UserError
from orchestrator.runner.holder import held_message
from orchestrator.runner.node import NodeRunner
from orchestrator.runner.visibility import NOSET
from orchestrator.util.process import start_time
from orchestrator.util.safe_text import printable

SCAN_INTERVAL_S = 2.0
# How long stopping waits for each actor to give its node back before killing it.
CLOSE_WAIT_S = 10.0
# A fresh actor for a lost local node waits this long for its predecessor's node lock.
REPLACEMENT_WAIT_S = 15.0


class NodePool:
    def __init__(self, settings: ControlSettings, run_id: str, on_event: Callable[[str], None]):
        self.settings = settings
        self.runs_dir = settings.runs_dir
        self.run_id = run_id
        self.clocks = list(settings.clocks)
        self.on_event = on_event
        self.want = settings.nodes
        self.actors: dict[str, object] = {}  # ready to run trials
        # cluster=ray: node name -> (Ray node id, address) the node's actor is pinned to.
        self.placement: dict[str, tuple[str, str]] = {}
        self._joining: dict[object, tuple[str, object]] = {}  # hello ref -> (name, actor)
        self._refused: set[str] = set()  # joined but unusable (held by another run, preflight)
        self._dead_ids: set[str] = set()  # Ray node ids that could not take an actor again
        self._next_scan = 0.0
        self._alone_since: float | None = None
        # This process, as its actors record it: an actor whose controller is gone is an
        # orphan a later run may end rather than be refused by it.
        self.controller = {"pid": os.getpid(), "start_time": start_time(os.getpid()),
                           "host": socket.gethostname()}

    # -- start ---------------------------------------------------------------------------------
    def start(self) -> None:
        """Start every node and wait for it; bad input a node reports is a UserError, every
        node held by another run is NodeBusy (some held: those are skipped, with a line)."""
        actors = {name: self._new_actor(name) for name in self._names()}
        refs = {name: a.hello.remote(self.clocks) for name, a in actors.items()}
        hellos: dict[str, dict] = {}
        gone: dict[str, str] = {}  # an actor that died before its first answer: why
        for name, ref in refs.items():
            try:
                hellos[name] = ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                gone[name] = first_line(exc)
        problem = next((h["problem"] for h in hellos.values() if h.get("problem")), "")
        if problem:  # bad input: the run is refused, and the nodes' new state goes with it
            _discard([actors[n] for n, h in hellos.items() if not h.get("held_by")])
            for actor in actors.values():
                _kill(actor)
            raise UserError(problem)
        held = []
        for name, hello in hellos.items():
            if hello.get("held_by"):
                held.append(held_message(name, hello["held_by"]))
                ray.kill(actors[name])
                continue
            self.actors[name] = actors[name]
            self._say_hello(hello)
        if held and not self.actors and not gone:
            raise NodeBusy(held[0] + ": wait for that run to finish (a node's server and"
                           " clocks belong to the run holding it)")
        for line in held:
            self.on_event(f"{line}: not used")
        if gone and not self.actors:  # nothing to run on: the run stops, resumable
            for name in gone:
                _kill(actors[name])
            name, why = next(iter(gone.items()))
            raise NodesLost(f"node {name} was lost before its first trial ({why})"
                            + (f", and {len(gone) - 1} more" if len(gone) > 1 else ""))
        for name, why in gone.items():  # the others run; a lost node is looked for again
            self.actors[name] = actors[name]
            self.lost(name, f"before its first trial ({why})")

    def _names(self) -> list[str]:
        """`local-<i>` actors on the local Ray; on a cluster, one per `sleuth_node` Ray node."""
        if self.settings.cluster.kind != "ray":
            return [f"local-{i}" for i in range(self.want)]
        offered = sleuth_nodes()
        if not offered:
            raise UserError(f"no Ray node offers the {NODE_RESOURCE!r} resource: start each GPU"
                            " node with ray start --address HEAD:PORT --resources"
                            f" '{{\"{NODE_RESOURCE}\": 1}}'")
        if len(offered) < self.want:
            self.on_event(f"nodes={self.want} but the cluster offers {len(offered)} sleuth"
                          f" node(s): using {len(offered)}")
        return [self._place(node) for node in offered[:self.want]]

    def _place(self, node: Mapping) -> str:
        name = node_name(node)
        self.placement[name] = (node["NodeID"], node.get("NodeManagerAddress", ""))
        return name

    def _new_actor(self, name: str, adopt: tuple[str, ...] = (), wait_s: float = 0.0):
        target, bench = self.settings.target, self.settings.bench
        state_dir = self.runs_dir / ".nodes" / name
        options: dict = {"num_cpus": 0, "max_concurrency": 4, "max_restarts": 0}
        if name in self.placement:  # pinned to its Ray node; the resource admits one actor
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            options["resources"] = {NODE_RESOURCE: 1}
            options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(
                self.placement[name][0], soft=False)
            # A cluster node's workers have the environment of its `ray start`: this keeps
            # Ray from hiding the node's GPUs from the actor (`runner/visibility.py`). It costs
            # a worker started for the actor (a few seconds, once per node).
            options["runtime_env"] = {"env_vars": {NOSET: "1"}}
        return ray.remote(NodeRunner).options(**options).remote(
            name, str(state_dir), target, bench, self.run_id, adopt, wait_s, self.controller)

    def _say_hello(self, hello: Mapping) -> None:
        gpus = hello.get("gpus") or {}
        if gpus.get("changed"):
            self.on_event(f"node {hello['name']}: Ray had set CUDA_VISIBLE_DEVICES="
                          f"{gpus.get('found')!r} for its actor; its servers get the node's own"
                          f" ({gpus.get('describe')}, from {gpus.get('source')})")
        if hello.get("reaped"):
            self.on_event(f"node {hello['name']}: stopped a server left running by an"
                          f" earlier controller (pids {hello['reaped']})")

    # -- leave and join ------------------------------------------------------------------------
    def lost(self, name: str, why: str) -> None:
        """A node's actor (or its Ray node) died: drop it, and look for it again."""
        actor = self.actors.pop(name, None)
        if actor is not None:
            _kill(actor)
        self.on_event(f"node {name} lost: {why}")
        if name not in self.placement:  # a local node: a fresh actor; it reaps what is left
            fresh = self._new_actor(name, wait_s=REPLACEMENT_WAIT_S)
            self._joining[fresh.hello.remote(self.clocks)] = (name, fresh)
        else:
            self._next_scan = 0.0  # look for it (or another node) again right away

    def may_grow(self) -> bool:
        """Whether a node can still join (worth waiting for when none is left)."""
        return bool(self._joining) or self.settings.cluster.kind == "ray"

    def poll(self) -> None:
        """Admit nodes that finished starting; on a cluster, start actors on sleuth nodes that
        (re)joined; give up when no node has been there for `cluster.rejoin_timeout_s`."""
        if self._joining:
            ready, _ = ray.wait(list(self._joining), num_returns=len(self._joining), timeout=0)
            for ref in ready:
                self._admit(ref)
        now = time.monotonic()
        if (self.placement and now >= self._next_scan
                and len(self.actors) + len(self._joining) < self.want):
            self._next_scan = now + SCAN_INTERVAL_S
            self._scan()
        if self.actors:
            self._alone_since = None
            return
        wait_s = self.settings.cluster.rejoin_timeout_s
        if self._alone_since is None:
            self._alone_since = now
            self.on_event(f"no node left: waiting up to {wait_s:g}s for a sleuth node to join")
        elif now - self._alone_since > wait_s:
            raise NodesLost(f"every node was lost and none joined again within {wait_s:g}s")

    def _admit(self, ref) -> None:
        name, actor = self._joining.pop(ref)
        try:
            hello = ray.get(ref)
        except Exception as exc:  # its Ray node is gone for good
            if name in self.placement:
                self._dead_ids.add(self.placement[name][0])
            self.on_event(f"node {name} cannot run trials any more: {first_line(exc)}")
            return
        problem = (held_message(name, hello["held_by"]) if hello.get("held_by")
                   else hello.get("problem"))
        if problem:
            self._refused.add(name)
            self.on_event(f"{problem}: node {name} not used")
            _kill(actor)
            return
        self.actors[name] = actor
        self._say_hello(hello)
        self.on_event(f"node {name} joined the run")

    def _scan(self) -> None:
        alive = [n for n in sleuth_nodes() if n["NodeID"] not in self._dead_ids]
        names = {node_name(n) for n in alive}
        starting = {name for name, _ in self._joining.values()}
        for node in alive:
            if len(self.actors) + len(self._joining) >= self.want:
                return
            name = node_name(node)
            if name in self.actors or name in self._refused or name in starting:
                continue
            self._place(node)
            # State a lost node of this host left (its server, its clocks) is this one's to
            # clean up, unless that node is alive (its lock says so, see NodeRunner._adopt).
            host = name.rsplit("-", 1)[0]
            adopt = tuple(str(d) for d in sorted((self.runs_dir / ".nodes").glob(f"{host}-*"))
                          if d.is_dir() and d.name not in names)
            actor = self._new_actor(name, adopt)
            self._joining[actor.hello.remote(self.clocks)] = (name, actor)

    def kill_all(self, close_s: float = CLOSE_WAIT_S) -> None:
        """End every actor. Each first gives its node back (`NodeRunner.close`: once no trial
        runs, it drops the node lock), so a next controller in this process finds the node
        free at once instead of held until the killed actor's process is gone; an actor that
        does not answer within `close_s` is killed all the same (the kernel frees its lock).
        An actor still joining is killed without being asked: it may be blocked waiting for its
        node lock, and a close queued behind that would hold the stop for all of `close_s`."""
        actors = [*self.actors.values(), *(a for _, a in self._joining.values())]
        closing = []
        for actor in self.actors.values():
            try:
                closing.append(actor.close.remote(close_s))
            except Exception:
                pass
        if closing:
            try:
                ray.wait(closing, num_returns=len(closing), timeout=close_s)
            except Exception:
                pass
        for actor in actors:
            _kill(actor)
        self.actors.clear()
        self._joining.clear()


def first_line(exc: BaseException) -> str:
    """One line for a Ray error. An actor whose constructor raised carries the whole
    traceback in its message: its last line (the exception itself) is what says why."""
    text = printable(str(exc))
    if "creation task" in text and "\n" in text:
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        return f"{type(exc).__name__}: {' '.join(lines[-1].split())[:300]}"
    text = " ".join(text.split()) or type(exc).__name__
    return f"{type(exc).__name__}: {text[:200]}"


def _discard(actors: list) -> None:
    """Ask actors of a refused run to remove the node state they made (best effort)."""
    try:
        ray.get([a.discard.remote() for a in actors], timeout=CLOSE_WAIT_S)
    except Exception:
        pass


def _kill(actor) -> None:
    try:
        ray.kill(actor)
    except Exception:
        pass
