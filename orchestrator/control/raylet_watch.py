"""`python raylet_watch.py RAYLET_PID`: end a local raylet's agents the moment it dies.

Run as a plain script (it imports neither Ray nor sleuth: it starts in milliseconds). Why it
exists: a local Ray instance's gcs_server and raylet die with the controller (Ray sets
PR_SET_PDEATHSIG, SIGKILL, on them), but the raylet's DashboardAgent and RuntimeEnvAgent are
the raylet's children, not the controller's. They notice the raylet is gone within a second,
find no "Raylet received SIGTERM" in its log, and try to publish its last log lines to the
driver through the GCS, which died too: `publish_error_to_driver` waits its fixed 60 s timeout
(ray/_private/utils.py) before they exit. After a SIGKILLed controller they lived on for a
minute, holding memory and the session directory.

The agents and the workers stay in the raylet's session (the raylet leads a session of its
own, see `ray_cluster.own_session`; a server under test starts one of its own). When the
raylet is gone this kills what is left in that session (the workers would follow within
seconds anyway), then exits. A session id cannot be given to a new process while the session
still has members, so the members found are the raylet's, never a stranger.
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time


def members(sid: int) -> list[int]:
    """Processes of session `sid` (the raylet's pid): its agents and workers."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[3]) == sid:
            found.append(int(entry))
    return found


def wait_gone(pid: int) -> None:
    """Return once `pid` has exited (a pidfd where the kernel has them, else polling)."""
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        while os.path.exists(f"/proc/{pid}"):
            time.sleep(0.2)
        return
    try:
        select.select([fd], [], [])
    finally:
        os.close(fd)


def main(argv: list[str]) -> int:
    raylet = int(argv[1])
    wait_gone(raylet)
    for pid in members(raylet):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
