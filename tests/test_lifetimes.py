"""Comparisons within one server lifetime: the block order, the block rows, the split-plot
statistics (calibrated on seeded lifetimes with restart noise, repetition noise and a
lifetime-by-setting interaction), what SGLang 0.5.23 lets change at run time, and the isolate
on the system stories with and without it (virtual trials, no server)."""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path

import pytest
from conftest import seed_counts

from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.run.blocks import block_results, level_candidate, lifetime_of
from orchestrator.runner.lifetime import block_order
from orchestrator.stats.lifetimes import Cell, SplitPlot, components
from orchestrator.strategies.base import Observation
from orchestrator.strategies.isolate.stats import SubsetEvidence
from orchestrator.system import runtime_settable

FIXTURE = Path(__file__).parent / "fixtures" / "sglang_0_5_23" / "runtime_settings.json"


def test_blocks_alternate_so_a_linear_drift_adds_alike_to_each_level():
    order = block_order(2, 4)
    assert order == [0, 1, 1, 0, 0, 1, 1, 0]
    # the mean position of each level's blocks is the same: a linear drift cancels
    pos = {lv: statistics.fmean(i for i, x in enumerate(order) if x == lv) for lv in (0, 1)}
    assert pos[0] == pos[1]
    assert block_order(4, 2) == [0, 1, 2, 3, 3, 2, 1, 0]


def test_a_lifetime_becomes_one_block_row_per_level():
    measurements = tuple(Measurement(i, {"verify_ms": v}, 1.0)
                         for i, v in enumerate([20.0, 26.0, 26.5, 20.5, 19.5, 25.5]))
    live = {"levels": ["power:600", "default"], "blocks": [0, 1, 1, 0, 0, 1],
            "snapshots": [{"gpus": [{"power_limit_w": 600}]}, {"gpus": [{"power_limit_w": 450}]}]}
    result = TrialResult(Outcome.OK, measurements=measurements, started_at=1.0, ended_at=9.0,
                         fingerprint={"live": live, "clock_policy": "default"})
    rows = block_results(7, result)
    assert [lv for lv, _ in rows] == ["power:600", "default"]
    first, second = rows[0][1], rows[1][1]
    assert first.values("verify_ms") == [20.0, 20.5, 19.5]
    assert second.values("verify_ms") == [26.0, 26.5, 25.5]
    assert first.started_at == first.ended_at  # the restart's cost is its lifetime row's
    assert lifetime_of(first.fingerprint) == 7 and "live" not in first.fingerprint
    assert first.fingerprint["gpu"] == live["snapshots"][0]  # the GPUs as that level left them
    cand = Candidate.make("a" * 40, clock="locked:off")
    assert level_candidate(cand, "power:600").clock == "locked:off,power:600"
    assert level_candidate(cand, "default").key == cand.key


def test_a_lifetime_finished_without_its_blocks_gets_them_on_resume(tmp_path):
    """A controller stopped between a finished lifetime's row and its block rows (two writes):
    reopened, the run writes the blocks from the lifetime's stored result, once, so the
    restart it paid for is evidence (a make test run under load lost one this way)."""
    from orchestrator.run.blocks import recover
    from orchestrator.store import RunStore

    store = RunStore.create(tmp_path / "trials.db", run_id="r", command="isolate",
                            config_yaml="{}")
    try:
        cand = Candidate.make("a" * 40)
        measurements = tuple(Measurement(i, {"verify_ms": v}, 1.0)
                             for i, v in enumerate([20.0, 26.0, 26.5, 20.5]))
        live = {"levels": ["power:600", "default"], "blocks": [0, 1, 1, 0], "snapshots": []}
        tid = store.begin_trial(store.candidate_id(cand), node="local-0", phase="lifetime")
        store.finish_trial(tid, TrialResult(Outcome.OK, measurements=measurements,
                                            started_at=1.0, ended_at=9.0,
                                            fingerprint={"live": live, "clock_policy": "default"}))
        written = recover(store)
        assert len(written) == 2 and recover(store) == []
        rows = {r.id: r for r in store.trials()}
        assert [rows[i].result.values("verify_ms") for i in written] == [[20.0, 20.5],
                                                                       [26.0, 26.5]]
        assert {lifetime_of(rows[i].result.fingerprint) for i in written} == {tid}
    finally:
        store.close()


