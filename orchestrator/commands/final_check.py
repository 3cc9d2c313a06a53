"""The final check of an investigation: measure the endpoints until the answer decides.

The answer's remainder is judged against the run's min effect
(:func:`orchestrator.answer.combine.decide`); a remainder whose interval reaches past it is
undecided, and more restarts of the endpoints narrow it. Three of seven real regressions that
were named right exited "not explained" because the endpoints had been measured too little, and
in one the good endpoint was measured only in the first minutes and the bad one later under
heavier host load, which invented a remainder. So the endpoints are measured interleaved (good,
bad, good, bad ...), side by side on the nodes, in one time window, and the total is read from
those restarts (:func:`orchestrator.commands.investigate_answer.whole`).

A remainder is the total less every named cause, and each of those estimates has its own
restarts: with a reference ("then" cannot be measured again), restarts of the bad endpoint
alone narrow only the total's share of the remainder's interval, and on the seed's story (three
causes) twelve of them left it undecided. So after its first rounds the check measures, round
by round, the two sides of whichever term (the total, or one cause) an added restart narrows
most: with the restart noise pooled over the run, that is the term whose sides have the fewest
restarts (:func:`next_round`), and the causes' effects are read again from every restart of
their two sides (:func:`refreshed`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from statistics import NormalDist

from orchestrator.control.controller import Controller
from orchestrator.records import Candidate, Outcome
from orchestrator.run import findings
from orchestrator.stats.min_effect import ANSWER_CONFIDENCE
from orchestrator.store import TrialRow
from orchestrator.system.watch import epochs, latest_epoch
from orchestrator.ui.progress import Progress

FINAL_PHASE = "final"
# Rounds (one restart of each endpoint) the final check runs at least when both endpoints can
# be measured now: two of each is the least a window's own interval needs.
FINAL_MIN_ROUNDS = 2
# The most restarts a planned check spends (`experiment.params.final_trials` unset): past it
# the check says up front how far its restarts can narrow the remainder, and that is the
# bound the answer states.
FINAL_MAX_TRIALS = 48


def final_check(ctl: Controller, endpoints: Sequence[Candidate],
                answer_of: Callable[[list, dict | None], dict], budget: int | None, out,
                progress: Progress | None = None, metric: str = "") -> dict:
    """Measure until the answer (`answer_of(rows, check)`) is no longer undecided, within
    `budget` restarts; returns the answer.

    With two endpoints (both measurable now) the first :data:`FINAL_MIN_ROUNDS` rounds measure
    them interleaved whatever the answer, so that the total comes from one time window; with
    one (a reference) the check runs only while the answer is undecided. Every later round
    measures the term an added restart narrows most (:func:`next_round`). All of it within
    one system epoch: when the node's system changes during the check, its restarts from
    before are set aside (never pooled with those after) and the endpoints are measured
    again on the new state (:func:`owed`), within the same budget; a budget spent first
    leaves the total from the last epoch that measured them, which the answer states as not
    comparable. A budget spent undecided is said in the sentence, with the interval; finished
    final-check restarts of an interrupted run count when it is resumed.

    `budget` None (`experiment.params.final_trials` unset): the check plans its restarts from
    the noise the run measured (:func:`plan`), as many as the remainder's interval needs to
    reach the min effect, at most :data:`FINAL_MAX_TRIALS`; when that cannot reach it, it
    says so up front with the resolution it can reach, and the answer states that bound. A
    fixed twelve left most right answers undecided in 5% restart noise, and on a busy node
    (20-30%) no count near it could decide."""
    rows = ctl.store.trials()
    spent = [r for r in rows if r.phase == FINAL_PHASE and r.finished
             and r.outcome is not Outcome.INTERRUPTED]
    said = False
    cap = FINAL_MAX_TRIALS if budget is None else budget
    planned: dict | None = None
    while True:
        limit = cap if planned is None else planned["budget"]
        check = {"budget": limit, "spent": len(spent)} if cap else None
        if check and planned and planned.get("resolution"):
            check["resolution"] = planned["resolution"]
        aside = set_aside(rows)
        if check and aside:
            check["set_aside"] = aside
        result = answer_of(rows, check)
        missing = owed(rows, endpoints, metric)
        if not cap or len(spent) >= limit or (not missing and not _open(result)):
            return result
        floor = None if missing or len(endpoints) > 1 else reference_floor(result)
        if check and floor is not None:  # no restart now can decide it: say so, spend none
            return answer_of(rows, {**check, "floor": floor})
        if planned is None and not missing:
            planned = plan(rows, result, metric, cap=cap, spent=len(spent),
                           window=len(endpoints) > 1, fixed=budget is not None)
            if planned["budget"] <= len(spent):
                continue
        if not said:
            said = True
            _announce(out, progress, len(endpoints), limit, planned)
        batch = list(endpoints) if missing else next_round(
            rows, result, endpoints, metric, window=len(endpoints) > 1)
        if len(batch) == 1:
            batch *= max(len(ctl.nodes), 1)
        spent = _measure(ctl, batch[:limit - len(spent)], spent)
        rows = ctl.store.trials()


def _announce(out, progress: Progress | None, n_endpoints: int, limit: int,
              planned: dict | None) -> None:
    """The check's first restart: what it measures, until when, and its plan."""
    lead = "the endpoints interleaved in one time window, then " if n_endpoints > 1 else ""
    out.print(f"\n== final check: {lead}whichever estimate an added restart narrows"
              f" most, until the answer's interval decides (up to {limit} restarts) ==")
    if planned is not None and planned.get("line"):
        out.print(planned["line"])
    if progress is not None:
        progress.set_total(None)
        progress.on_verdict("final check", None, None)


