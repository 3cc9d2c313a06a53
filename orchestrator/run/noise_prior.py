"""A prior for the noise levels and the costs: the node's earlier runs in the same runs_dir.

A run starts knowing nothing about its node's two noise levels, so its first restarts run the
configured ``bench.repetitions`` until both are measured (a few restarts, each at the wrong
count where one level dominates). The node's earlier runs measured them already: their
repetitions' scatter, their replicated restarts, what a restart and a repetition cost. This
reads them, as sums of squares (:class:`orchestrator.stats.variance.NoiseStats`) and trial
costs, for :class:`orchestrator.control.repetitions.RepetitionDesign` to pool with the run's own.

Only like for like: an earlier run counts when it benchmarked the same server and workload
(the ``target`` section and the ``bench`` section apart from the repetition knobs equal) on
the same metric, and only its trials on a host this run uses (node names are
``<host>-<ray node id>``; the id changes with every Ray start, the host does not). Its flagged
outlier restarts are left out, and each run's restarts are compared only with restarts of the
same candidate in that run. The prior is discounted
(:meth:`~orchestrator.stats.variance.NoiseStats.discounted`): it starts the design, the run's
own restarts soon weigh as much, and a node that changed since is seen.

I/O lives here and in the command; the estimators stay pure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.settings import saved_values
from orchestrator.records import NOT_EVIDENCE_PHASES
from orchestrator.run.cost import TrialCost, measured_costs, model_of
from orchestrator.stats.variance import NoiseStats, components_from_stats, noise_stats
from orchestrator.store import RunStore, TrialRow

# The repetition knobs do not change what one repetition measures; every other bench knob does.
REPETITION_KNOBS = ("repetitions", "adaptive_repetitions", "min_repetitions", "max_repetitions",
                    "noise_prior")
PRIOR_WITHIN_DF = 24.0  # the prior weighs at most as much as 24 within-restart df ...
PRIOR_BETWEEN_DF = 6.0  # ... and 6 replicated restarts


@dataclass(frozen=True)
class NoisePrior:
    """What the earlier runs ``runs`` say: their (discounted) sums of squares of the metric
    and their trials' cost split, oldest first."""

    stats: NoiseStats | None
    costs: tuple[TrialCost, ...]
    runs: tuple[str, ...]

    def trial_noise(self, repetitions: int) -> tuple[float, float] | None:
        """``(sigma, df)`` of one trial's value (the mean of ``repetitions``) on the log
        scale: the bisect posterior's noise prior. Its degrees of freedom are those of the
        restart component, at most :data:`PRIOR_BETWEEN_DF` (the node may have changed since);
        None while the earlier runs replicated no restart."""
        comp = components_from_stats(self.stats) if self.stats is not None else None
        if comp is None or comp.restart.df < 2 or not math.isfinite(comp.restart.var):
            return None
        var = max(comp.restart.var, 0.0) + comp.repetition.var / max(repetitions, 1)
        if var <= 0.0:
            return None
        return math.sqrt(var), min(comp.restart.df, PRIOR_BETWEEN_DF)

    def describe(self) -> str:
        """One line for the run's opening: where the prior comes from and what it says."""
        if not self.runs:
            return "noise prior: none (no earlier run of this server and benchmark on these hosts)"
        parts = []
        comp = components_from_stats(self.stats) if self.stats is not None else None
        if comp is not None:
            parts.append(f"repetition sd {100 * comp.repetition.sd:.2f}%")
            if math.isfinite(comp.restart.var) and comp.restart.df > 0:
                parts.append(f"restart sd {100 * comp.restart.sd:.2f}%" if comp.restart.var > 0
                             else f"restart sd under {100 * math.sqrt(comp.restart.hi):.2f}%")
        model = model_of(self.costs)
        if model is not None:
            parts.append(f"a restart {model.restart_s / 60:.1f} min, a repetition "
                         f"{model.repetition_s:.0f} s")
        said = "; ".join(parts) if parts else "nothing measured"
        return (f"noise prior: {len(self.runs)} earlier run(s) of this server and benchmark "
                f"({', '.join(self.runs)}): {said}; this run's restarts update it")


