"""Exit codes: one rule for every command, and the exceptions that carry one.

The rule (README "Exit codes", `sleuth help exit-codes`, both read from :data:`EXIT_CODES` and
:data:`COMMAND_EXITS` here) starts from what the user asked. A CI job keys on it, so the same
situation gives the same code whatever command ran into it:

- 0: answered. The named causes hold the run's confidence, no remainder beyond the min effect
  is shown and they demonstrably carry the change (the remainder's interval cannot hold half
  of it; the answer states how much may be left); or nothing is reproducibly slower; or the
  question has another decided answer (the reference reproduces, no setting beats the
  baseline by more than the min effect).
- 3: finished, not fully answered: a remainder beyond the min effect is shown, a change is
  shown and nothing was named (or what was named does not carry it), or the run stopped at its
  budget with a best guess.
- 4: undecided: the run could decide nothing it was asked (not even whether there is a change).
- 5: the node's system changed during the run: the answer says what was measured again and
  what is not comparable.
- 1 a failure, 2 bad input (one line on stderr, nothing written), 130 interrupted (resumable).

Every command that ends with an answer maps it with :func:`answer_exit`; raising one of the
exceptions below anywhere under the CLI is how a module says it failed, without knowing about
stderr or sys.exit. Kept free of imports: the CLI reads it before anything heavy is loaded.
"""

from __future__ import annotations

from collections.abc import Mapping

ANSWERED = 0
FAILURE = 1
BAD_INPUT = 2
INCONCLUSIVE = 3
UNDECIDED = 4
SYSTEM_CHANGED = 5
INTERRUPTED = 130

# (code, name, what it means for every command), in the order the tables print them.
EXIT_CODES: tuple[tuple[int, str, str], ...] = (
    (ANSWERED, "answered", "the question is answered: the named causes carry the change (no"
     " remainder beyond the min effect is shown; the answer says how much may be left), or"
     " nothing is reproducibly slower, or the command's own question has a decided answer"),
    (FAILURE, "failure", "the run failed (a trial that cannot run, a lost node, a full disk:"
     " resumable where it says so)"),
    (BAD_INPUT, "bad input", "one line on stderr, nothing written"),
    (INCONCLUSIVE, "not fully answered", "a remainder beyond the min effect is shown, or a"
     " change is shown and no cause carries it, or the run stopped at its budget with a best"
     " guess"),
    (UNDECIDED, "undecided", "the run could decide nothing it was asked (not even whether"
     " there is a change): more restarts, a quieter node or more repetitions would"),
    (SYSTEM_CHANGED, "system changed", "the node's system changed during the run: the answer"
     " opens with it and names what is not comparable; run again on a node that holds still"),
    (INTERRUPTED, "interrupted", "Ctrl-C or SIGTERM: the answer so far is stored; sleuth"
     " resume RUN continues"),
)