def _measure(ctl: Controller, batch: Sequence[Candidate], spent: list) -> list:
    """One round of the check on every node; returns the check's restarts so far (an
    interrupted one does not count)."""
    for cand in batch:
        while not ctl.idle_nodes():
            spent += [r for r in ctl.wait() if r.phase == FINAL_PHASE]
        ctl.submit(cand, phase=FINAL_PHASE)
    while ctl.in_flight():
        spent += [r for r in ctl.wait() if r.phase == FINAL_PHASE]
    return [r for r in spent if r.outcome is not Outcome.INTERRUPTED]


def _open(answer: Mapping) -> bool:
    """Is the remainder still undecided against the min effect (whatever the answer's status:
    causes that carry the change read "explained" while the check may still narrow it)?"""
    if answer.get("status") == "undecided":
        return True
    return (answer.get("unexplained") or {}).get("decision") == "undecided"


def _terms(rows: Sequence[TrialRow], answer: Mapping, metric: str, window: bool) -> list[dict]:
    """The remainder's variance terms an added restart can narrow: the total (restarts now
    of its measurable endpoints; with a reference "then" is fixed) and each cause whose two
    sides the run measured, with their variances and restart counts."""
    out = []
    whole = answer.get("total") or {}
    log, n = whole.get("log"), whole.get("n")
    if (isinstance(log, list | tuple) and len(log) == 3 and math.isfinite(float(log[1]))
            and isinstance(n, list | tuple) and len(n) == 2 and all(n)):
        fixed = [] if window else [int(n[0])]  # "then" cannot be measured again
        now = [int(n[0]), int(n[1])] if window else [int(n[1])]
        out.append({"var": float(log[1]) ** 2, "fixed": fixed, "now": now})
    now_rows = latest_epoch(rows)
    for cause in answer.get("causes") or []:
        keys, clog = cause.get("keys") or [], cause.get("log")
        if len(keys) != 2 or not (isinstance(clog, list | tuple) and len(clog) == 3):
            continue
        counts = [len(findings.trial_values(now_rows, k, metric)) for k in keys]
        if all(counts) and math.isfinite(float(clog[1])):
            out.append({"var": float(clog[1]) ** 2, "fixed": [], "now": counts})
    return out


def _scaled(term: dict, add: int) -> float:
    """A term's variance after `add` more restarts on each side measured now."""
    inverse = sum(1.0 / c for c in term["fixed"]) + sum(1.0 / c for c in term["now"])
    after = sum(1.0 / c for c in term["fixed"]) + sum(1.0 / (c + add) for c in term["now"])
    return term["var"] * after / inverse if inverse > 0 else term["var"]