def host_of(node: str) -> str:
    """``gpu-box-3f2a9c1d`` -> ``gpu-box``: the host part of a node name."""
    return node.rsplit("-", 1)[0] if "-" in node else node


def workload_key(target: Mapping, bench: Mapping) -> tuple[str, str]:
    """What must be equal for two runs' noise to be comparable."""
    bench = {k: v for k, v in bench.items() if k not in REPETITION_KNOBS}
    # Whether a non-loopback host was allowed changes nothing measured (runs made before the
    # setting existed still match).
    target = {k: v for k, v in _plain(target).items() if k != "allow_remote"}
    return (repr(sorted(target.items())), repr(sorted(_plain(bench).items())))


def _plain(section) -> dict:
    return dict(section or {})


def logs_by_candidate(rows: Iterable[TrialRow], metric: str, skip: Iterable[int] = (),
                      hosts: set[str] | None = None) -> list[list[list[float]]]:
    """The metric's repetitions (log scale) of the measured, unflagged evidence trials,
    grouped by candidate then restart (on ``hosts`` only, when given)."""
    skipped = set(skip)
    by_candidate: dict[str, list[list[float]]] = {}
    for row in rows:
        if (row.result is None or row.outcome is None or not row.outcome.measured
                or row.suspect or row.id in skipped or row.phase in NOT_EVIDENCE_PHASES
                or (hosts is not None and host_of(row.node) not in hosts)):
            continue
        vals = row.result.values(metric)
        if vals and all(v > 0 for v in vals):
            by_candidate.setdefault(row.candidate.key, []).append([math.log(v) for v in vals])
    return list(by_candidate.values())


def run_stats(rows: Iterable[TrialRow], metric: str, hosts: set[str],
              skip: Iterable[int] = ()) -> NoiseStats:
    """One earlier run's sums of squares of the metric (log scale), its trials on ``hosts``."""
    return noise_stats(logs_by_candidate(rows, metric, skip, hosts))


def load_noise_prior(run_dir: Path, *, nodes: Iterable[str], metric: str, limit: int = 5,
                     scan: int = 100) -> NoisePrior:
    """The prior for the run in ``run_dir`` from the most recent ``limit`` matching runs
    beside it (of the ``scan`` most recent): its own ``config.yaml`` says the server and the
    workload (both sides as written down, redacted alike). An unreadable or foreign run is
    skipped, never an error."""
    hosts = {host_of(n) for n in nodes}
    try:
        own = saved_values((run_dir / "config.yaml").read_text())
        key = workload_key(own.get("target") or {}, own.get("bench") or {})
        dirs = sorted((d for d in run_dir.parent.iterdir() if d.name != run_dir.name
                       and (d / "trials.db").is_file() and (d / "config.yaml").is_file()),
                      key=lambda d: d.stat().st_mtime, reverse=True)[:scan]
    except Exception:  # noqa: BLE001 - no readable config of its own: no prior
        return NoisePrior(None, (), ())
    total = NoiseStats()
    costs: list[TrialCost] = []
    used: list[str] = []
    for d in dirs:
        try:
            conf = saved_values((d / "config.yaml").read_text())
            if (str(conf.get("metric")) != metric
                    or workload_key(conf.get("target") or {}, conf.get("bench") or {}) != key):
                continue
            store = RunStore.open(d / "trials.db", readonly=True)
        except Exception:  # noqa: BLE001 - a damaged or foreign run is simply not a prior
            continue
        try:
            rows = [r for r in store.trials() if host_of(r.node) in hosts]
            flagged = store.trial_flags("outlier")
        except Exception:  # noqa: BLE001
            continue
        finally:
            store.close()
        stats = run_stats(rows, metric, hosts, flagged)
        run_costs = measured_costs(rows, _plain(conf.get("target") or {}))
        if stats.df_within <= 0 and not run_costs:
            continue
        total = total + stats
        costs[:0] = run_costs  # oldest first: the latest run's trials are the last ones
        used.append(d.name)
        if len(used) >= limit:
            break
    if not used:
        return NoisePrior(None, (), ())
    stats = total.discounted(PRIOR_WITHIN_DF, PRIOR_BETWEEN_DF) if total.df_within > 0 else None
    return NoisePrior(stats, tuple(costs), tuple(used))
