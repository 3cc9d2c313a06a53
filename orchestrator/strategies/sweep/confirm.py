"""The confirmation: the best configuration(s) against the baseline, head to head, interleaved.

Rounds rotate the order of the sides (baseline, best; best, baseline; ...) so drift hits every
side alike. The effect reported uses only these restarts: the search restarts chose the winner
and are biased in its favour. The number of rounds adapts: `confirm_min_rounds` first, then one
more at a time while the answer is unclear, up to `confirm_rounds`; stopping early needs the
stricter `interim_confidence` (Haybittle-Peto style), so looking after every round does not
inflate the chance of a false "better".
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.stats.effect import Effect, log_effect
from orchestrator.strategies.sweep.noise import pooled_log_ss
from orchestrator.strategies.sweep.work import ConfigStats, SweepSettings, Work, phase


@dataclass(frozen=True)
class Confirmed:
    config: ConfigStats
    effect: Effect | None  # vs the baseline, confirmation restarts only

    @property
    def overall_mean(self) -> float | None:
        return self.config.mean(self.config.search + self.config.confirm)


@dataclass(frozen=True)
class SweepResult:
    status: str  # found | baseline_best | no_better | inconclusive | no_data
    message: str
    best: Confirmed | None
    confirmed: tuple[Confirmed, ...]
    baseline: ConfigStats
    n_trials: int
    n_configurations: int


class Confirmation:
    """Which restarts the confirmation runs, and which of them have finished."""

    def __init__(self, settings: SweepSettings):
        self.settings = settings
        self.keys: list[str] | None = None  # baseline first; None until the search ends
        self.issued: Counter = Counter()  # (round, candidate key) -> restarts started
        self.finished: Counter = Counter()  # ... and finished (evidence or not)

    @property
    def started(self) -> bool:
        return self.keys is not None

    def plan(self, rounds: int | None = None) -> list[tuple[int, str]]:
        """(round, candidate key) in run order; each round rotates the order of its sides."""
        keys = self.keys or []
        plan = []
        for r in range(self.settings.confirm_rounds if rounds is None else rounds):
            shift = r % len(keys) if keys else 0
            plan += [(r, k) for k in keys[shift:] + keys[:shift]]
        return plan

    def rounds(self, decisive: Callable[[float], bool]) -> int:
        """Rounds to run: grows by one while the finished rounds leave the answer unclear."""
        s = self.settings
        rounds = s.confirm_min_rounds
        while rounds < s.confirm_rounds:
            if any(self.finished[item] < n for item, n in Counter(self.plan(rounds)).items()):
                return rounds  # the rounds so far are still running
            if decisive(s.interim_confidence):
                return rounds
            rounds += 1
        return rounds

    def next(self, configs: Mapping[str, ConfigStats], decisive: Callable[[float], bool],
             peek: bool = False) -> Work | None:
        plan = self.plan(self.rounds(decisive))
        remaining = Counter(plan)
        remaining.subtract(self.issued)
        for r, key in plan:
            if remaining[(r, key)] > 0:
                if not peek:
                    self.issued[(r, key)] += 1
                return Work(configs[key].candidate, phase("confirm", r))
        return None


def confirmation_effect(baseline: ConfigStats, stats: ConfigStats,
                        configs: Mapping[str, ConfigStats], confidence: float) -> Effect | None:
    """Confirmation-phase effect vs the baseline, with the run's pooled restart variance: every
    other configuration measured more than once (as `findings.effects_between` pools it, so
    both report the same interval)."""
    before, after = baseline.confirm, stats.confirm
    if not before or not after or min(before + after) <= 0:
        return None
    others = (c.search for c in configs.values() if c.key not in (baseline.key, stats.key))
    ss, df = pooled_log_ss(others)
    try:
        return log_effect(before, after, confidence=confidence, extra_ss=ss, extra_df=df)
    except ValueError:
        return None


def outcome(baseline: ConfigStats, confirmed: list[Confirmed], *, maximize: bool, spent: int,
            n_configurations: int, min_effect_pct: float = 4.0) -> SweepResult:
    """The verdict: found (the winner's interval is on the good side of no change),
    baseline_best (every confirmed configuration's is on the bad side), no_better (the
    best's interval holds no change and reaches no further than `min_effect_pct` on the good
    side: no setting measured beats the baseline by more, an answer too), inconclusive."""
    measured = [c for c in confirmed if c.config.confirm]
    if baseline.failed or not baseline.search:
        return SweepResult("no_data", "the baseline could not be measured", None,
                           tuple(confirmed), baseline, spent, n_configurations)
    if not measured:
        return SweepResult("no_data", "no configuration besides the baseline was measured",
                           None, tuple(confirmed), baseline, spent, n_configurations)
    sign = 1.0 if maximize else -1.0
    best = max(measured, key=lambda c: sign * c.overall_mean)
    e = best.effect
    better = e is not None and (e.ci[0] > 0 if maximize else e.ci[1] < 0)
    worse_all = all(c.effect is not None and (c.effect.ci[1] < 0 if maximize
                                              else c.effect.ci[0] > 0) for c in measured)
    if better:
        status = "found"
        message = (f"{best.config.label} beats the baseline: {e.pct:+.1f}% "
                   f"[{e.ci[0]:+.1f}, {e.ci[1]:+.1f}] in the interleaved confirmation")
    elif worse_all:
        status = "baseline_best"
        message = "the baseline beat every top configuration in the interleaved confirmation"
    elif e is not None and (e.ci[1] if maximize else -e.ci[0]) <= min_effect_pct:
        status = "no_better"
        edge = e.ci[1] if maximize else e.ci[0]
        message = (f"no setting measured beats the baseline by more than {edge:+.1f}%: the"
                   f" search's best, {best.config.label}, {e.pct:+.1f}% [{e.ci[0]:+.1f},"
                   f" {e.ci[1]:+.1f}] in the interleaved confirmation, is within the noise")
    else:
        status = "inconclusive"
        detail = f" ({e.pct:+.1f}% [{e.ci[0]:+.1f}, {e.ci[1]:+.1f}])" if e else ""
        message = (f"best configuration {best.config.label}{detail}: its interval against "
                   "the baseline includes no change; more confirmation rounds would tell")
    return SweepResult(status, message, best, tuple(confirmed), baseline, spent,
                       n_configurations)
