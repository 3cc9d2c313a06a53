"""Tuning of the isolate strategy, in one frozen record, and the small types its phases share."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrator.stats.min_effect import MIN_EFFECT_FLOOR_PCT
from orchestrator.strategies.isolate.stats import Subset

Weights = dict[Subset, float]
UNTESTABLE = "untestable"


@dataclass(frozen=True)
class IsolateSettings:
    """Tuning of :class:`IsolateStrategy`; defaults are what the calibration tests check.

    * ``route_confidence``: level of the decisions that only choose the next test (a cause
      found, a partner to look for); the answer itself needs the strategy's ``confidence``.
    * ``residual_confidence``: level of an explain check's "something else matters", which
      starts a whole new search.
    * ``effect_floor_pct`` / ``effect_fraction`` / ``effect_noise_fraction``: without an
      explicit ``min_effect_pct``, the smallest effect worth naming is the largest of the floor,
      this fraction of the total change, and this fraction of the restart noise (one sigma): an
      effect well inside the noise takes dozens of restarts per side to rule in or out, and
      "nothing else matters" could never be established within the trial caps.
    * ``prior_null``: prior probability that a tested effect is exactly zero.
    * ``chain_trials_per_bit`` / ``chain_trials_base``: a chain gives up after
      ``base + per_bit * log2(length + 1)`` trials of its own; ``chain_attempts``: searches, in
      different orders, for one residual or one partner before giving up on it.
    * ``speculate``: during reproduction, give idle nodes evenly spaced points of the first
      chain instead of nothing.
    * ``end_confidence`` / ``end_min_per_endpoint``: "reversed" and "alike" end the run, and
      the endpoints' interval is looked at after every trial, so either needs this many trials
      of each endpoint and a level that shrinks with every look (as the bisection strategy's
      reversal does): checked at the reproduce level, 47 of 400 seeded pairs that measure
      alike ended "reversed". "Alike" (not reproducible before ``reproduce_max_per_endpoint``)
      is the interval within +-the run's min effect (4% unless ``min_effect_pct`` is given,
      which has its own rule).
    * ``max_per_subset``: no configuration ever gets more trials than this (failed and
      suspect ones included, the good and bad ones too): when everything the answer still
      needs has reached it, the run ends inconclusive instead of measuring one configuration
      without end.
    """

    reproduce_confidence: float = 0.95
    reproduce_min_per_endpoint: int = 2
    reproduce_max_per_endpoint: int = 24
    end_confidence: float = 0.99
    end_min_per_endpoint: int = 4
    search_confidence: float = 0.95
    route_confidence: float = 0.95
    residual_confidence: float = 0.99
    verify_min_per_side: int = 2
    verify_max_per_side: int = 12
    final_max_per_subset: int = 36
    effect_floor_pct: float = MIN_EFFECT_FLOOR_PCT
    effect_fraction: float = 0.1
    effect_noise_fraction: float = 1.0
    prior_null: float = 0.5
    max_failures: int = 2
    chain_trials_per_bit: int = 6
    chain_trials_base: int = 12
    chain_attempts: int = 3
    interval_confidence: float = 0.95
    speculate: bool = True
    max_per_subset: int = 48
    # Before "found": every configuration of the answer's attribution (good, bad, each named
    # cause added alone and removed alone, all of them added and removed) has this many
    # trials, so what restoring each cause wins back rests on more than the two or three
    # restarts that happened to decide it (intervals taken where the noise read low).
    attribution_min_per_subset: int = 4
    # The same for a configuration all of whose attribution comparisons are within one
    # server lifetime (live differences only): its noise is the repetitions' of every lifetime.
    attribution_min_live: int = 2
    # What the answer says is left (bad without the named causes against good) compares
    # different launches even when every named cause was measured within lifetimes: its
    # sides need this many restarts each before "nothing else matters" is claimed. With
    # only the paired pairs' 2 lifetimes, a +4.9% NCCL_PROTO under a 4% min effect was
    # cleared at P >= 0.99 in 11 of 200 seeds; with 4 a side in 21 of 800, with 6 in 5 of
    # 400 (restarts 32 -> 37 mean; the restart design: 1 of 200, 56 restarts), with 8 in 2
    # of 400 (40 restarts): `python -m experiments.bench_lifetime --story seed_system
    # --nccl-mult 0.65`.
    rest_min_per_side: int = 6
    attribution_max_causes: int = 4