def test_what_sglang_0_5_23_lets_change_at_run_time():
    facts = json.loads(FIXTURE.read_text())
    assert set(facts["settable_at_run_time"]) == runtime_settable.SGLANG_RUNTIME_SETTABLE
    assert set(facts["gpu_settings_settable_at_run_time"]["parts"]) == \
        runtime_settable.LIVE_CLOCK_PARTS
    assert runtime_settable.is_live("clock", "power")
    assert not runtime_settable.is_live("clock", "persistence")
    assert not runtime_settable.is_live("env", "NCCL_PROTO")


def _lifetimes(rng: random.Random, n: int, effect: float, restart_sd: float, rep_sd: float,
               reps: int, interaction_sd: float = 0.0):
    """Cells of `n` lifetimes that measured levels A and B (B = A + effect), log scale."""
    cells, values = {}, {"A": [], "B": []}
    for t in range(n):
        r = rng.gauss(0.0, restart_sd)
        cells[t] = {}
        for key, mu in (("A", 3.0), ("B", 3.0 + effect)):
            x = [mu + r + rng.gauss(0.0, interaction_sd) * (key == "B") + rng.gauss(0.0, rep_sd)
                 for _ in range(reps)]
            m = statistics.fmean(x)
            cells[t][key] = Cell(m, statistics.variance(x), reps)
            values[key].append(m)
    return cells, values


@pytest.mark.parametrize("interaction_sd", [0.0, 0.01])
def test_a_paired_difference_within_lifetimes_covers_the_truth(interaction_sd):
    """95% intervals of B - A over seeded lifetimes (restart noise 5%, repetitions 1%, three
    repetitions a level, 2-4 lifetimes): coverage near 95% with or without a lifetime-by-setting
    interaction (the F test then stops pooling the repetitions in), and much narrower than
    restart noise would allow."""
    rng = random.Random(45)
    covered, widths, runs = 0, [], 400
    for _ in range(runs):
        n = rng.choice([2, 3, 4])
        cells, values = _lifetimes(rng, n, 0.10, 0.05, 0.01, 3, interaction_sd)
        est, se, df = SplitPlot(cells, components(cells, values)).contrast({"B": 1.0, "A": -1.0})
        from scipy.special import stdtrit
        half = float(stdtrit(df, 0.975)) * se
        covered += est - half <= 0.10 <= est + half
        widths.append(half)
    assert 0.92 <= covered / runs <= 0.99
    # restart noise of 5% would give half-widths of several percent; paired they stay small
    assert statistics.median(widths) < 0.03


def test_the_restart_noise_counts_where_a_contrast_compares_different_lifetimes():
    rng = random.Random(7)
    cells, values = _lifetimes(rng, 4, 0.10, 0.05, 0.005, 3)
    # a third configuration, measured alone in four lifetimes of its own
    for t in range(4, 8):
        v = 3.2 + rng.gauss(0.0, 0.05)
        cells[t] = {"C": Cell(v, None, 3)}
        values.setdefault("C", []).append(v)
    fit = SplitPlot(cells, components(cells, values))
    _, se_paired, _ = fit.contrast({"B": 1.0, "A": -1.0})
    _, se_across, _ = fit.contrast({"C": 1.0, "A": -1.0})
    assert se_across > 5 * se_paired


