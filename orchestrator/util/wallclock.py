"""Timestamps that a wall-clock change cannot bend.

Every duration and timeout in sleuth is measured on `time.monotonic()`. What is *recorded*
needs a wall-clock time (a trial's start and end, its states, a GPU sample) so that a human,
a report and another process can place it; but a recorded start and end are also subtracted
later (a trial's cost, the ETA, the run's timeline), and an NTP step, a VM resuming or an
administrator's `date -s` between the two would turn a 40 s trial into minus an hour.

`now()` is the wall clock as this process first read it plus the monotonic time since: it
never goes backwards, differences between two readings are exact durations, and it is off from
the wall clock only by the steps the wall clock took while the process ran (seconds, at most
what NTP corrects). Records are ordered by their ids, never by these times.
"""

from __future__ import annotations

import time

_WALL0 = time.time()
_MONO0 = time.monotonic()


def now() -> float:
    """Seconds since the epoch for a record: monotonic within this process."""
    return _WALL0 + (time.monotonic() - _MONO0)