def plan(rows: Sequence[TrialRow], answer: Mapping, metric: str, *, cap: int, spent: int,
         window: bool, fixed: bool = False) -> dict:
    """How many restarts the check needs, from the noise the run measured: added greedily to
    the term that narrows the remainder most per restart (as :func:`next_round` chooses),
    until the remainder's 95% half-width (normal quantile) reaches the min effect, or the cap.

    Returns `{"budget": restarts in all, "needed": ..., "resolution": {"pct", "sigma_pct"}
    (when the cap cannot reach the min effect: the half-width it reaches), "line": what the
    run says up front}`. A fixed budget (`final_trials=N`) is kept as given; the plan then
    only says what it can reach."""
    z = NormalDist().inv_cdf(0.5 + ANSWER_CONFIDENCE / 2.0)
    bound_pct = (answer.get("min_effect") or {}).get("pct")
    terms = _terms(rows, answer, metric, window)
    if not terms or not isinstance(bound_pct, int | float):
        return {"budget": cap, "needed": None}
    # An estimate off zero needs a narrower interval to fit within the min effect; one near
    # the bound would need it without end, so at most half the min effect is asked for.
    rest = (answer.get("unexplained") or {}).get("log") or [0.0]
    bound = math.log1p(bound_pct / 100.0)
    target = max(bound - abs(float(rest[0])), 0.5 * bound)
    added = [0] * len(terms)
    used = spent

    def half() -> float:
        return z * math.sqrt(sum(_scaled(t, a) for t, a in zip(terms, added, strict=True)))

    while half() > target and used < cap:
        cost = [len(t["now"]) for t in terms]
        gains = [(_scaled(t, a) - _scaled(t, a + 1)) / c
                 for t, a, c in zip(terms, added, cost, strict=True)]
        best = max(range(len(terms)), key=gains.__getitem__)
        if gains[best] <= 0:
            break
        added[best] += 1
        used += cost[best]
    reached = half()
    first = terms[0]
    inverse = sum(1.0 / c for c in first["fixed"] + first["now"])
    sigma = math.sqrt(first["var"] / inverse) if inverse > 0 else math.nan
    out: dict = {"budget": cap if fixed else max(min(used, cap), spent), "needed": None}
    if reached <= target:
        out["needed"] = used - spent
        out["line"] = (f"at the restart noise measured ({100 * sigma:.1f}% a restart), about"
                       f" {used - spent} more restarts resolve the remainder to the"
                       f" {bound_pct:.1f}% min effect")
    else:
        pct = 100.0 * math.expm1(reached)
        out["resolution"] = {"pct": round(pct, 2), "sigma_pct": round(100 * sigma, 2)}
        out["line"] = (f"at the restart noise measured ({100 * sigma:.1f}% a restart), the"
                       f" final check's {cap} restarts can resolve the remainder to +-{pct:.1f}%"
                       f" only, not to the {bound_pct:.1f}% min effect: more repetitions"
                       " (bench.repetitions), a quieter node or experiment.params.final_trials"
                       "=N would narrow it; the answer states that bound")
    return out


def reference_floor(answer: Mapping) -> dict | None:
    """With a reference, the half-width its own restarts alone keep in the remainder's
    interval however often "now" is measured, when that rules out every decision the current
    estimate leaves open; None otherwise.

    The total's variance is s^2 (1/n_then + 1/n_now) with the run's pooled restart noise s;
    restarts now shrink only the second term (and the causes' terms, both of whose sides are
    measured now), so the interval's half-width never drops below z s / sqrt(n_then).
    "Explained" needs the interval within +-the min effect, so a floor past the min effect
    rules it out; "a remainder" needs the estimate farther than the min effect plus the floor
    from zero, and the estimate still moves as restarts now narrow the rest of its interval
    (two of that part's standard errors are allowed for). With the estimate inside that, the
    final check would spend its whole budget to end where it started: a one-restart reference
    in 2.5% noise has a floor of 4.9%, past a 4% min effect. The normal quantile (the limit of
    the t the answer uses) keeps the floor a lower bound. `experiments/final_check_floor.py`:
    no decision lost in 24 settings of 2000 runs, 12.0 -> 1.4 restarts against a one-restart
    reference with nothing left to explain."""
    total, rest = answer.get("total") or {}, answer.get("unexplained") or {}
    log, n, bound = total.get("log"), total.get("n"), (answer.get("min_effect") or {}).get("pct")
    if not (isinstance(log, list | tuple) and len(log) == 3 and isinstance(n, list | tuple)
            and len(n) == 2 and isinstance(bound, int | float) and rest.get("log")):
        return None
    _, se, _ = log
    n_then, n_now = n
    if not (n_then and n_now and math.isfinite(se) and se > 0):
        return None
    sigma = se / math.sqrt(1.0 / n_then + 1.0 / n_now)
    z = NormalDist().inv_cdf(0.5 + ANSWER_CONFIDENCE / 2.0)
    floor = z * sigma / math.sqrt(n_then)
    limit = math.log1p(bound / 100.0)
    # What the estimate may still move as restarts now narrow the rest of its interval.
    movable = 2.0 * math.sqrt(max(float(rest["log"][1]) ** 2 - (floor / z) ** 2, 0.0))
    if floor <= limit or abs(float(rest["log"][0])) + movable > limit + floor:
        return None
    return {"pct": round(100.0 * math.expm1(floor), 2), "n_then": int(n_then)}


def _gain(counts: Sequence[int]) -> float:
    """How much one more restart on each side narrows a difference's variance, per restart,
    in units of the (pooled) restart variance: `1/n - 1/(n+1)` a side."""
    return sum(1.0 / n - 1.0 / (n + 1) if n > 0 else 1.0 for n in counts) / len(counts)


