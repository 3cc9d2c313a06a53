"""How the parts of an answer add up: relative changes on the log scale, with their intervals.

Performance effects compound: a power cap that makes verify 30% slower and a commit that makes
it 18% slower give 1.30 x 1.18 = +53%, not +48%. On the log scale they add, so an answer is a
sum of log-ratios: the total change between the two states the user compares, the named
causes, and what is left (`total - sum(causes)`), each with a t-interval. The causes explain the
change when the remainder's interval lies within the run's min effect (:func:`decide`).

Each estimate carries its standard error and degrees of freedom (from the pooled-variance
t-interval of :func:`orchestrator.stats.effect.log_difference`). A sum's standard error adds
the variances as if the estimates were independent, and its degrees of freedom come from
Welch-Satterthwaite. The estimates of one investigation can share trials (a culprit measured
against the bad endpoint that the total also uses); when a shared trial enters two estimates
with the same sign, as it does here, treating them as independent overstates the variance of
their difference: the remainder's interval is then wider than it needs to be, never narrower.

Pure functions, no I/O: the answer of every run kind is built from these.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from orchestrator.stats.dist import t_ppf
from orchestrator.stats.min_effect import ANSWER_CONFIDENCE, min_effect_log

CONFIDENCE = ANSWER_CONFIDENCE
_Z95 = 1.959963984540054


@dataclass(frozen=True)
class LogChange:
    """`diff` = log(after / before), with its standard error and degrees of freedom."""

    diff: float
    se: float
    df: float

    @property
    def pct(self) -> float:
        return 100.0 * math.expm1(self.diff)

    @property
    def ratio(self) -> float:
        return math.exp(self.diff)

    def log_interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        if not math.isfinite(self.se) or self.df <= 0:
            return -math.inf, math.inf
        half = _crit(confidence, self.df) * self.se
        return self.diff - half, self.diff + half

    def interval(self, confidence: float = CONFIDENCE) -> tuple[float, float]:
        """The interval in percent."""
        lo, hi = self.log_interval(confidence)
        return 100.0 * math.expm1(lo), 100.0 * math.expm1(hi)

    def excludes_zero(self, confidence: float = CONFIDENCE) -> bool:
        lo, hi = self.log_interval(confidence)
        return lo > 0 or hi < 0

    def contains(self, diff: float, confidence: float = CONFIDENCE) -> bool:
        lo, hi = self.log_interval(confidence)
        return lo <= diff <= hi

    def to_json(self, confidence: float = CONFIDENCE) -> dict:
        lo, hi = self.interval(confidence)
        return {"pct": _round(self.pct), "ci": [_round(lo), _round(hi)],
                "log": [self.diff, self.se, self.df]}

    @classmethod
    def from_effect(cls, effect: Mapping | None) -> LogChange | None:
        """From an effect record: its `log` triple when it has one (every effect sleuth
        computes on positive values), else backed out of its 95% interval as a normal one."""
        if not effect:
            return None
        log = effect.get("log")
        if isinstance(log, list | tuple) and len(log) == 3 and all(
                isinstance(v, int | float) for v in log):
            diff, se, df = (float(v) for v in log)
            if math.isfinite(diff):
                return cls(diff, se, df)
        pct, ci = effect.get("pct"), effect.get("ci")
        if not isinstance(pct, int | float) or pct <= -100:
            return None
        diff = math.log1p(pct / 100.0)
        if (isinstance(ci, list | tuple) and len(ci) == 2
                and all(isinstance(v, int | float) and math.isfinite(v) and v > -100 for v in ci)):
            se = (math.log1p(ci[1] / 100.0) - math.log1p(ci[0] / 100.0)) / (2 * _Z95)
            return cls(diff, max(se, 0.0), math.inf)
        return cls(diff, math.inf, 0.0)


def _crit(confidence: float, df: float) -> float:
    if math.isinf(df):
        return float(t_ppf(0.5 + confidence / 2.0, 1e9))
    return float(t_ppf(0.5 + confidence / 2.0, df))


def _round(value: float) -> float:
    return round(value, 3) if math.isfinite(value) else value


def total(changes: Iterable[LogChange]) -> LogChange | None:
    """The sum of log changes (their product as ratios); None for no terms."""
    terms = list(changes)
    if not terms:
        return None
    diff = math.fsum(t.diff for t in terms)
    var = math.fsum(t.se ** 2 for t in terms)
    if not math.isfinite(var):
        return LogChange(diff, math.inf, 0.0)
    return LogChange(diff, math.sqrt(var), satterthwaite(terms))


def satterthwaite(terms: Iterable[LogChange]) -> float:
    """Welch-Satterthwaite degrees of freedom of a sum of independent estimates."""
    terms = [t for t in terms if t.se > 0]
    if not terms:
        return math.inf
    num = math.fsum(t.se ** 2 for t in terms) ** 2
    den = math.fsum(t.se ** 4 / t.df for t in terms if math.isfinite(t.df) and t.df > 0)
    if any(t.df <= 0 for t in terms):
        return 0.0
    return num / den if den > 0 else math.inf


def remainder(whole: LogChange, parts: Iterable[LogChange]) -> LogChange:
    """`whole - sum(parts)`: what the parts leave unexplained."""
    parts = list(parts)
    named = total(parts)
    if named is None:
        return whole
    terms = [whole, named]
    var = whole.se ** 2 + named.se ** 2
    se = math.sqrt(var) if math.isfinite(var) else math.inf
    df = satterthwaite(terms) if math.isfinite(var) else 0.0
    return LogChange(whole.diff - named.diff, se, df)


# The run's min effect (a part of the change smaller than it is not worth chasing, so a
# remainder whose interval lies within it counts as explained) is one rule for the answer and
# for the bisect's end rule: `orchestrator/stats/min_effect.py` says why it is what it is.

# How close two attribution states must be to count as "the same" when the answer says that
# causes overlap ("either alone gives all of it") or hurt only together: a quarter of the change
# restoring all of them wins back, at least 4% (what a few restarts a side resolve on a noisy
# node). It judges the relation between causes, not the remainder (that is `decide`'s).
OVERLAP_FLOOR = math.log1p(0.04)
OVERLAP_SHARE = 0.25


def tolerance(whole: LogChange, share_of_change: float = OVERLAP_SHARE) -> float:
    """A log-scale tolerance: `share_of_change` of the change, at least 4%."""
    return max(OVERLAP_FLOOR, share_of_change * abs(whole.diff))


EXPLAINED, NO_CHANGE, REMAINDER, UNDECIDED = "explained", "no_change", "remainder", "undecided"


def min_effect(whole: LogChange | None, stated_pct: float | None = None) -> float:
    """The run's min effect on the log scale (positive): `stated_pct` when the user gave one,
    else the larger of :data:`MIN_EFFECT_FLOOR_PCT` and :data:`MIN_EFFECT_SHARE` of the change
    (:func:`orchestrator.stats.min_effect.min_effect_log`)."""
    return min_effect_log(whole.diff if whole is not None else None, stated_pct)


def min_effect_pct(log_value: float) -> float:
    return 100.0 * math.expm1(log_value)


@dataclass(frozen=True)
class Decision:
    """What the remainder says, against the min effect `bound` (log scale):

    - `explained` (causes named) / `no_change` (none named): its interval lies within
      +-bound: nothing worth chasing is left;
    - `remainder`: its interval lies beyond +bound or below -bound: a part larger than the
      min effect is shown to exist (a cause nobody named, or causes that overlap and overstate);
    - `undecided`: the interval reaches past the bound on one side but does not exclude it."""

    status: str
    rest: LogChange
    bound: float

    @property
    def settled(self) -> bool:
        """Explained, or no change: the answer accounts for what was measured."""
        return self.status in (EXPLAINED, NO_CHANGE)


def decide(whole: LogChange, parts: Iterable[LogChange], bound: float | None = None,
           confidence: float = CONFIDENCE) -> Decision:
    """The remainder of `whole` after `parts` against the min effect `bound` (default:
    :func:`min_effect` of the whole). A noisy cause cannot pass by luck (its width widens the
    remainder's interval), nor can a change nobody named."""
    parts = list(parts)
    rest = remainder(whole, parts)
    bound = min_effect(whole) if bound is None else bound
    lo, hi = rest.log_interval(confidence)
    if -bound <= lo and hi <= bound:
        status = EXPLAINED if parts else NO_CHANGE
    elif lo > bound or hi < -bound:
        status = REMAINDER
    else:
        status = UNDECIDED
    return Decision(status, rest, bound)


def share(part: LogChange, whole: LogChange) -> float | None:
    """`part`'s share of `whole` on the log scale (shares of all parts sum to the explained
    share); None when the whole is no measured change."""
    if whole.diff == 0 or not whole.excludes_zero():
        return None
    return part.diff / whole.diff
