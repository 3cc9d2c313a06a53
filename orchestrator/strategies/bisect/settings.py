"""Tuning of the bisect strategy, in one frozen record: what each knob buys and costs is said
beside it; the defaults are what `make bench-localize` validates (docs/benchmarks.md)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class BisectSettings:
    """Tuning of :class:`BisectStrategy`; defaults are what the benchmark validates."""

    confidence: float = 0.99
    reproduce_confidence: float = 0.90
    reproduce_min_per_endpoint: int = 2
    # A +5% change in 5% restart noise still fails a 90% interval at 24 restarts per endpoint
    # about 4% of the time; 48 makes that rare. Changes under `negligible_pct` are not
    # regressions worth a bisect.
    reproduce_max_per_endpoint: int = 48
    negligible_pct: float = 1.0
    refute_fraction: float = 0.5
    # ... of the reproduced change less this many of its standard errors, read with the noise
    # known now (reproduce.reproduced_size): the first estimate runs high, and a real
    # +3% change reproduced at +13% was refuted as "no +6.5% change" (bench_cost, 6% of runs
    # in 6% trial noise). It costs no_change runs ~13% more trials to withdraw a fluke.
    refute_shrink_se: float = 1.5
    confirm_free_looks: int = 3
    # Until a culprit is found, the endpoints' trials since the reproduction are the test of
    # it (reproduce.refuted). When they lean towards "no change" the search keeps them
    # balanced, and once it has run `audit_after` times its first forecast it gives them half
    # of the trials: a lucky reproduction is then withdrawn in a number of trials set by the
    # noise, while a real change, whose fresh trials do not lean that way, pays nothing.
    audit_after: float = 1.5
    reversed_confidence: float = 0.99
    reversed_min_per_endpoint: int = 4  # a 99% interval from 2-3 restarts can still be luck
    verify_confidence: float = 0.95
    verify_min_per_side: int = 2
    # Of which at least this many from the head-to-head itself, interleaved: trials the search
    # took earlier may come from another hour of the node (a load step), and on one side only.
    verify_fresh_per_side: int = 1
    # The posterior's first pass over the confidence is not yet a promise: the noise is
    # estimated from the same few restarts (the reproduce check stops on a clean-looking pair,
    # so sigma reads low in exactly the runs that stop early), and a lucky head-to-head
    # carried a wrong commit just past 0.99 in 1.5-2% of the runs of `subtle`, `dag` and
    # `staircase`. So the culprit is named only once this many further fresh restarts a side,
    # taken after that first pass, leave the posterior above the confidence (a pass that was
    # luck tends to fall back; one that falls back starts the count again). Measured gain and
    # cost: docs/benchmarks.md.
    verify_hold_per_side: int = 3
    # ... unless the culprit holds the confidence with sigma fixed at its upper 1 - alpha
    # bound (verify.stress_mass): evidence that survives the noise as large as the
    # trials allow needs no hold (0: always hold).
    verify_stress_alpha: float = 0.01
    verify_handoff: float = 0.95
    drift_requires_step: float = 0.5
    null_prior_top: float = 0.1
    # A later stage: prior 0.3 on one more step once a culprit is found (it only locates the
    # step: whether there is one is the remainders' question) and an allowance of trials
    # before what it could not pin on one commit is reported as spread over a sub-range.
    null_prior_later: float = 0.7
    later_max_trials: int = 150
    # What the culprits found leave unexplained (`remainders.py`) is tested after every
    # trial. A part with p under `remainder_suggestive` has its anchors measured up to
    # `remainder_check_trials` each (up to `remainder_max_per_endpoint` once its p, or that of
    # the whole unexplained change, is under `remainder_escalate_p`); it is
    # searched once p is under `remainder_search_p` with both anchors that well measured (an
    # anchor measured a few times can be off by luck, and the remainders are looked at after
    # every trial), or under `remainder_clear_p` at once (a second culprit of half the first).
    remainder_search_p: float = 0.01
    remainder_clear_p: float = 1e-4
    remainder_escalate_p: float = 0.05
    # Measure the anchors of every remainder at least this often, whatever the evidence: the
    # price of telling small further steps from noise in every run (0: only when suggested).
    remainder_min_trials: int = 0
    remainder_suggestive: float = 0.3
    # Before a run with named culprits ends, the whole unexplained change is measured (its
    # least-measured anchor, up to `remainder_max_per_endpoint` each) until its interval
    # excludes zero or rules out a further change of this share of the smallest named step
    # (later.resolution; 0: off).
    remainder_resolution: float = 1.0
    remainder_check_trials: int = 4
    remainder_max_per_endpoint: int = 24
    max_culprits: int = 6
    endpoint_max_failures: int = 2
    prior_floor: float = 0.01
    default_budget: int = 400
    far_more: float = 2.0
    forecast_every: int = 5
    forecast_window: int = 4
    outlier_k: float = 4.5
