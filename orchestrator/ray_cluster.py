"""Connecting to Ray: the part of the controller that knows Ray's process model and quirks.

Kept beside `controller.py` and `node_pool.py` (with them, the only code that imports Ray) so
the scheduling code reads without the start-up details:

- a local instance binds to loopback only and runs in a session of its own, so the terminal's
  Ctrl-C reaches the controller and not Ray's gcs/raylet (which would die under it and turn a
  clean interrupt into a traceback);
- a cluster address is probed before Ray is asked to connect: Ray retries an unreachable head
  for minutes and ignores Ctrl-C meanwhile, sleuth says so in one line within seconds.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Mapping

import ray

from orchestrator.errors import UserError

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

    services.ConsolePopen = OwnSessionPopen


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
        if address != "auto":
            probe(str(address), float(cluster.get("connect_timeout_s") or 30.0))
        try:
            ray.init(address=address, log_to_driver=False, namespace="sleuth",
                     logging_level=logging.WARNING)
        except (ConnectionError, ValueError, RuntimeError) as exc:
            msg = " ".join(str(exc).split())[:200]
            raise UserError(f"cannot connect to the Ray cluster at {address}: {msg}") from exc
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
