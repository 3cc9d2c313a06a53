"""The final check of an investigation: measure the endpoints until the answer decides.

The answer's remainder is judged against the run's min effect
(:func:`orchestrator.answer.combine.decide`); a remainder whose interval reaches past it is
undecided, and more restarts of the endpoints narrow it. Three of seven real regressions that
were named right exited "not explained" because the endpoints had been measured too little, and
in one the good endpoint was measured only in the first minutes and the bad one later under
heavier host load, which invented a remainder. So the endpoints are measured interleaved (good,
bad, good, bad ...), side by side on the nodes, in one time window, and the total is read from
those restarts (:func:`orchestrator.commands.investigate._whole`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from orchestrator.control.controller import Controller
from orchestrator.records import Candidate, Outcome
from orchestrator.ui.progress import Progress

FINAL_PHASE = "final"
# Rounds (one restart of each endpoint) the final check runs at least when both endpoints can
# be measured now: two of each is the least a window's own interval needs.
FINAL_MIN_ROUNDS = 2


def final_check(ctl: Controller, order: Sequence[Candidate],
                answer_of: Callable[[list, dict | None], dict], budget: int, out,
                progress: Progress | None = None) -> dict:
    """Measure `order` round after round until the answer (`answer_of(rows, check)`) is no
    longer undecided, within `budget` restarts; returns the answer.

    With two endpoints (both measurable now) it runs at least :data:`FINAL_MIN_ROUNDS` rounds,
    so that the total comes from one time window. With one (a reference: "then" cannot be
    measured again) it runs only while the answer is undecided, a restart per node a round.
    A budget spent undecided is said in the sentence, with the interval; finished final-check
    restarts of an interrupted run count when it is resumed."""
    rows = ctl.store.trials()
    spent = [r for r in rows if r.phase == FINAL_PHASE and r.finished
             and r.outcome is not Outcome.INTERRUPTED]
    least = FINAL_MIN_ROUNDS * len(order) if len(order) > 1 else 0
    said = False
    while True:
        check = {"budget": budget, "spent": len(spent)} if budget else None
        result = answer_of(rows, check)
        if len(spent) >= budget or (len(spent) >= least and result["status"] != "undecided"):
            return result
        if not said:
            said = True
            why = ("the endpoints interleaved in one time window" if least else
                   "more restarts of the bad endpoint now")
            out.print(f"\n== final check: {why}, until the answer's interval decides (up to"
                      f" {budget} restarts) ==")
            if progress is not None:
                progress.set_total(None)
                progress.on_verdict("final check", None, None)
        batch = list(order) if len(order) > 1 else list(order) * max(len(ctl.nodes), 1)
        for cand in batch[:budget - len(spent)]:
            while not ctl.idle_nodes():
                spent += [r for r in ctl.wait() if r.phase == FINAL_PHASE]
            ctl.submit(cand, phase=FINAL_PHASE)
        while ctl.in_flight():
            spent += [r for r in ctl.wait() if r.phase == FINAL_PHASE]
        spent = [r for r in spent if r.outcome is not Outcome.INTERRUPTED]
        rows = ctl.store.trials()
