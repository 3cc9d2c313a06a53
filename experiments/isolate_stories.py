"""The system-level stories where causes do not simply add up, as virtual cases of
``experiments/bench_isolate.py --system`` (the same chain as its other system cases: virtual
trials fingerprint the reference and current node, the fingerprints are diffed, the
controllable differences become changes, and every candidate is built by `apply` and measured
by the sim's model with restart noise).

- ``code_under_system``: power limit 600 -> 500 W and NCCL_ALGO stripped by a launcher (the
  isolate at the reference's commit), then a bisect of a 150-commit range whose commit 97
  makes verify 15% slower, measured under today's system, judged against the reference's
  commit as it measures now (the yardstick without the system's part). Correct: the isolate
  names exactly the two settings, and the bisect names commit 97. ``old yardstick`` counts the
  same bisect judged against the reference's level then (the behaviour before).
- ``env_overlap``: two variables each forcing verify eager, +38% alone and together. Correct:
  both named, reported as overlapping ("either alone gives all/most of it: restore both",
  "most" when the restarts can only bound restoring one alone under half), each one's
  "restore alone" interval and the "restore all" interval holding the noise-free truth.
- ``env_synergy``: two variables that hurt only together. Correct: the pair named as one
  interaction, "restoring either one wins it back", "restore all" holding the truth.
- ``clock_lock_mid``: the `code_under_system` node, and after six isolate trials an SM clock
  lock at 1700 MHz set from outside (the trials after it carry a new system epoch, as the
  controller numbers them). Correct: the causes named are exactly those that hurt on the new
  state, and each named cause's "added alone" interval holds its truth there.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from orchestrator.strategies.base import Observation

LOCK_AFTER = 6
LOCK_MHZ = 1700
RANGE = 150
CULPRIT = 97


@dataclass(frozen=True)
class StoryOutcome:
    story: str
    correct: bool
    n_trials: int
    detail: str
    old_yardstick: bool | None = None  # code_under_system: the bisect right the old way


def _setup(preset: str, seed: int, restart_cv: float, profile_extra: dict | None = None):
    from experiments.system_oracle import SystemOracle
    from orchestrator.records import Candidate
    from orchestrator.sim_scenarios import presets as material
    from orchestrator.sim_scenarios import system_stories as stories
    from orchestrator.system.differences import changes_from_system, reference_good
    from orchestrator.system.fingerprint_diff import diff

    rng = random.Random(seed)
    spec = material.PRESETS[preset]
    reference, now, _ = stories.system_story(spec.system_story, random.Random(seed))
    profile = {"verify_mult": 1.0, "decode_mult": 1.0, "verify_cuda_graph": True,
               "env_effects": [dict(e) for e in spec.env_effects], **(profile_extra or {})}
    then = SystemOracle(reference, profile, restart_cv=restart_cv, rng=rng)
    node = SystemOracle(now, profile, restart_cv=restart_cv, rng=rng)
    base = Candidate.make("0" * 40)
    changes = changes_from_system(diff(then.fingerprint(base), node.fingerprint(base)))
    changes = [c for c in changes if c.factor != "package"]  # no package source here
    return rng, then, node, base, changes, reference_good(base, changes), now


def _isolate(changes, good, measure: Callable, rng: random.Random, k: int, confidence: float,
             epoch_of: Callable[[int], int] = lambda n: 0):
    """Drive an isolate; returns (strategy, points, observations)."""
    from experiments.bench_isolate import drive
    from orchestrator.commands.isolate_points import IsolatePoints
    from orchestrator.strategies.isolate import IsolateStrategy
    from orchestrator.system.differences import check_distinct

    check_distinct(good, changes, str)
    strategy = IsolateStrategy(len(changes), confidence=confidence,
                               labels=[c.label for c in changes])
    points = IsolatePoints(strategy, good, changes, str)
    count = [0]

    def trial(point: int) -> Observation:
        cand = points.candidate(point)
        epoch = epoch_of(count[0])
        count[0] += 1
        return Observation(points.point(cand), measure(cand, epoch), epoch=epoch)

    observations = drive(strategy, k, rng, trial)
    return strategy, points, observations


def _attribution(strategy, observations, changes, labels):
    from orchestrator.answer.attribution import attribute

    latest = max((o.epoch for o in observations), default=0)
    values: dict[frozenset[int], list[float]] = {}
    for o in observations:
        if o.value is not None and o.epoch == latest:
            values.setdefault(strategy.subset(o.point), []).append(math.log(o.value))
    verdict = strategy.verdict(observations)
    culprits = sorted(verdict.culprits, key=lambda c: -c.probability)
    players = [frozenset(c.differences) for c in culprits]
    members = [(i, changes[i].name) for p in players if len(p) > 1 for i in sorted(p)]
    return verdict, culprits, attribute(players, values, labels or [
        " + ".join(changes[i].name for i in sorted(p)) for p in players],
        bad=frozenset(range(len(changes))), members=members)


def _holds(change: dict, truth_log: float, level: float) -> bool:
    """Whether an attribution interval (at the document's simultaneous level) holds the
    noise-free truth."""
    from orchestrator.answer.combine import LogChange

    return LogChange(*change["log"]).contains(truth_log, level)


def _truth(node, good, changes, subset) -> float:
    from orchestrator.system.differences import apply

    return math.log(node.truth(apply(good, changes, sorted(subset), str)))


def pair_story(story: str, seed: int, *, k: int = 1, confidence: float = 0.99,
               restart_cv: float = 0.02) -> StoryOutcome:
    """``env_overlap`` or ``env_synergy``."""
    rng, _, node, _, changes, good, _ = _setup(story, seed, restart_cv)
    strategy, _, observations = _isolate(
        changes, good, lambda cand, _e: node.measure(cand), rng, k, confidence)
    verdict, culprits, doc = _attribution(strategy, observations, changes, None)
    everything = frozenset(range(len(changes)))
    bad = _truth(node, good, changes, everything)
    ok = verdict.status == "found" and doc is not None
    if ok and story == "env_overlap":
        ok = ({c.differences for c in culprits} == {(0,), (1,)}
              and [(r["kind"], r["most"]) for r in doc["relations"]] == [("overlap", True)]
              and all(_holds(c["restore_alone"], _truth(node, good, changes,
                                                         everything - set(p.differences)) - bad,
                             doc["confidence"])
                      for c, p in zip(doc["causes"], culprits, strict=True)))
    elif ok:
        ok = ([(c.kind, c.differences) for c in culprits] == [("interaction", (0, 1))]
              and [(r["kind"], r["full"]) for r in doc["relations"]] == [("synergy", True)])
    if ok:
        ok = _holds(doc["restore_all"], _truth(node, good, changes, ()) - bad, doc["confidence"])
    named = [changes[i].name for c in culprits for i in c.differences]
    return StoryOutcome(story, ok, verdict.n_trials,
                        f"{verdict.status}, named {named}, relations "
                        f"{[r['kind'] for r in (doc or {}).get('relations', [])]}")


def clock_lock_story(seed: int, *, k: int = 1, confidence: float = 0.99,
                     restart_cv: float = 0.02) -> StoryOutcome:
    from dataclasses import replace

    from experiments.system_oracle import SystemOracle

    rng, _, node, _, changes, good, now = _setup("code_under_system", seed, restart_cv)
    locked_state = replace(now, gpus=now.gpus.with_all_gpus(sm_clock_locked_mhz=LOCK_MHZ))
    locked = SystemOracle(locked_state, node.profile, restart_cv=restart_cv, rng=rng)
    strategy, _, observations = _isolate(
        changes, good, lambda cand, e: (locked if e else node).measure(cand), rng, k,
        confidence, epoch_of=lambda n: int(n >= LOCK_AFTER))
    verdict, culprits, doc = _attribution(strategy, observations, changes, None)
    base = _truth(locked, good, changes, ())
    harmful = {i for i in range(len(changes))
               if _truth(locked, good, changes, {i}) - base >= math.log(1.03)}
    named = {i for c in culprits for i in c.differences}
    ok = verdict.status == "found" and named == harmful and doc is not None
    if ok:
        ok = all(_holds(c["add_alone"], _truth(locked, good, changes, set(p.differences)) - base,
                        doc["confidence"])
                 for c, p in zip(doc["causes"], culprits, strict=True) if c.get("add_alone"))
    return StoryOutcome("clock_lock_mid", ok, verdict.n_trials + strategy.discarded,
                        f"{verdict.status}, named {sorted(changes[i].name for i in named)},"
                        f" harmful on the new state {sorted(changes[i].name for i in harmful)}")


def code_story(seed: int, *, k: int = 1, confidence: float = 0.99,
               restart_cv: float = 0.02) -> StoryOutcome:
    from experiments.system_oracle import SystemOracle
    from orchestrator.strategies.bisect import BisectStrategy

    rng, then, node, base, changes, good, now = _setup("code_under_system", seed, restart_cv)
    strategy, _, observations = _isolate(
        changes, good, lambda cand, _e: node.measure(cand), rng, k, confidence)
    verdict = strategy.verdict(observations)
    named = {changes[i].name for c in verdict.culprits for i in c.differences}
    isolate_ok = verdict.status == "found" and named == {"power_limit_w", "NCCL_ALGO"}
    slow = SystemOracle(now, {**node.profile, "verify_mult": 1.15}, restart_cv=restart_cv,
                        rng=rng)
    reference_then = [then.measure(base) for _ in range(3)]  # the reference run's restarts
    compare_now = [node.measure(base) for _ in range(3)]  # the compare's restarts of it

    def geo(values: list[float]) -> float:
        return math.exp(sum(math.log(v) for v in values) / len(values))

    def bisect(reference: float) -> tuple[bool, int]:
        bis = BisectStrategy(RANGE, confidence=confidence, reference_value=reference)
        obs = [Observation(0, v) for v in compare_now]

        def trial(point: int) -> Observation:
            return Observation(point, (slow if point >= CULPRIT else node).measure(base))
        obs += drive_from(bis, obs, k, rng, trial)
        v = bis.verdict(obs)
        return (v.status == "found" and [c.point for c in v.culprits] == [CULPRIT],
                v.n_trials)

    def drive_from(bis, start, k_, rng_, trial):
        out = list(start)
        pending: list[int] = []
        while True:
            v = bis.verdict(out)
            if not v.done and len(pending) < k_:
                pending += [p.point for p in bis.propose(out, pending, k_ - len(pending))]
            if not pending:
                return out[len(start):]
            out.append(trial(pending.pop(rng_.randrange(len(pending)))))

    new_ok, n_new = bisect(geo(compare_now))
    old_ok, _ = bisect(geo(reference_then))
    return StoryOutcome("code_under_system", isolate_ok and new_ok,
                        verdict.n_trials + n_new,
                        f"isolate {verdict.status} {sorted(named)}, bisect "
                        f"{'named' if new_ok else 'missed'} commit {CULPRIT}",
                        old_yardstick=old_ok)


STORIES: dict[str, Callable[..., StoryOutcome]] = {
    "code_under_system": code_story,
    "env_overlap": lambda seed, **kw: pair_story("env_overlap", seed, **kw),
    "env_synergy": lambda seed, **kw: pair_story("env_synergy", seed, **kw),
    "clock_lock_mid": clock_lock_story,
}