def next_round(rows: Sequence[TrialRow], answer: Mapping, endpoints: Sequence[Candidate],
               metric: str, *, window: bool) -> list[Candidate]:
    """One restart on each side of the remainder's term that an added restart narrows most:
    the total (its measurable endpoints; with `window`, counted in the final check's window
    only, which is where its total is read) or a cause (the two candidates its effect
    compares, found among the run's trials). Restarts count on the latest system epoch only:
    the answer reads its estimates there."""
    by_key = {r.candidate.key: r.candidate for r in rows}
    now = latest_epoch(rows)
    scope = [r for r in now if r.phase == FINAL_PHASE] if window else now
    total = answer.get("total") or {}
    terms = [(_gain([len(findings.trial_values(scope, c.key, metric)) for c in endpoints]),
              _unit_variance(total.get("log"), total.get("n")), list(endpoints))]
    for cause in answer.get("causes") or []:
        keys = cause.get("keys") or []
        if len(keys) == 2 and all(k in by_key for k in keys):
            counts = [len(findings.trial_values(now, k, metric)) for k in keys]
            terms.append((_gain(counts), _unit_variance(cause.get("log"), counts),
                          [by_key[k] for k in keys]))
    # A term's own noise where every term states it: a cause measured within server
    # lifetimes (a paired power limit) has almost none, and a restart of its sides narrows
    # the remainder by nothing; else (equal pooled noise) the counts alone decide.
    if all(v is not None for _, v, _ in terms):
        return max(terms, key=lambda t: t[0] * t[1])[2]
    return max(terms, key=lambda t: t[0])[2]


def _unit_variance(log, counts) -> float | None:
    """A term's noise per restart, `se^2 / sum(1/n)` (log scale), from its `[diff, se, df]`
    and the restarts behind each side; None when not stated."""
    if not (isinstance(log, list | tuple) and len(log) == 3 and isinstance(counts, list | tuple)):
        return None
    inverse = math.fsum(1.0 / n for n in counts if n)
    se = float(log[1])
    return se * se / inverse if inverse > 0 and math.isfinite(se) else None


def refreshed(doc: Mapping | None, rows: Sequence[TrialRow], metric: str) -> Mapping | None:
    """A step's findings with each cause's effect on `metric` read again from every restart
    of the two candidates it compares on the latest system epoch, where the final check
    measured one of them there (the same estimator the step used; a bisect's outlier restarts
    stay out). A cause whose two sides were not both measured on that epoch keeps the step's
    own effect: restarts of two systems are never pooled into one."""
    if not doc:
        return doc
    rows = latest_epoch(rows)
    measured = {r.candidate.key for r in rows if r.phase == FINAL_PHASE}
    exclude = frozenset(o["trial"] for o in doc.get("outliers") or []
                        if o.get("trial") is not None)
    out = []
    for f in doc.get("findings") or []:
        keys = (f.get("before_key"), f.get("after_key"))
        if f.get("probability") is not None and all(keys) and measured & set(keys):
            e = findings.effects_between(rows, keys[0], keys[1], metrics=(metric,),
                                         exclude=exclude).get(metric)
            if e and "log" in e:
                f = {**f, "effect_detail": {**(f.get("effect_detail") or {}), metric: e}}
        out.append(f)
    return {**doc, "findings": out}


def owed(rows: Sequence[TrialRow], endpoints: Sequence[Candidate],
         metric: str) -> list[Candidate]:
    """The endpoints the check must measure before it reads a total: with two, those with
    fewer than :data:`FINAL_MIN_ROUNDS` final-check restarts on the latest system epoch (its
    one time window); with one (a reference), only once the node's system changed, the
    endpoint when the new state has fewer than that many of its restarts."""
    parts = epochs(rows)
    if len(endpoints) > 1:
        scope = [r for r in parts[-1] if r.phase == FINAL_PHASE]
    elif len(parts) > 1:
        scope = parts[-1]
    else:
        return []
    return [c for c in endpoints
            if len(findings.trial_values(scope, c.key, metric)) < FINAL_MIN_ROUNDS]


def set_aside(rows: Sequence[TrialRow]) -> int:
    """Final-check restarts measured before the node's latest system change: kept in the
    store, never pooled with the new state's."""
    return sum(1 for part in epochs(rows)[:-1] for r in part
               if r.phase == FINAL_PHASE and r.outcome is not None and r.outcome.measured)


def total_rows(rows: Sequence[TrialRow], keys: Sequence[str],
               metric: str) -> tuple[list[TrialRow], bool]:
    """The rows a total is read from, all of one system epoch: the latest one where every
    endpoint in `keys` was measured, and whether that is the latest epoch (False: the total is
    from before the node's change and not comparable with what was measured after it). The
    latest epoch, marked current, when none holds them all."""
    parts = epochs(rows)
    for n, part in enumerate(reversed(parts)):
        if all(findings.trial_values(part, k, metric) for k in keys):
            return part, n == 0
    return parts[-1], True