def test_without_lifetimes_the_evidence_is_the_plain_pooled_one():
    rng = random.Random(3)
    plain, live = SubsetEvidence(1.0), SubsetEvidence(1.0, frozenset({0}))
    for i in range(12):
        subset = frozenset({0}) if i % 2 else frozenset()
        obs = Observation(0, math.exp(3.0 + 0.1 * (i % 2) + rng.gauss(0, 0.03)))
        plain.add(subset, obs)
        live.add(subset, obs)
    weights = {frozenset({0}): 1.0, frozenset(): -1.0}
    assert plain.contrast(weights) == live.contrast(weights)


def test_a_lifetime_counts_once_against_the_budget():
    ev = SubsetEvidence(1.0, frozenset({0}))
    for t in (1, 2):
        for subset, v in ((frozenset(), 20.0), (frozenset({0}), 26.0)):
            ev.add(subset, Observation(0, v * (1 + 0.01 * t), trial_id=t, repetitions=3,
                                       spread=1e-4, lifetime=t))
    assert ev.n_trials == 2
    c = ev.contrast({frozenset({0}): 1.0, frozenset(): -1.0})
    assert c is not None and c.estimate == pytest.approx(math.log(26.0 / 20.0), abs=1e-9)


def test_a_power_limit_alone_is_isolated_within_three_restarts():
    from experiments.bench_lifetime import run

    for seed in range(5):
        with_lifetimes = run("power_only", seed, "lifetime", restart_cv=0.02, rep_cv=0.01,
                             reps=3, interaction_cv=0.0)
        assert with_lifetimes.correct and with_lifetimes.restarts <= 3


@pytest.mark.parametrize("seeds", seed_counts(10, 2))
def test_the_system_stories_need_fewer_restarts_and_stay_right(seeds):
    """Every system story with a clock difference, 10 seeds each (2 in the fast lane), in 2%
    and 5% restart noise: right as often as with a restart per side, wrong at the stated
    confidence no more often than it allows, and with fewer restarts.

    "Never wrong" is not what P >= 0.99 promises: one confident answer in a hundred may be
    wrong. Since the isolate judges a cleared difference against the run's 4% min effect (it
    was 1%, which no interval of a few restarts could reach), one seed of `seed_system` in 5%
    restart noise clears NCCL_PROTO (+9.9%) at P = 0.993 after 7 lifetimes: 1 in 60 seeds of
    that story, the restart design 0 in 60. So the count of wrong confident answers is held
    to what the stated 1% allows (the 99.9% binomial bound), over every run here."""
    from scipy.stats import binom

    from experiments.bench_lifetime import STORIES, run

    confident = wrong = 0
    for cv in (0.02, 0.05):
        spent = {"restarts": 0, "lifetime": 0}
        for story in STORIES:
            got = {d: [run(story, s, d, restart_cv=cv, rep_cv=0.01, reps=3, interaction_cv=0.0)
                       for s in range(seeds)] for d in ("restarts", "lifetime")}
            rs = [r for runs in got.values() for r in runs]
            confident += sum(r.status == "found" and r.probability >= 0.99 for r in rs)
            wrong += sum(r.wrong_confident for r in rs)
            assert sum(r.correct for r in got["lifetime"]) >= sum(
                r.correct for r in got["restarts"]) - 1, story
            for design, runs in got.items():
                spent[design] += sum(r.restarts for r in runs)
        # per story the counts scatter (a restart-level cause near the naming threshold takes
        # what it takes either way); over the stories the lifetimes save restarts
        assert spent["lifetime"] < 0.8 * spent["restarts"], (cv, spent)
    assert wrong <= max(1, binom.ppf(0.999, confident, 0.01)), (wrong, confident)


def test_a_lifetime_slow_throughout_is_left_out_and_normal_noise_is_not():
    from orchestrator.stats.lifetimes import outlier_lifetimes

    rng = random.Random(11)
    flagged_normal = 0
    for _ in range(200):
        cells, _ = _lifetimes(rng, 6, 0.10, 0.03, 0.01, 3)
        flagged_normal += len(outlier_lifetimes(cells))
    assert flagged_normal == 0
    cells, _ = _lifetimes(rng, 6, 0.10, 0.03, 0.01, 3)
    cells[2] = {k: Cell(c.value + math.log(3.0), c.spread, c.repetitions)
                for k, c in cells[2].items()}
    assert outlier_lifetimes(cells) == {2}


