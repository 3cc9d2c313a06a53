"""Which GPUs a node's servers see: the ones the node was given, whatever Ray did.

A node's GPUs are whatever its own environment says: `CUDA_VISIBLE_DEVICES` as the node was
started (`ray start` under `CUDA_VISIBLE_DEVICES=0,1,2,3` for one GPU group of a machine), or
every GPU when it is unset. sleuth's node actor asks Ray for no GPU (it owns a whole node's
worth and starts one server on it), and Ray 2.40 up to 2.55 set `CUDA_VISIBLE_DEVICES=""` for
an actor that asks for none (`ray/_private/utils.py: set_visible_accelerator_ids`: 2.40.0
always; later releases behind `RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO`, which 2.56 turned off by
default and which still turns the old behaviour back on). A server started from such an actor
sees no GPU at all: SGLang would not start, or start on none.

Three layers, so that neither a Ray release nor a user's environment can move a trial onto
other GPUs without it being said:

- the controller sets `RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES=1` for the node actors
  (`ray/_private/accelerators/nvidia_gpu.py`: with it Ray never writes the variable, in every
  release this project allows): in the environment of the local Ray it starts, and in the
  actor's runtime environment on a cluster;
- the actor reads what its node meant from its parent, the raylet (whose environment is the
  one `ray start` had) and puts it back in its own environment if Ray changed it anyway;
- each trial checks, unless the run sets the variable itself (`env.CUDA_VISIBLE_DEVICES`),
  that the node actor's own value, which its servers inherit, is what the node meant
  (`env_mismatch` otherwise, before anything is launched: never a measurement, never a launch
  failure blamed on the candidate), and records what the running server has
  (`/proc/<pid>/environ`): a launcher on the way may set it on purpose (a node's wrapper
  choosing its GPUs, the simulated node's login environment), but one that leaves the server
  no GPU of a node that has some is `env_mismatch` too;
- a node whose own value hides every GPU (`CUDA_VISIBLE_DEVICES=""` in its raylet's
  environment) is refused when it starts, for targets that run on GPUs.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from pathlib import Path

VAR = "CUDA_VISIBLE_DEVICES"
NOSET = "RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES"
# The switch of Ray 2.40-2.55's behaviour (on by default there, off from 2.56).
OVERRIDE_ON_ZERO = "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO"


def _environ(pid: int) -> dict[str, str] | None:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _is_raylet(pid: int) -> bool:
    try:
        argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0", 1)[0]
    except OSError:
        return False
    return os.path.basename(argv0.decode(errors="replace")) == "raylet"


@dataclass(frozen=True)
class Visibility:
    """What a node meant (`meant`: its `CUDA_VISIBLE_DEVICES`, None for unset: every GPU),
    where that was read, and what this process had when it looked (`found`)."""

    meant: str | None
    found: str | None
    source: str

    @property
    def changed(self) -> bool:
        return self.meant != self.found

    def describe(self) -> str:
        return "every GPU (CUDA_VISIBLE_DEVICES unset)" if self.meant is None else \
            f"CUDA_VISIBLE_DEVICES={self.meant!r}"


def of_node(environ: Mapping[str, str] | None = None, parent: int | None = None,
            read_environ: Callable[[int], dict[str, str] | None] = _environ,
            is_raylet: Callable[[int], bool] = _is_raylet) -> Visibility:
    """The node's GPUs: its raylet's `CUDA_VISIBLE_DEVICES` when this process is a Ray worker
    (Ray may have changed this process's own), else this process's."""
    own = (os.environ if environ is None else environ).get(VAR)
    parent = os.getppid() if parent is None else parent
    if is_raylet(parent):
        env = read_environ(parent)
        if env is not None:
            return Visibility(env.get(VAR), own, f"the raylet's environment (pid {parent})")
    return Visibility(own, own, "this process's environment")


def restore(visibility: Visibility, environ: MutableMapping[str, str] | None = None) -> None:
    """Put the node's value back in this process's environment (which servers inherit)."""
    environ = os.environ if environ is None else environ
    if visibility.meant is None:
        environ.pop(VAR, None)
    else:
        environ[VAR] = visibility.meant


def problem(node: str, meant: str | None, found: str | None, whose: str = "the server's"
            ) -> str:
    """Why `whose` GPUs are not its node's (one line), or ""."""
    if found == meant:
        return ""
    seen = "unset (every GPU)" if found is None else repr(found)
    want = "unset (every GPU)" if meant is None else repr(meant)
    hint = " (no GPU at all: Ray hides them from an actor that asks for none)" \
        if found == "" else ""
    return (f"{whose} CUDA_VISIBLE_DEVICES is {seen}{hint}, but node {node}'s is {want}: the"
            " server would run on other GPUs than the node's")


def ray_note(version: str, environ: Mapping[str, str] | None = None) -> str:
    """What the installed Ray does to an actor's `CUDA_VISIBLE_DEVICES`, in words (`doctor`)."""
    env = os.environ if environ is None else environ
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    override = env.get(OVERRIDE_ON_ZERO)  # Ray reads it as true for "1" or "true" only
    # Before 2.56 it blanks by default (2.40.0 reads no variable at all); from 2.56 only when
    # the variable turns it back on.
    blanks = (major, minor) < (2, 56) or (override is not None
                                          and override.lower() in ("1", "true"))
    what = ("sets CUDA_VISIBLE_DEVICES='' for an actor that asks for no GPU"
            + (f" ({OVERRIDE_ON_ZERO}={override})" if override is not None else "")
            if blanks else "leaves CUDA_VISIBLE_DEVICES of an actor that asks for no GPU alone")
    return (f"{what}; sleuth's node actors run with {NOSET}=1, so their servers see the"
            " node's own GPUs")
