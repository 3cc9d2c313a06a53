"""Localization benchmark: how many server restarts does each method need to find a culprit,
and is it right when it says so?

Cases (:mod:`experiments.localize_cases`): N=256 commits, the culprit(s) at seeded random
positions, a trial at commit ``i`` returns ``base x (1 + effect for every culprit i descends
from) x noise``. Regimes: the clean ones of the first benchmark (``seed_verify``,
``decode_like``, ``subtle``, ``heavy_tail``, ``no_change``) and the noise real machines make:
``outliers`` (5% of restarts at 3x on a log-normal decode_like), ``drift`` (+3% per 100 trials
and a +10% load step lasting 30 trials), ``two_culprits`` (+30% and +15%), ``staircase``
(three +6% steps), ``up_down`` (+50%, then a later -30% partial fix) and ``dag`` (a merge-heavy
history in topological order, bisected over the full graph), ``no_change_drift`` (no culprit on
the drifting node) and ``three_steps`` (+20%, then +8%, then a -5% partial fix). In
``no_change`` and ``no_change_drift`` the range holds no culprit (the regression lies outside
it): the right answer is "not reproducible".

Every method sees the same noise for the j-th trial at a given commit, through the same
``propose``/``verdict`` loop the controller uses. All trials count.

Methods: ``sleuth`` (:class:`BisectStrategy`, confidence 0.99), ``sleuth_ref`` (told a
reference run's level: the good endpoint's, or in the no-change regimes a level 8% below both
endpoints, the regression outside the range), ``sleuth_k4`` (four trials per round), ``bisect`` (classic: endpoints once, threshold halfway, one trial per step; on the graph
in ``dag`` like ``git bisect``) and ``bayesect`` (Beta-Bernoulli bisection of the git_bayesect
package on thresholded trials, over the topological order). Two references, not methods
(:mod:`experiments.reference_oracle`): ``oracle`` is told the true endpoint levels and noise;
``oracle_placed`` is sleuth with its search points placed by that oracle.

What counts as right: with one culprit, naming it (status ``found``) and no other commit at
P >= 0.99; with several, every step named or lying in a part of the range the verdict reports
as unexplained (a remainder whose interval excludes zero, or "spread over" a sub-range), and no
wrong commit at P >= 0.99. The peers name one commit: for them a true step of any of the
culprits counts. ``wrong_confident`` is the share of cases naming a wrong commit at P >= 0.99;
``effect_coverage`` the share of named true steps whose stated effect interval holds the
planted effect.

Run: ``python -m experiments.bench_localize`` (``CASES=20`` for a quick run, ``WORKERS`` for the
number of processes, default 2; ``REGIMES=subtle,no_change`` for some regimes, run in that
order; ``METHODS=sleuth,bayesect`` for some methods; ``JOURNAL=path.jsonl`` appends every
finished case there and skips those already in it, so a long run can be resumed). Writes
``runs/bench-localize.json``:
``{regime: {method: {"accuracy", "mean_trials", "p90_trials", "mean_rounds", ...}}}``, where
``statuses`` counts how the runs ended.

Size: a benchmark script (methods, driver, summaries and the table), not product code.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys

# Many small dense solves per decision: a thread pool per process only costs time here.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from multiprocessing import Pool
from pathlib import Path

import numpy as np

from experiments.localize_cases import (
    BASE_VALUE,
    N_COMMITS,
    REGIMES,
    SEED,
    Case,
    Regime,
    VirtualOracle,
    regime,
)
from experiments.peers import (
    BAYESECT_IMPLEMENTATION,
    BayesectStrategy,
    ThresholdBisectStrategy,
)
from experiments.reference_oracle import KnownLevelsOracle, OraclePlacedBisect
from orchestrator.strategies import BisectSettings, BisectStrategy, Observation, Strategy, Verdict

__all__ = ["BASE_VALUE", "MAX_TRIALS", "N_COMMITS", "REGIMES", "SEED", "Regime",
           "VirtualOracle", "drive", "run_benchmark", "regime"]

MAX_TRIALS = 1500  # safety net: a method that needs more is counted as failing at this many
CONFIDENT = 0.99

# In `no_change` the range holds no culprit: the right answer is "not reproducible". Only
# sleuth and classic bisect take part: the known-levels reference has no levels to be told,
# and bayesect has no "no change" answer, so it runs every case to MAX_TRIALS (measured: 40 of
# 40).
NO_CHANGE_METHODS = frozenset({"sleuth", "sleuth_ref", "bisect"})


@dataclass(frozen=True)
class Method:
    name: str
    k: int
    build: Callable[[Regime, Case], Strategy]


def _sleuth(regime: Regime, case: Case) -> Strategy:
    return BisectStrategy(N_COMMITS, confidence=0.99, max_trials=MAX_TRIALS,
                          parents=case.parents)


# The change a reference run measured: in the regimes with culprits the good endpoint's level
# (every culprit lies after it); in `no_change` the regression lies before the range, a +8%
# one, so the reference reads that much lower than both endpoints.
OUTSIDE_REGRESSION = 0.08


def _sleuth_ref(regime: Regime, case: Case) -> Strategy:
    """sleuth told a reference run's level (``sleuth bisect`` with a reference run): the
    change being chased bounds how much evidence "not reproducible" needs."""
    reference = case.level(0) if regime.effects else BASE_VALUE / (1.0 + OUTSIDE_REGRESSION)
    return BisectStrategy(N_COMMITS, confidence=0.99, max_trials=MAX_TRIALS,
                          parents=case.parents, reference_value=reference)


def _sleuth_thorough(regime: Regime, case: Case) -> Strategy:
    """sleuth with every unexplained part's anchors measured 8 times whatever the evidence:
    what telling small further steps from noise costs when it is paid in every run."""
    return BisectStrategy(N_COMMITS, confidence=0.99, max_trials=MAX_TRIALS,
                          parents=case.parents,
                          settings=BisectSettings(remainder_min_trials=THOROUGH_TRIALS))


THOROUGH_TRIALS = 8

# An earlier run on the same node: this many restarts of one commit, measured with the
# regime's noise (an independent stream), give sleuth's posterior its noise prior.
PRIOR_RESTARTS = 13


def earlier_run_noise(regime: Regime, case: Case) -> tuple[float, float]:
    """``(sigma, df)`` on the log scale from :data:`PRIOR_RESTARTS` restarts of the good
    commit in an earlier run (another seed), its 3x outlier restarts left out as the product's
    noise prior leaves out flagged ones."""
    earlier = VirtualOracle(regime, 100_000 + case.case_seed[2])
    logs = np.log([earlier.measure(0) for _ in range(PRIOR_RESTARTS)])
    logs = logs[np.abs(logs - np.median(logs)) < math.log(2.0)]
    return float(np.std(logs, ddof=1)), float(logs.size - 1)


def _sleuth_prior(regime: Regime, case: Case) -> Strategy:
    """sleuth given the noise an earlier run on the node measured (``noise_prior``)."""
    return BisectStrategy(N_COMMITS, confidence=0.99, max_trials=MAX_TRIALS,
                          parents=case.parents, noise_prior=earlier_run_noise(regime, case))


def _bisect(regime: Regime, case: Case) -> Strategy:
    return ThresholdBisectStrategy(N_COMMITS, parents=case.parents)


def _levels(case: Case) -> tuple[float, float]:
    return case.level(0), case.level(N_COMMITS - 1)


def _oracle(regime: Regime, case: Case) -> Strategy:
    good, bad = _levels(case)
    return KnownLevelsOracle(N_COMMITS, good, bad, regime.cv, confidence=0.99,
                             max_trials=MAX_TRIALS, parents=case.parents,
                             outlier_rate=regime.outlier_rate,
                             outlier_factor=regime.outlier_factor)


def _oracle_placed(regime: Regime, case: Case | None = None) -> Strategy:
    case = case or Case(regime, 0)
    good, bad = _levels(case)
    return OraclePlacedBisect(N_COMMITS, good, bad, regime.cv, confidence=0.99,
                              max_trials=MAX_TRIALS, parents=case.parents,
                              outlier_rate=regime.outlier_rate,
                              outlier_factor=regime.outlier_factor)


def _bayesect(regime: Regime, case: Case) -> Strategy:
    return BayesectStrategy(
        N_COMMITS, confidence=0.99, endpoint_trials=BAYESECT_ENDPOINT_TRIALS, max_trials=MAX_TRIALS
    )


BAYESECT_ENDPOINT_TRIALS = 2
METHODS = (
    Method("sleuth", 1, _sleuth),
    Method("sleuth_ref", 1, _sleuth_ref),
    Method("sleuth_k4", 4, _sleuth),
    Method("sleuth_thorough", 1, _sleuth_thorough),
    Method("bisect", 1, _bisect),
    Method("bayesect", 1, _bayesect),
    Method("oracle", 1, _oracle),  # a reference that is told the levels, not a method
    Method("oracle_placed", 1, _oracle_placed),  # sleuth with the oracle's search placement
    Method("sleuth_prior", 1, _sleuth_prior),  # last: journals key methods by their index
)
CHEAP = frozenset({"bisect", "bayesect", "oracle"})  # milliseconds per case: scheduled last
SLEUTHS = frozenset({"sleuth", "sleuth_ref", "sleuth_prior", "sleuth_k4", "sleuth_thorough", "oracle_placed"})
# The thorough variant answers a question about several culprits; in the other regimes it is
# run where it shows its price (one clean regime).
THOROUGH_REGIMES = frozenset({"two_culprits", "staircase", "up_down", "decode_like"})


@dataclass(frozen=True)
class CaseResult:
    correct: bool
    trials: int
    rounds: int
    stated: float
    status: str
    wrong_confident: bool = False
    steps_named: int = 0
    steps_covered: int = 0
    steps_true: int = 0
    effects_named: int = 0
    effects_covered: int = 0
    outliers_planted: int = 0
    outliers_flagged: int = 0
    steps_not_ruled_out: int = 0
    first_culprit_trials: int | None = None
    # Every step of at least 1.5 noise widths named, reported unexplained, or left open in a
    # reported part whose interval reaches its size (None for runs judged before this field).
    large_steps_accounted: bool | None = None


def drive(strategy: Strategy, oracle: VirtualOracle, k: int) -> tuple[Verdict, int, int]:
    """Run a strategy to completion in synchronous rounds of up to k parallel trials."""
    observations: list[Observation] = []
    rounds = 0
    while len(observations) < MAX_TRIALS:
        proposals = strategy.propose(observations, [], k)
        if not proposals:
            break
        rounds += 1
        for proposal in proposals:
            value = oracle.measure(proposal.point)
            observations.append(Observation(proposal.point, value, trial_id=len(observations)))
    return strategy.verdict(observations), len(observations), rounds


def _covered(verdict: Verdict, case: Case, step: int) -> bool:
    """Does a reported unexplained part of the range hold this true step?"""
    for part in getattr(verdict, "unexplained", ()) or ():
        if not part.flagged:
            continue
        if case.parents is None:
            if part.lo < step <= part.hi:
                return True
        elif case.anc[part.hi, step] and not case.anc[part.lo, step]:
            return True
    return False


def _not_ruled_out(verdict: Verdict, case: Case, step: int) -> bool:
    """Does a reported remainder that holds this true step leave it possible (its interval
    reaches the step's size)? The honest answer when the step was neither named nor shown."""
    for part in getattr(verdict, "unexplained", ()) or ():
        inside = (part.lo < step <= part.hi) if case.parents is None else (
            case.anc[part.hi, step] and not case.anc[part.lo, step])
        if inside:
            pct = case.step_pct(step)
            lo, hi = part.effect_ci
            if (pct > 0 and hi >= pct) or (pct < 0 and lo <= pct):
                return True
    return False


def judge(verdict: Verdict, case: Case, method: str, trials: int, rounds: int,
          outliers: int, first: int | None = None) -> CaseResult:
    top = verdict.top
    stated = float(top.probability) if top is not None else 0.0
    truth = set(case.culprits)
    confident = [c for c in verdict.culprits if c.probability >= CONFIDENT]
    wrong = any(c.point not in truth for c in confident)
    named = {c.point for c in verdict.culprits if c.point in truth}
    effects_named = effects_covered = 0
    for c in verdict.culprits:
        if c.point in truth and c.effect_ci is not None:
            effects_named += 1
            lo, hi = c.effect_ci
            effects_covered += lo <= case.step_pct(c.point) <= hi
    covered = {s for s in truth - named if _covered(verdict, case, s)}
    if not truth:
        correct = verdict.status == "not_reproducible"
    elif method not in SLEUTHS or len(truth) == 1:
        correct = (verdict.status == "found" and top is not None and top.point in truth
                   and not wrong)
    else:
        correct = verdict.status == "found" and not wrong and named | covered == truth
    flagged = len(getattr(verdict, "outliers", ()) or ())
    open_set = {s for s in truth - named - covered if _not_ruled_out(verdict, case, s)}
    large = {s for s in truth if abs(case.step_pct(s)) >= 150.0 * case.regime.cv}
    accounted = (not wrong and verdict.status == "found"
                 and large <= named | covered | open_set) if len(truth) > 1 else None
    return CaseResult(correct, trials, rounds, stated, verdict.status, wrong, len(named),
                      len(covered), len(truth), effects_named, effects_covered, outliers,
                      flagged, len(open_set), first, accounted)


def run_case(task: tuple[int, int, int]) -> tuple[int, int, int, CaseResult]:
    regime_index, method_index, index = task
    regime, method = REGIMES[regime_index], METHODS[method_index]
    oracle = VirtualOracle(regime, index)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # log(0) inside git_bayesect
        strategy = method.build(regime, oracle.case)
        verdict, trials, rounds = drive(strategy, oracle, method.k)
    stages = getattr(strategy, "stages", None)
    first = stages[1].opened_at if stages and len(stages) > 1 else None
    result = judge(verdict, oracle.case, method.name, trials, rounds, oracle.outliers, first)
    return regime_index, method_index, index, result


def summarize(results: Iterable[CaseResult]) -> dict[str, float]:
    rows = list(results)
    trials = np.array([r.trials for r in rows], dtype=float)
    out = {
        "accuracy": float(np.mean([r.correct for r in rows])),
        "mean_trials": float(trials.mean()),
        "p90_trials": float(np.percentile(trials, 90)),
        "mean_rounds": float(np.mean([r.rounds for r in rows])),
        "stated_confidence": float(np.mean([r.stated for r in rows])),
        "wrong_confident": float(np.mean([r.wrong_confident for r in rows])),
        "cases": len(rows),
        "statuses": dict(sorted(Counter(r.status for r in rows).items())),
    }
    steps = sum(r.steps_true for r in rows)
    if steps and any(r.steps_true > 1 for r in rows):
        out["steps_named"] = sum(r.steps_named for r in rows) / steps
        out["steps_covered"] = sum(r.steps_covered for r in rows) / steps
        out["steps_not_ruled_out"] = sum(r.steps_not_ruled_out for r in rows) / steps
        judged = [r.large_steps_accounted for r in rows if r.large_steps_accounted is not None]
        if judged:
            out["large_steps_accounted"] = float(np.mean(judged))
        firsts = [r.first_culprit_trials for r in rows if r.first_culprit_trials is not None]
        if firsts:
            out["mean_trials_to_first_culprit"] = float(np.mean(firsts))
    named = sum(r.effects_named for r in rows)
    if named:
        out["effect_coverage"] = sum(r.effects_covered for r in rows) / named
    planted = sum(r.outliers_planted for r in rows)
    if planted:
        out["outliers_planted"] = planted / len(rows)
        out["outliers_flagged"] = sum(r.outliers_flagged for r in rows) / len(rows)
    return out


def _takes_part(regime: Regime, method: Method) -> bool:
    if method.name == "sleuth_thorough":
        return regime.name in THOROUGH_REGIMES
    return bool(regime.effects) or method.name in NO_CHANGE_METHODS


def _load_done(path: Path | None) -> dict[tuple[int, int, int], CaseResult]:
    """Cases already run (one JSON line each), keyed by (regime, method, case) indices."""
    done: dict[tuple[int, int, int], CaseResult] = {}
    if path is None or not path.exists():
        return done
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            key = (REGIMES.index(regime(row["regime"])),
                   [m.name for m in METHODS].index(row["method"]), int(row["case"]))
            done[key] = CaseResult(**row["result"])
        except (ValueError, KeyError, TypeError, StopIteration):
            continue  # a line cut short by an interruption, or of a method no longer run
    return done


def run_benchmark(
    cases: int, workers: int = 2, regimes: Iterable[str] | None = None,
    methods: Iterable[str] | None = None, journal: Path | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Run the cases and summarize them. ``journal``: a JSON-lines file every finished case is
    appended to as it finishes; cases already in it are not run again (a long run survives an
    interruption, and its regimes can be read while it goes on)."""
    wanted = [r.name for r in REGIMES] if regimes is None else list(regimes)
    chosen = {m.name for m in METHODS} if methods is None else set(methods)
    done = _load_done(journal)
    tasks = [
        (ri, mi, case)
        for ri, regime in enumerate(REGIMES)
        if regime.name in wanted
        for mi, method in enumerate(METHODS)
        if method.name in chosen and _takes_part(regime, method)
        for case in range(cases)
    ]
    todo = [t for t in tasks if t not in done]
    # Regimes in the order asked for; within one, slow tasks first so that the pool does not
    # end on one long straggler.
    todo.sort(key=lambda t: (wanted.index(REGIMES[t[0]].name), METHODS[t[1]].name in CHEAP,
                             t[1], t[2]))
    outcomes = [(ri, mi, case, done[(ri, mi, case)]) for ri, mi, case in tasks
                if (ri, mi, case) in done]
    sink = journal.open("a") if journal is not None else None
    try:
        if workers > 1:
            with Pool(workers) as pool:
                for outcome in pool.imap_unordered(run_case, todo, chunksize=1):
                    outcomes.append(outcome)
                    _journal(sink, outcome)
        else:
            for task in todo:
                outcome = run_case(task)
                outcomes.append(outcome)
                _journal(sink, outcome)
    finally:
        if sink is not None:
            sink.close()
    grouped: dict[tuple[int, int], list[CaseResult]] = {}
    for ri, mi, _, result in outcomes:
        grouped.setdefault((ri, mi), []).append(result)
    report: dict[str, dict[str, dict[str, float]]] = {}
    for (ri, mi), rows in sorted(grouped.items()):
        report.setdefault(REGIMES[ri].name, {})[METHODS[mi].name] = summarize(rows)
    for regime_rows in report.values():
        if "bayesect" in regime_rows:
            regime_rows["bayesect"]["implementation"] = BAYESECT_IMPLEMENTATION
    return report


def _journal(sink, outcome: tuple[int, int, int, CaseResult]) -> None:
    if sink is None:
        return
    ri, mi, case, result = outcome
    sink.write(json.dumps({"regime": REGIMES[ri].name, "method": METHODS[mi].name,
                           "case": case, "result": dataclasses.asdict(result)}) + "\n")
    sink.flush()


def format_table(report: dict[str, dict[str, dict[str, float]]]) -> str:
    lines = [
        f"{'regime':<12} {'method':<13} {'accuracy':>8} {'wrong':>6} {'stated':>7} "
        f"{'mean':>7} {'p90':>6} {'rounds':>7}  notes"
    ]
    for name, methods in report.items():
        for method, row in methods.items():
            notes = []
            if "steps_named" in row:
                notes.append(f"steps named {row['steps_named']:.2f} "
                             f"+ reported {row['steps_covered']:.2f}"
                             + (f" (+ not ruled out {row['steps_not_ruled_out']:.2f}; "
                                f"first culprit after {row['mean_trials_to_first_culprit']:.1f})"
                                if "mean_trials_to_first_culprit" in row else ""))
            if "effect_coverage" in row and method in SLEUTHS:
                notes.append(f"effect CI holds truth {row['effect_coverage']:.2f}")
            if "outliers_planted" in row and method in SLEUTHS:
                notes.append(f"outliers {row['outliers_planted']:.1f} planted, "
                             f"{row['outliers_flagged']:.1f} flagged")
            lines.append(
                f"{name:<12} {method:<13} {row['accuracy']:>8.3f} "
                f"{row['wrong_confident']:>6.3f} {row['stated_confidence']:>7.3f} "
                f"{row['mean_trials']:>7.1f} {row['p90_trials']:>6.0f} "
                f"{row['mean_rounds']:>7.1f}  {'; '.join(notes)}"
            )
        if "sleuth" in methods and "bayesect" in methods:
            ratio = methods["sleuth"]["mean_trials"] / methods["bayesect"]["mean_trials"]
            lines.append(f"{'':<12} sleuth / bayesect mean trials: {ratio:.2f}")
        if "sleuth" in methods and "sleuth_k4" in methods:
            ratio = methods["sleuth"]["mean_rounds"] / methods["sleuth_k4"]["mean_rounds"]
            lines.append(f"{'':<12} K=4 needs {ratio:.2f}x fewer rounds than K=1")
    return "\n".join(lines)


def main() -> int:
    cases = int(os.environ.get("CASES", "200"))
    workers = int(os.environ.get("WORKERS", "2"))
    regimes = os.environ.get("REGIMES")
    methods = os.environ.get("METHODS")
    journal = os.environ.get("JOURNAL")
    started = time.perf_counter()
    report = run_benchmark(cases, workers, regimes.split(",") if regimes else None,
                           methods.split(",") if methods else None,
                           Path(journal) if journal else None)
    elapsed = time.perf_counter() - started
    print(f"localization benchmark: N={N_COMMITS} commits, {cases} cases per regime, "
          f"{workers} workers, {elapsed:.0f} s; bayesect: {BAYESECT_IMPLEMENTATION}")
    print(format_table(report))
    out = Path(os.environ.get("BENCH_OUT", "runs/bench-localize.json"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
