"""Why fewer trials run at once than there are nodes, said once per run.

With `nodes=2` a user expects two servers at a time. An adaptive experiment (a bisect
verifying its culprit, an isolate deciding between two halves, a compare deciding whether to
measure more) often cannot choose its next trial before the running one's result is in, so a
node waits idle. That is right, but silent it reads as a bug: the controller notes when it waited
on results with an idle node and the experiment then submitted more (so it was not simply the
run's last trial), and says so once.
"""

from __future__ import annotations

from collections.abc import Sequence


class HeldBack:
    """Watches waits and submissions; :meth:`submitted` returns the one line to say, once."""

    def __init__(self) -> None:
        self._waited: tuple[int, int] | None = None  # (running, nodes) of a wait with idle nodes
        self.said = False

    def waiting(self, running: Sequence[int], nodes: int) -> None:
        """A wait begins with `running` trial ids in flight on `nodes` nodes."""
        if not self.said and running and len(running) < nodes:
            self._waited = (len(running), nodes)

    def submitted(self) -> str | None:
        """A new trial was submitted: the line to say when an earlier wait left nodes idle."""
        waited, self._waited = self._waited, None
        if waited is None or self.said:
            return None
        self.said = True
        running, nodes = waited
        return (f"{nodes - running} of {nodes} nodes stood idle while the experiment waited for a"
                " result: it chooses its next trials from the results so far, so fewer trials"
                " than nodes can run at once (said once)")
