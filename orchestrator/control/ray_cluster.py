"""Connecting to Ray: the part of the controller that knows Ray's process model and quirks.

Kept beside `controller.py` and `node_pool.py` (with them, the only code that imports Ray) so
the scheduling code reads without the start-up details:

- a local instance binds to loopback only and runs in a session of its own, so the terminal's
  Ctrl-C reaches the controller and not Ray's gcs/raylet (which would die under it and turn a
  clean interrupt into a traceback);
- a cluster address is probed before Ray is asked to connect: Ray retries an unreachable head
  for minutes and ignores Ctrl-C meanwhile, sleuth says so in one line within seconds;
- the start-up is on every command's critical path, so a local instance starts lean (no
  dashboard head, autoscaler monitor or log monitor; one prestarted worker per node) and once
  per process: every controller of a command uses it, and it stops when the process exits.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import ray

from orchestrator.errors import RayStartFailed, UserError

# A Ray node runs trials only if it offers this custom resource (one unit: one trial at a time):
#   ray start --address HEAD:6379 --resources '{"sleuth_node": 1}'
NODE_RESOURCE = "sleuth_node"


def loopback_only() -> None:
    """Make a local Ray instance bind every service to 127.0.0.1, in its own session.

    On Linux Ray turns "127.0.0.1" into the host's routable address and listens on all
    interfaces, which would expose an unauthenticated-by-default cluster to the network. Ray
    keeps loopback only when its cluster mode is off, which it reads from this constant at
    call time (it is the switch behind RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER)."""
    import ray._private.ray_constants as ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False
    own_session()
    # Recent Ray turns token authentication on for a new local cluster (good) and says so in a
    # warning on every command (noise between sleuth's own lines): keep the first, drop the
    # second. Its other warnings (auth disabled, for one) still show.
    logging.getLogger("ray._private.authentication.authentication_token_setup").addFilter(
        lambda record: "Token authentication is enabled" not in record.getMessage())


def own_session() -> None:
    """Start the processes of a local Ray instance (gcs, raylet, agents) in a new session.

    Ray starts them with SIGINT blocked, but they unblock it, and they share the controller's
    process group: a Ctrl-C at the terminal killed them under the controller, so the second
    Ctrl-C ended in a Ray traceback and exit 1 instead of 130. In a session of their own they
    hear only the controller (which stops them), and still die with it (Ray sets
    PR_SET_PDEATHSIG on them). Ray has no option for this; `ConsolePopen` is the one class it
    starts them with, so it is wrapped once."""
    import ray._private.services as services

    base = services.ConsolePopen
    if getattr(base, "sleuth_own_session", False):
        return

    class OwnSessionPopen(base):  # type: ignore[misc, valid-type]
        sleuth_own_session = True

        def __init__(self, *args, **kwargs):
            kwargs["start_new_session"] = True
            super().__init__(*args, **kwargs)
            argv = args[0] if args else kwargs.get("args")
            if isinstance(argv, list | tuple) and argv and str(argv[0]).endswith("raylet"):
                watch_raylet(self.pid)

    services.ConsolePopen = OwnSessionPopen


def watch_raylet(pid: int) -> None:
    """Start `raylet_watch.py` for a local raylet: its agents end when it does (see there)."""
    import subprocess
    import sys
    from pathlib import Path

    try:
        subprocess.Popen([sys.executable, "-S", str(Path(__file__).with_name("raylet_watch.py")),
                          str(pid)], cwd="/", start_new_session=True,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    except OSError:
        pass  # without it the agents still go, a minute later


# Where the messages Ray publishes to the driver go instead of the console (see below).
RAY_MESSAGES = logging.getLogger("orchestrator.ray")


def quiet_driver_messages() -> None:
    """Keep the error messages Ray publishes to every driver off the console.

    When a node is lost its agents publish the last 20 lines of its raylet log (`[state-dump]`
    tables, about 40 lines for two agents), and Ray's driver prints whatever is published to
    stdout, burying the one line sleuth prints for the same event ("node ... lost: ... runs
    again"). sleuth reports every such event itself; the messages go to the `orchestrator.ray`
    logger (not shown unless configured), and Ray's logs stay in its session directory.
    `listen_error_messages` looks `print_to_stdstream` up at each message, so it is wrapped
    once, for every Ray this process connects to."""
    import ray._private.worker as worker

    base = worker.print_to_stdstream
    if getattr(base, "sleuth_quiet", False):
        return

    def print_to_stdstream(data, ignore_prefix: bool = False, **kwargs):
        if data.get("pid") != "raylet":  # a worker's own output: as Ray prints it
            return base(data, ignore_prefix=ignore_prefix, **kwargs)
        for line in data.get("lines") or ():
            RAY_MESSAGES.info("%s", line)

    print_to_stdstream.sleuth_quiet = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = print_to_stdstream


def probe(address: str, timeout_s: float) -> None:
    """Refuse, in one line, an address where nothing accepts a connection."""
    hostport = address.strip().split("://", 1)[-1].split("/", 1)[0]  # ray://HOST:PORT too
    host, sep, port = hostport.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise UserError(f"cluster.address {address!r} is not HOST:PORT")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        if isinstance(exc, TimeoutError | socket.timeout):
            why = f"no answer within {timeout_s:g}s"
        raise UserError(f"cannot reach the Ray cluster at {address}: {why}") from None


# Head processes a private local instance does without (`lean_head`): the dashboard head
# (with include_dashboard=False Ray still starts it, for usage-stats reporting only), the
# autoscaler monitor (nothing autoscales a one-machine instance) and the log monitor (it only
# streams worker logs to the driver, and log_to_driver is off; the logs stay in the session
# directory). Each is a Python process that imports Ray (about a CPU-second each, on the cores
# the first trial needs) and `ray.init` waits for the dashboard head to publish its address.
LEAN_SKIPS = ("start_api_server", "start_monitor", "start_log_monitor")


@contextmanager
def lean_head() -> Iterator[None]:
    """Start the next local Ray head without the processes in `LEAN_SKIPS`.

    Ray has no option for this (`ray start` has hidden ones, `ray.init` none), so the three
    `Node` methods are no-ops while this is active and restored after. Should a Ray release
    rename them, nothing is skipped and Ray starts as usual."""
    try:
        from ray._private.node import Node
    except ImportError:  # pragma: no cover - a Ray without the module: start as usual
        yield
        return
    saved = {name: Node.__dict__[name] for name in LEAN_SKIPS if name in Node.__dict__}
    try:
        for name in saved:
            setattr(Node, name, lambda self, *args, **kwargs: None)
        yield
    finally:
        for name, method in saved.items():
            setattr(Node, name, method)


def local_workers(cluster: Mapping, nodes: int | None) -> int | None:
    """`num_cpus` for the local instance: the configured value, or else as many as there are
    nodes. Ray prestarts one Python worker per CPU while it starts; sleuth's node actors take
    no CPU resource and each needs exactly one worker, so more than `nodes` of them only load
    the machine while the first trial waits."""
    configured = cluster.get("num_cpus")
    if configured:
        return int(configured)
    if nodes:
        return max(1, min(int(nodes), os.cpu_count() or 1))
    return None


# The Ray this process started or connected to, and for which settings. It is kept for the
# whole command, not one controller's life: a command that runs controllers one after the other
# (the demo: the reference measurement, then now) starts its local instance once. It stops when
# the process exits (`stop_owned`, at exit) or when a later controller wants another cluster.
_owned: tuple[tuple, str] | None = None
_exit_hook = False


def _settings(cluster: Mapping, nodes: int | None) -> tuple:
    kind = cluster.get("kind", "local")
    if kind == "local":
        return (kind, local_workers(cluster, nodes))
    return (kind, cluster.get("address") or "auto")


def _instance() -> str:
    """Which running Ray this is (its GCS address), so another one is never taken for ours."""
    try:
        return str(ray.get_runtime_context().gcs_address)
    except Exception:  # pragma: no cover - not initialized after all
        return ""


def stop_owned() -> None:
    """Shut down the Ray this process started, if it still runs; signals are ignored meanwhile
    (a Ctrl-C inside ray.shutdown() leaves Ray's core worker half torn down, and it then ends
    the process with exit 1 instead of the exit code the command chose)."""
    global _owned
    owned, _owned = _owned, None
    if owned is None or not ray.is_initialized() or _instance() != owned[1]:
        return
    main = threading.current_thread() is threading.main_thread()
    saved = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM)
             } if main else {}
    try:
        ray.shutdown()
    except Exception:
        pass
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def start_ray(cluster: Mapping, nodes: int | None = None) -> bool:
    """Connect to (or start) Ray, once per process. Returns True when this call started it.

    A Ray already running in this process is used as it is when this process did not start it
    (a test session's, an embedding program's) or when it was started for the same settings;
    one this process started for other settings is stopped first."""
    global _owned, _exit_hook
    want = _settings(cluster, nodes)
    if ray.is_initialized():
        if _owned is None or _owned[1] != _instance():
            _owned = None
            return False  # not ours: used as it is, as ever
        if _owned[0] == want:
            return False
        stop_owned()
    _connect(cluster, nodes)
    _owned = (want, _instance())
    if not _exit_hook:
        atexit.register(stop_owned)  # runs before Ray's own exit hook (registered earlier)
        _exit_hook = True
    return True


# Ray gives its own processes a fixed 30 s to register (`raylet_start_wait_time_s`, not
# configurable); on a loaded host (a GPU node's CPUs busy with an investigation) that runs out
# now and then. One more try is what a user would do by hand.
START_TRIES = 2


def start_timed_out(exc: BaseException) -> bool:
    """Ray's start ran out of its own time (as opposed to failing outright)."""
    return isinstance(exc, TimeoutError) or "timed out" in str(exc).lower()


@contextmanager
def gpus_left_alone() -> Iterator[None]:
    """Start the next local Ray with `RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1` in its
    environment (its raylet and every worker inherit it): Ray 2.40-2.55 would otherwise set
    `CUDA_VISIBLE_DEVICES=""` for the node actors, which ask for no GPU, and hide every GPU
    from the servers they start (`runner/visibility.py`). Set for the start only: the
    variable is Ray's, not this process's. A worker started later by a runtime environment
    gets it from the actor's options (`node_pool`)."""
    from orchestrator.runner.visibility import NOSET

    saved = os.environ.get(NOSET)
    os.environ[NOSET] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(NOSET, None)
        else:
            os.environ[NOSET] = saved


def start_local(**options) -> None:
    """Start a private local Ray instance (lean, loopback only), trying once more when Ray's
    start-up timed out. Failure is one line (`RayStartFailed`, exit 1), never a traceback."""
    loopback_only()
    for attempt in range(1, START_TRIES + 1):
        try:
            # address="local": a private instance even when another Ray runs on this machine
            # (without it Ray joins the last cluster started here, or RAY_ADDRESS).
            with lean_head(), gpus_left_alone():
                ray.init(address="local", include_dashboard=False,
                         _node_ip_address="127.0.0.1",  # nothing listens beyond loopback
                         **options)
            return
        except Exception as exc:
            try:
                ray.shutdown()  # whatever half started
            except Exception:
                pass
            slow = start_timed_out(exc)
            if slow and attempt < START_TRIES:
                continue
            detail = " ".join(str(exc).split())[:160] or type(exc).__name__
            if slow:
                raise RayStartFailed(
                    f"Ray did not finish starting within its own time limit, {START_TRIES} tries"
                    f" ({detail}); this machine is busy ({load_note()}): run again when it is"
                    " quieter, or point cluster=ray at a running Ray") from exc
            raise RayStartFailed(f"Ray could not start on this machine: {detail}") from exc


def load_note() -> str:
    try:
        return f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs"
    except OSError:
        return "load unknown"


def _connect(cluster: Mapping, nodes: int | None) -> None:
    quiet_driver_messages()
    if cluster.get("kind", "local") == "local":
        start_local(
            num_cpus=local_workers(cluster, nodes),
            log_to_driver=False,
            logging_level=logging.WARNING,  # not "Started a local Ray instance" every run
            namespace="sleuth",
        )
    elif cluster.get("kind") == "ray":
        # No address: Ray's own discovery (RAY_ADDRESS, or a head started on this machine).
        address = cluster.get("address") or "auto"
        if address != "auto":
            probe(str(address), float(cluster.get("connect_timeout_s") or 30.0))
        try:
            ray.init(address=address, log_to_driver=False, namespace="sleuth",
                     logging_level=logging.WARNING)
        except Exception as exc:  # Ray raises many types here (timeouts among them): one line
            msg = " ".join(str(exc).split())[:200] or type(exc).__name__
            raise UserError(f"cannot connect to the Ray cluster at {address}: {msg}") from exc
    else:
        raise UserError(f"unknown cluster.kind {cluster.get('kind')!r} (known: local, ray)")


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
