"""NodeRunner: owns one node's worth of GPUs and runs one server at a time on it.

This is a plain class; the controller turns it into a Ray actor (only the controller knows about
Ray). Run it as a threaded actor (max_concurrency >= 2) so `status` and `abort` answer while a
trial runs; the lock guarantees that two trials never overlap on one node.

The node's state directory (`<runs_dir>/.nodes/<name>`: the running server's pid file, a clock
policy to restore, the sim's GPU state) belongs to one run at a time. The actor takes an
exclusive `flock` on `node.lock` before it touches anything there and holds it for its whole
life (the kernel drops it when the actor dies, however it dies), and writes who holds it
(`holder.json`: pid and its start time, host, run id). A second run on the same `runs_dir` finds
the node held, touches nothing, and says by whom: it can never take the first run's live
server for a leftover and kill it, nor set its clocks under the first run's trial.

The holder also names its controller. An actor whose controller is gone (SIGKILLed) is an
orphan that Ray is about to reap; a new run (or `sleuth resume` of the same one) waits for it,
and after `ORPHAN_WAIT_S` ends it, instead of refusing a node nobody uses any more.

Size: one actor class whose lock, holder record, orphan handling and trial loop share one
node's state; the trial's own steps are `trial.py` and `trial_checks.py`.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from orchestrator.config.settings import (
    BenchConf,
    TargetConf,
    bench_record,
    evolve,
    target_record,
)
from orchestrator.gpu.base import ClockPolicy, NoGpuControl
from orchestrator.records import Outcome, TrialResult, TrialState
from orchestrator.runner import visibility
from orchestrator.runner.holder import (
    HOLDER_FILE,
    NODE_LOCK,
    _alive,
    _orphaned,
    _read_json,
)
from orchestrator.runner.trial import TrialSpec, run_trial
from orchestrator.runner.trial_checks import clock_problem
from orchestrator.targets.base import NodeContext
from orchestrator.targets.registry import make_target
from orchestrator.util import wallclock
from orchestrator.util.files import write_atomic
from orchestrator.util.process import ServerProcess, group_members, start_time
from orchestrator.workspace import Workspace
from orchestrator.workspace.locking import release, try_exclusive

ORPHAN_WAIT_S = 20.0


class NodeRunner:
    def __init__(self, name: str, state_dir: str, target_conf: TargetConf | Mapping,
                 bench_conf: BenchConf | Mapping,
                 run_id: str = "", adopt: Sequence[str] = (), wait_s: float = 0.0,
                 controller: Mapping | None = None):
        self.name = name
        self.context = NodeContext(name=name, state_dir=Path(state_dir))
        # The directories this actor makes (its own, and `.nodes`): `discard` removes them
        # again when the run is refused before its first trial.
        self._made = [p for p in (self.context.state_dir, self.context.state_dir.parent)
                      if not p.exists()]
        self.context.state_dir.mkdir(parents=True, exist_ok=True)
        self.target_conf = target_record(target_conf)
        self.bench_conf = bench_record(bench_conf)
        self.target = make_target(self.target_conf, self.bench_conf, self.context)
        self._lock = threading.Lock()
        self._current: dict = {}
        self._proc: ServerProcess | None = None
        self._leftover_pgid: int | None = None
        self._aborted = False
        # One Workspace per (repository, cache) for the actor's life: it remembers the worktrees
        # it verified and the commits it resolved (see Workspace._is_intact).
        self._workspaces: dict[tuple[str, str, int | None], Workspace] = {}
        self.reaped: list[int] = []
        self.clock_restored = False
        # The node's GPUs, as its raylet was started; put back if Ray changed them for this
        # actor (every server inherits this process's environment).
        self.gpus = visibility.of_node()
        if self.gpus.changed:
            visibility.restore(self.gpus)
        self.controller = dict(controller or {})
        self.held_by = self._hold(run_id)
        if self.held_by is not None and _orphaned(self.held_by):
            wait_s = max(wait_s, ORPHAN_WAIT_S)
        deadline = time.monotonic() + wait_s  # a replacement waits for its predecessor to die
        while self.held_by is not None and time.monotonic() < deadline:
            time.sleep(0.2)
            self.held_by = self._hold(run_id)
        if self.held_by is not None and _orphaned(self.held_by):
            _end(self.held_by)  # still there: an actor nobody will ever use again
            self.held_by = self._hold(run_id)
        if self.held_by is None:  # ours: clean up what an earlier holder left behind
            self.reaped = self._reap_leftover(self._pidfile)
            self.clock_restored = self._restore_leftover_clock(self._clockfile)
            for other in adopt:
                self._adopt(Path(other))

    # -- holding the node ---------------------------------------------------------------------
    def _hold(self, run_id: str) -> dict | None:
        """Take the node for this actor's life; None on success, else who holds it."""
        lock = self.context.state_dir / NODE_LOCK
        holder = self.context.state_dir / HOLDER_FILE
        try:
            self._node_lock = try_exclusive(lock)
        except OSError as exc:  # a filesystem without flock: fall back on the holder file
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                raise
            self._node_lock = None
            doc = _read_json(holder)
            if doc and _alive(doc):
                return doc
        else:
            if self._node_lock is None:
                return _read_json(holder) or {"pid": None}
        pid = os.getpid()
        doc = {"pid": pid, "start_time": self._start_time(pid), "host": socket.gethostname(),
               "run_id": run_id, "since": wallclock.now(), "controller": self.controller}
        write_atomic(holder, json.dumps(doc))
        return None

    def _adopt(self, other: Path) -> None:
        """Clean up after a lost node of this host (a raylet that died and came back under a
        new Ray node id): its server, its clock policy, then its state directory."""
        if other.resolve() == self.context.state_dir.resolve() or not other.is_dir():
            return
        try:
            lock = try_exclusive(other / NODE_LOCK)
        except OSError:
            return
        if lock is None:
            return  # alive after all (another actor, maybe another run): not ours
        try:
            self.reaped += self._reap_leftover(other / "server.json")
            self.clock_restored |= self._restore_leftover_clock(other / "clock_restore.json")
            shutil.rmtree(other, ignore_errors=True)
        finally:
            release(lock)

    # A server outlives its node actor only if the actor was killed hard; the pidfile lets the
    # next actor on this node find and stop it before anything is measured.
    @property
    def _pidfile(self) -> Path:
        return self.context.state_dir / "server.json"

    _start_time = staticmethod(start_time)

    def _record_server(self, proc: ServerProcess | None) -> None:
        if proc is None:
            self._pidfile.unlink(missing_ok=True)
            return
        doc = {"pgid": proc.pgid, "port": proc.port, "start_time": self._start_time(proc.pid)}
        write_atomic(self._pidfile, json.dumps(doc))

    @property
    def _clockfile(self) -> Path:
        return self.context.state_dir / "clock_restore.json"

    def _record_clock(self, token: object) -> None:
        if token is None:
            self._clockfile.unlink(missing_ok=True)
            return
        write_atomic(self._clockfile, json.dumps(token))

    def _restore_leftover_clock(self, clockfile: Path) -> bool:
        """Undo a clock/power policy a killed actor applied and could not restore."""
        try:
            token = json.loads(clockfile.read_text())
        except (OSError, ValueError):
            return False
        self.target.gpu_control().restore(token)
        clockfile.unlink(missing_ok=True)
        return True

    def _reap_leftover(self, pidfile: Path) -> list[int]:
        """Kill the server group a previous actor left running on this node; return its pids."""
        try:
            doc = json.loads(pidfile.read_text())
        except (OSError, ValueError):
            return []
        pgid = int(doc.get("pgid", 0))
        pids = group_members(pgid) if pgid > 0 else []
        if pids and self._start_time(pgid) not in (None, doc.get("start_time")):
            pids = []  # the pid was reused by an unrelated process: not ours to kill
        if pids:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            deadline = time.monotonic() + 5
            while group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        pidfile.unlink(missing_ok=True)
        return pids

    def info(self) -> dict:
        return {"name": self.name, "hostname": socket.gethostname(), "pid": os.getpid(),
                "reaped": self.reaped, "clock_restored": self.clock_restored,
                "held_by": self.held_by,
                "gpus": {"meant": self.gpus.meant, "found": self.gpus.found,
                         "source": self.gpus.source, "changed": self.gpus.changed,
                         "describe": self.gpus.describe()}}

    def status(self) -> dict:
        return dict(self._current)

    def preflight(self, clocks: Sequence[str] = ()) -> str:
        """Empty if this node can run the target with these clock policies; else one line
        saying why not (a flag the installed server rejects, a clock the GPUs cannot do)."""
        if self.held_by is not None:
            return ""  # not ours: the controller reports who holds it
        problem = self.target.preflight() or ""
        if problem:
            return problem
        if self.gpus.meant == "" and not isinstance(self.target.gpu_control(), NoGpuControl):
            return (f"node {self.name}'s CUDA_VISIBLE_DEVICES is '' ({self.gpus.source}): its"
                    " servers would see no GPU; start it with the GPUs it should use, or unset")
        policies = [ClockPolicy.parse(c) for c in clocks]
        if any(not p.is_default for p in policies):
            snapshot = self.target.gpu_control().snapshot()
            for p in policies:
                why = clock_problem(p, snapshot)
                if why:
                    return f"{why} on node {self.name}"
        return ""

    def hello(self, clocks: Sequence[str] = ()) -> dict:
        """`info` and `preflight` in one round trip (a node joining a running run)."""
        return {**self.info(), "problem": self.preflight(clocks)}

    def _node_clean(self) -> str:
        """Empty if the previous server is gone; otherwise what is still there."""
        if self._leftover_pgid is None:
            return ""
        pids = group_members(self._leftover_pgid)
        if pids:
            try:
                os.killpg(self._leftover_pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            time.sleep(0.5)
            pids = group_members(self._leftover_pgid)
        if pids:
            return f"processes {pids} of the previous server are still running"
        self._leftover_pgid = None
        return ""

    def run(self, spec: TrialSpec) -> TrialResult:
        if self.held_by is not None:
            return TrialResult(Outcome.ERROR, f"node {self.name} is held by another run",
                               node=self.name)
        if not self._lock.acquire(blocking=False):
            # The controller never does this; refusing loudly beats overlapping two servers.
            return TrialResult(Outcome.ERROR, f"node {self.name} is busy with another trial",
                               node=self.name)
        try:
            dirty = self._node_clean()
            if dirty:
                return TrialResult(Outcome.ERROR, f"node {self.name} refused the trial: {dirty}",
                                   node=self.name, started_at=wallclock.now(), ended_at=wallclock.now())
            self._aborted = False
            self._current = {"trial_id": spec.trial_id, "state": TrialState.PENDING.value,
                             "since": wallclock.now(), "started": wallclock.now()}

            def on_state(state: TrialState) -> None:
                self._current.update(state=state.value, since=wallclock.now())

            def on_process(proc: ServerProcess | None) -> None:
                self._proc = proc
                self._record_server(proc)
                if proc is not None and self._aborted:
                    proc.teardown(grace_s=spec.grace_s)

            target = self.target
            if spec.candidate.server:  # server-settings factor: this trial's own target config
                conf = evolve(self.target_conf, spec.candidate.server_dict)
                target = make_target(conf, self.bench_conf, self.context)
            result, report = run_trial(spec, target, node=self.name, on_state=on_state,
                                       on_process=on_process, on_clock=self._record_clock,
                                       workspace=self._workspace, node_gpus=self.gpus.meant)
            if report is not None and report.leftover_pids:
                self._leftover_pgid = report.pgid  # checked (and killed) before the next trial
            if self._aborted and result.outcome is not Outcome.OK:
                result = TrialResult(
                    Outcome.INTERRUPTED, f"aborted: {result.detail}", states=result.states,
                    started_at=result.started_at, ended_at=result.ended_at, node=self.name,
                    fingerprint=result.fingerprint, log_tail=result.log_tail,
                )
            return result
        finally:
            self._current = {}
            self._lock.release()

    def _workspace(self, spec: TrialSpec) -> Workspace:
        key = (spec.repo, spec.cache_dir, spec.cache_max_bytes)
        ws = self._workspaces.get(key)
        if ws is None:
            ws = self._workspaces[key] = Workspace(spec.repo, spec.cache_dir,
                                                   max_bytes=spec.cache_max_bytes)
        return ws

    def close(self, timeout_s: float = 10.0) -> bool:
        """Give the node back before this actor is killed: once no trial runs (waiting up to
        `timeout_s`), drop the node lock and refuse any later trial. Without this the lock
        would be freed only when the killed actor's process is gone, and a next controller of
        the same command would find its own node held. False if a trial is still running."""
        if not self._lock.acquire(timeout=max(0.0, timeout_s)):
            return False  # kept: no trial can start after close
        self.target.close()  # an HTTP client a call outside a trial made
        if self.held_by is None:
            self.held_by = {"pid": os.getpid(), "closed": True}
            if self._node_lock is not None:
                release(self._node_lock)
                self._node_lock = None
            else:  # held through the holder file alone (a filesystem without flock)
                (self.context.state_dir / HOLDER_FILE).unlink(missing_ok=True)
        return True

    def discard(self) -> bool:
        """`close`, and remove the state directory if this actor made it: a run refused before
        its first trial (a clock the GPUs cannot do) leaves nothing behind. A directory that
        was there before (an earlier run's node state) stays. True if something was removed."""
        if not self.close(timeout_s=0.0) or not self._made or self.held_by.get("closed") is not True:
            return False
        shutil.rmtree(self._made[0], ignore_errors=True)
        for parent in self._made[1:]:
            try:
                parent.rmdir()  # only when empty: another node of the run may still be there
            except OSError:
                pass
        return True

    def abort(self) -> bool:
        """Tear down the running server now (Ctrl-C): the trial ends as interrupted."""
        self._aborted = True
        proc = self._proc
        if proc is None:
            return False
        proc.teardown(grace_s=5.0)
        return True


def _end(holder: Mapping) -> None:
    """SIGKILL an orphaned actor (its server dies with it: PR_SET_PDEATHSIG), then wait."""
    pid = int(holder["pid"])
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while _alive(holder) and time.monotonic() < deadline:
        time.sleep(0.05)
