"""The run's min effect: the smallest part of a change worth chasing.

One rule for the answer (a remainder whose interval lies within +-min effect counts as
explained, and only one whose interval lies beyond it shows that something else is there) and
for the bisect's end rule (a part of the range whose interval lies within it is not measured
further: whatever it hints at, the answer would call explained).

The user states it with `experiment.params.min_effect_pct` (the same knob the bisect, the
compare and the isolate read). Unstated, it is the larger of 4% and a tenth of the change being
explained:

- 4% is what a few restarts per side resolve on a noisy node: an 8% change measured with two or
  three restarts leaves a remainder interval about 4-5 points wide even when one cause explains
  it all (a 3% floor made such answers "not explained" one run in two); the compare's own
  default is 3%, the bisect's negligible change 1%;
- a tenth of the change is the isolate's unstated floor (`effect_fraction`): a difference
  smaller than that is never named as a cause, so a remainder that small could never be given a
  name by the run either.

The bisect's unstated floor with a reference (half of the change since the reference) is
deliberately not used: it would let a large remainder pass as explained.
"""

from __future__ import annotations

import math

MIN_EFFECT_FLOOR_PCT = 4.0
MIN_EFFECT_SHARE = 0.10
# The interval an answer judges a remainder by (`orchestrator/answer/combine.py`'s CONFIDENCE).
ANSWER_CONFIDENCE = 0.95


def min_effect_log(change: float | None, stated_pct: float | None = None) -> float:
    """The min effect on the log scale (positive): ``stated_pct`` when the user gave one, else
    the larger of :data:`MIN_EFFECT_FLOOR_PCT` and :data:`MIN_EFFECT_SHARE` of ``change`` (a
    log-ratio; None where it is not measured yet)."""
    if stated_pct is not None:
        return math.log1p(stated_pct / 100.0)
    share_of = MIN_EFFECT_SHARE * abs(change) if change is not None else 0.0
    return max(math.log1p(MIN_EFFECT_FLOOR_PCT / 100.0), share_of)
