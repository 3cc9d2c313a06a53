"""How the parts of an answer add up: relative changes on the log scale, with their intervals.

Performance effects compound: a power cap that makes verify 30% slower and a commit that makes
it 18% slower give 1.30 x 1.18 = +53%, not +48%. On the log scale they add, so an answer is a
sum of log-ratios: the total change between the two states the user compares, the named
causes, and what is left (`total - sum(causes)`), each with a t-interval. The causes explain the
change when the remainder is confidently small (:func:`explains`).

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

from scipy.stats import t as student_t

CONFIDENCE = 0.95
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
        return float(student_t.ppf(0.5 + confidence / 2.0, 1e9))
    return float(student_t.ppf(0.5 + confidence / 2.0, df))


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


# What "explained" tolerates, on the log scale: the remainder's interval must rule out anything
# more than a quarter of the change (or 4%, whichever is larger) being left, and a remainder
# that is confidently not zero must be small: a tenth of the change or 4%. The floor is what
# a few restarts per side resolve on a noisy node: an 8% change measured with two or three
# restarts leaves a remainder interval about 4-5 points wide even when one cause explains it
# all, and a 3% floor made such answers "not explained" one run in two. Effects that do not
# compose exactly (an all-reduce saving that is a smaller share of a verify pass the culprit
# made longer) leave a few percent either way; that is reported, not hidden.
MIN_TOLERANCE = math.log1p(0.04)
BOUND_SHARE = 0.25
SMALL_SHARE = 0.10


def tolerance(whole: LogChange, share_of_change: float = BOUND_SHARE) -> float:
    """A log-scale tolerance: `share_of_change` of the change, at least 4%."""
    return max(MIN_TOLERANCE, share_of_change * abs(whole.diff))


def explains(whole: LogChange, parts: Iterable[LogChange],
             confidence: float = CONFIDENCE) -> bool:
    """Whether the named parts account for the whole: their remainder's interval lies within
    +-:func:`tolerance` (a quarter of the change; nothing sizable can be left), and where the
    interval excludes zero the remainder is small (a tenth of the change). A noisy cause cannot
    pass by luck (its width widens the remainder's interval), nor can a change nobody named;
    too few restarts for so narrow a bound give "not explained", with the remainder shown."""
    rest = remainder(whole, list(parts))
    lo, hi = rest.log_interval(confidence)
    if not (-tolerance(whole) <= lo and hi <= tolerance(whole)):
        return False
    return lo <= 0 <= hi or abs(rest.diff) <= tolerance(whole, SMALL_SHARE)


def share(part: LogChange, whole: LogChange) -> float | None:
    """`part`'s share of `whole` on the log scale (shares of all parts sum to the explained
    share); None when the whole is no measured change."""
    if whole.diff == 0 or not whole.excludes_zero():
        return None
    return part.diff / whole.diff
