"""Effects between two candidates when some of their values share a server lifetime.

A lifetime that measured several candidates in interleaved blocks (a power limit set on the
running server: :mod:`orchestrator.run.blocks`) stores one block row per candidate; values
of one lifetime share the restart's level. The difference of two such candidates is read with
the split-plot model of :mod:`orchestrator.stats.lifetimes` over every measured row of the run
(each row a cell of its lifetime, a restart of its own otherwise): restart noise counts only
where the two sides come from different lifetimes. Where no lifetime holds both candidates
this returns None and the plain pooled interval applies.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy.special import stdtrit

from orchestrator.records import NOT_EVIDENCE_PHASES
from orchestrator.run.blocks import lifetime_of
from orchestrator.stats.effect import LogDifference
from orchestrator.stats.lifetimes import Cell, SplitPlot, components, kept
from orchestrator.store import TrialRow


def cells(rows: Sequence[TrialRow], metric: str, exclude: frozenset[int] = frozenset()
          ) -> dict[int, dict[str, Cell]]:
    """The run's measured values of `metric` as cells of their lifetimes (log scale)."""
    out: dict[int, dict[str, Cell]] = {}
    for r in rows:
        if (r.outcome is None or not r.outcome.measured or r.suspect or r.id in exclude
                or r.phase in NOT_EVIDENCE_PHASES or r.result is None):
            continue
        reps = [v for v in r.result.values(metric) if v > 0]
        if not reps:
            continue
        logs = [math.log(v) for v in reps]
        mean = math.log(sum(reps) / len(reps))
        spread = (sum((x - sum(logs) / len(logs)) ** 2 for x in logs) / (len(logs) - 1)
                  if len(logs) > 1 else None)
        lifetime = lifetime_of(r.result.fingerprint)
        key = lifetime if lifetime is not None else -r.id
        out.setdefault(key, {})[r.candidate.key] = Cell(mean, spread, len(reps))
    return out


def paired_difference(rows: Sequence[TrialRow], before_key: str, after_key: str, metric: str,
                      confidence: float = 0.95, exclude: frozenset[int] = frozenset()
                      ) -> LogDifference | None:
    """`after - before` on the log scale under the split-plot model, or None when no
    lifetime measured both."""
    found = cells(rows, metric, exclude)
    if not any(before_key in c and after_key in c for c in found.values()):
        return None
    found, values = kept(found)  # a launch slow throughout, as the isolate leaves out
    fit = SplitPlot(found, components(found, values))
    got = fit.contrast({after_key: 1.0, before_key: -1.0})
    if got is None:
        return None
    est, se, df = got
    if not (df > 0 and math.isfinite(se)):
        return LogDifference(est, -math.inf, math.inf, se, df)
    half = float(stdtrit(df, 0.5 + confidence / 2.0)) * se if math.isfinite(df) else (
        1.959963984540054 * se)
    return LogDifference(est, est - half, est + half, se, df)
