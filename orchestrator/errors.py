"""Exceptions that carry an exit code, so every command maps failures the same way.

The CLI contract (DESIGN.md): exit 0 done, 2 bad input (one clear line on stderr, nothing
written), 1 failure, 3 finished but inconclusive. Raising one of these anywhere below the CLI is
how a module says which of those it is, without knowing about stderr or sys.exit.
"""

from __future__ import annotations


class SleuthError(Exception):
    """Base class: `exit_code` says how the CLI ends."""

    exit_code = 1


class UserError(SleuthError):
    """Bad input: unknown ref, wrong config key, patch that does not apply, ... (exit 2).

    The message is one sentence a user can act on; it is printed as-is on one line.
    """

    exit_code = 2


class Inconclusive(SleuthError):
    """The run finished but could not name a cause with the requested confidence (exit 3)."""

    exit_code = 3


class RunInterrupted(SleuthError):
    """The run cannot go on now but is not lost (exit 1): it is marked `interrupted`, every
    finished trial kept, and `sleuth resume RUN` finishes it later."""

    exit_code = 1


class DiskFull(RunInterrupted):
    """No space left where the run writes; resume once space is freed."""


class NodesLost(RunInterrupted):
    """Every node left the run and none came back in time; resume when they are back."""


class NodeBusy(SleuthError):
    """Every node the run would use is held by another sleuth run (exit 1): node state
    (its server, its clock policy) belongs to the run holding the node's lock."""

    exit_code = 1


class RayStartFailed(SleuthError):
    """The local Ray instance did not start (exit 1): nothing ran, so nothing is kept; the
    message says whether it failed or only ran out of Ray's own start-up time."""

    exit_code = 1


def did_you_mean(word: str, choices) -> str:
    """" (did you mean X?)" for a near miss among `choices`, else "": a typo in a key, metric,
    target or command is answered with the word meant, not only the list of all of them."""
    import difflib

    close = difflib.get_close_matches(str(word), [str(c) for c in choices], n=2, cutoff=0.6)
    if not close:
        return ""
    return f" (did you mean {' or '.join(close)}?)"