def test_one_launch_in_ten_slow_is_found_however_many_there_are():
    """Restarts of their own (one cell a lifetime, the restart design) of 12 configurations,
    six each, one in ten 3x slow throughout: each such restart stands 40 restart sds out, but
    the sd pooled over the rest takes in the others (0.3 on log values of 0.03 noise) and
    none of them stood 10 of those out. The median distance does not take them in: every
    slow one is found (and where half a configuration's restarts are slow, which half is
    not known: all of them are left out), and with none planted none is."""
    from orchestrator.stats.lifetimes import outlier_lifetimes

    rng = random.Random(5)
    for _ in range(20):
        cells, slow = {}, set()
        for t in range(72):
            value = 3.0 + 0.1 * (t % 12) + rng.gauss(0.0, 0.03)
            if rng.random() < 0.1:
                value += math.log(3.0)
                slow.add(t)
            cells[t] = {t % 12: Cell(value, None, 3)}
        clean = {t: {k: Cell(c.value - math.log(3.0) * (t in slow), None, 3)
                     for k, c in cell.items()} for t, cell in cells.items()}
        split = {k for k in range(12) if 2 * sum(t % 12 == k for t in slow) >= 6}
        assert outlier_lifetimes(cells) == slow | {t for t in cells if t % 12 in split}
        assert outlier_lifetimes(clean) == set()


@pytest.mark.parametrize("seeds", seed_counts(20, 3))
def test_outlier_launches_do_not_make_the_isolate_confidently_wrong(seeds):
    """One restart in ten 3x slow throughout, in both designs: the isolate leaves them out
    (a restart judged against its subset's other restarts, as the bisect judges a commit's)
    and is wrong at its confidence no more often than the stated 1% allows. Before the median
    bounded the spread they are judged against, 21 of 30 `seed_system` runs of the restart
    design and 16 of 30 with lifetimes named a wrong set at P >= 0.99 (docs/reliability.md)."""
    from scipy.stats import binom

    from experiments.bench_lifetime import STORIES, run

    runs = [run(story, seed, design, restart_cv=0.02, rep_cv=0.01, reps=3, interaction_cv=0.0,
                outlier_rate=0.1)
            for story in STORIES for seed in range(seeds) for design in ("restarts", "lifetime")]
    confident = sum(r.status == "found" and r.probability >= 0.99 for r in runs)
    wrong = [r for r in runs if r.wrong_confident]
    assert len(wrong) <= max(1, binom.ppf(0.999, confident, 0.01)), wrong
    assert sum(r.correct for r in runs) >= 0.8 * len(runs)


@pytest.mark.parametrize("seeds", seed_counts(200, 10))
def test_a_difference_just_over_the_min_effect_is_not_cleared_on_a_few_lifetimes(seeds):
    """NCCL_PROTO at +4.9% beside a power-limit-like clock lock (the README seed story's
    shape): every named cause is measured within lifetimes, but what is left (bad without
    them against good) compares different launches. Cleared on 3 against 2 lifetimes, it was
    wrong at P >= 0.99 in 11 of 200 seeds; with its own restarts a side, no more often than
    the stated 1% allows (the 99.9% binomial bound)."""
    from scipy.stats import binom

    from experiments.bench_lifetime import run

    runs = [run("seed_system", s, "lifetime", restart_cv=0.02, rep_cv=0.01, reps=3,
                interaction_cv=0.0, nccl_mult=0.65) for s in range(seeds)]
    confident = sum(r.status == "found" and r.probability >= 0.99 for r in runs)
    wrong = sum(r.wrong_confident for r in runs)
    assert wrong <= max(1, binom.ppf(0.999, confident, 0.01)), (wrong, confident)
    assert sum(r.correct for r in runs) >= 0.9 * seeds