# Per command: which codes it gives and when (the codes every command shares, 1, 2 and 130,
# are not repeated). `tests/test_exit_codes.py` runs each mapping and checks the README's table
# against this one.
COMMAND_EXITS: dict[str, dict[int, str]] = {
    "investigate": {
        ANSWERED: "explained (up to x% may be left, said with its interval), or no change"
                  " larger than the min effect",
        INCONCLUSIVE: "a remainder beyond the min effect shown, a change with no cause that"
                      " carries it, or a step stopped at its budget",
        UNDECIDED: "not even the change is decided",
        SYSTEM_CHANGED: "the node changed during the run"},
    "bisect": {
        ANSWERED: "the culprit(s) named and carrying the change; or the range holds no change"
                  " larger than the min effect, or (was=, reference=) under half the change"
                  " chased",
        INCONCLUSIVE: "a change shown and not pinned (budget spent with a best guess,"
                      " reversed, a remainder beyond the min effect)",
        UNDECIDED: "whether the range changed is undecided (an endpoint not measurable, the"
                   " 48-a-side cap)",
        SYSTEM_CHANGED: "the node changed during the run"},
    "isolate": {
        ANSWERED: "the differences that cause it named and carrying the change, or good and"
                  " bad measure alike",
        INCONCLUSIVE: "a remainder beyond the min effect, a change no named difference"
                      " carries, or stopped at its budget or cap",
        UNDECIDED: "nothing decided",
        SYSTEM_CHANGED: "the node changed during the run"},
    "compare": {
        ANSWERED: "the reference reproduces",
        INCONCLUSIVE: "it does not reproduce: a change is shown, no cause named (isolate"
                      " tests the differences)",
        UNDECIDED: "undecided against the reference's restarts",
        SYSTEM_CHANGED: "the node changed during the run"},
    "sweep": {
        ANSWERED: "a setting beats the baseline, the baseline is best, or no setting measured"
                  " beats it by more than the min effect",
        UNDECIDED: "the best setting's interval against the baseline decides neither",
        SYSTEM_CHANGED: "the node changed during the run"},
    "trial": {
        ANSWERED: "every restart measured",
        SYSTEM_CHANGED: "the node changed between its restarts (not one reference)"},
    "demo": {ANSWERED: "the answer matches the planted truth",
             INCONCLUSIVE: "it does not"},
    "resume": {ANSWERED: "as the resumed command"},
    "report": {ANSWERED: "the report was written"},
    "scenario": {ANSWERED: "the scenario was written or applied"},
    "doctor": {ANSWERED: "every check passed (or is slow)", FAILURE: "a check failed"},
}

# Answer statuses (`orchestrator/answer/compose.py`) that answer the question as asked.
_ANSWERED_STATUSES = frozenset({"explained", "no_change", "not_in_code", "found",
                                "baseline_best", "no_better"})
_SHOWN_STATUSES = frozenset({"partly_explained", "unexplained", "reversed"})


def answer_exit(answer: Mapping | None) -> int:
    """The exit code of a command that ended with `answer` (an answer document of
    :mod:`orchestrator.answer`), by the one rule above."""
    if not answer:
        return UNDECIDED
    status = str(answer.get("status") or "")
    if status == "system_changed" or answer.get("system_changed"):
        return SYSTEM_CHANGED
    if status == "provisional":  # stopped before its end: a best guess is not an answer
        stop = answer.get("provisional") or {}
        before = str(stop.get("status") or "")
        decided = bool(answer.get("causes")) or before not in ("undecided", "")
        return INCONCLUSIVE if decided else UNDECIDED
    if status in _ANSWERED_STATUSES:
        return ANSWERED
    if status in _SHOWN_STATUSES:
        return INCONCLUSIVE
    if status in ("undecided", "inconclusive"):
        return INCONCLUSIVE if answer.get("causes") else UNDECIDED
    return INCONCLUSIVE


def exit_table(command: str | None = None, width: int = 80) -> str:
    """The table `sleuth help exit-codes` prints: every code, then each command's mapping."""
    import textwrap

    def item(head: str, text: str) -> list[str]:
        return textwrap.wrap(text, width, initial_indent=head,
                             subsequent_indent=" " * len(head)) or [head]

    lines = ["exit codes (one rule for every command):", ""]
    for code, name, what in EXIT_CODES:
        lines += item(f"  {code:>3}  ", f"{name}: {what}")
    lines += ["", "per command (1, 2 and 130 as above):"]
    for name, codes in COMMAND_EXITS.items():
        if command is not None and name != command:
            continue
        for code, when in codes.items():
            lines += item(f"  {name:<11} {code:>3}  ", when)
    return "\n".join(lines)


class SleuthError(Exception):
    """Base class: `exit_code` says how the CLI ends."""

    exit_code = 1


class UserError(SleuthError):
    """Bad input: unknown ref, wrong config key, patch that does not apply, ... (exit 2).

    The message is one sentence a user can act on; it is printed as-is on one line.
    """

    exit_code = 2


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
