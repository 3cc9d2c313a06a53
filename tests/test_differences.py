"""The difference model: one change per factor level, every clock setting its own factor,
labels that say what was recorded, and candidates that are distinct and stable."""

from __future__ import annotations

import pytest

from orchestrator.commands.isolate_points import IsolatePoints
from orchestrator.errors import SleuthError, UserError
from orchestrator.gpu.base import ClockPolicy, format_parts, parse_parts
from orchestrator.records import UNSET, Candidate
from orchestrator.strategies.isolate import IsolateStrategy
from orchestrator.system.differences import (
    Change,
    apply,
    changes_between,
    changes_from_system,
    check_distinct,
    reference_good,
)
from orchestrator.system.fingerprint_diff import Difference, diff

SHA = "a" * 40


def _same(ref: str) -> str:
    return ref


def _gpus(**fields) -> dict:
    base = {"power_limit_w": 600, "sm_clock_locked_mhz": None, "mem_clock_locked_mhz": None,
            "applications_clock_sm_mhz": 2430, "applications_clock_sm_default_mhz": 2430,
            "persistence_mode": True}
    return {"gpus": [{"index": i, **base, **fields} for i in range(2)]}


def test_existing_policies_keep_their_spelling_so_resumed_candidates_keep_their_keys():
    for text in ("default", "power:450", "locked:1980", "locked:1980,power:450", "reset"):
        assert format_parts(parse_parts(text)) == text
    key = Candidate.make(SHA, clock="locked:1980,power:450").key
    spec = {"commit": SHA, "clock": "locked:1980,power:450"}
    assert apply(spec, [], (), _same).key == key
    with pytest.raises(UserError, match="persistence"):
        ClockPolicy.parse("persistence:maybe")
    with pytest.raises(UserError, match="twice"):
        ClockPolicy.parse("power:400,power:500")


def test_power_limit_and_sm_lock_changed_together_are_two_restorable_factors():
    """The issue's case: 600 -> 450 W and an SM lock at 1900 MHz, both from outside. Each is
    its own change; the good side restores both; every subset is its own candidate."""
    ref, now = {"gpu": _gpus()}, {"gpu": _gpus(power_limit_w=450, sm_clock_locked_mhz=1900)}
    diffs = diff(ref, now)
    assert [(d.key, d.factor) for d in diffs if d.category == "clock"] == [
        ("power_limit_w", ("clock", "power", "600")),
        ("sm_clock_locked_mhz", ("clock", "locked", "off"))]
    changes = changes_from_system(diffs)
    assert [c.label for c in changes] == ["power limit: 600 W -> 450 W",
                                          "SM clock lock: none -> 1900 MHz"]
    good = reference_good(Candidate.make(SHA), changes)
    assert apply(good, changes, (), _same).clock == "locked:off,power:600"
    assert apply(good, changes, [0], _same).clock == "locked:off"
    assert apply(good, changes, [1], _same).clock == "power:600"
    assert apply(good, changes, [0, 1], _same).clock == "default"
    assert len({apply(good, changes, s, _same).key for s in ([], [0], [1], [0, 1])}) == 4
    check_distinct(good, changes, _same)


def test_every_clock_setting_is_its_own_factor():
    ref = {"gpu": _gpus()}
    now = {"gpu": _gpus(mem_clock_locked_mhz=9001, applications_clock_sm_mhz=1800,
                        persistence_mode=False)}
    factors = {d.key: d.factor for d in diff(ref, now) if d.category == "clock"}
    assert factors == {"mem_clock_locked_mhz": ("clock", "mem_locked", "off"),
                       "applications_clock_sm_mhz": ("clock", "app", "default"),
                       "persistence_mode": ("clock", "persistence", "on")}
    changes = changes_from_system(diff(ref, now))
    good = reference_good(Candidate.make(SHA), changes)
    assert ClockPolicy.parse(apply(good, changes, (), _same).clock) == ClockPolicy(
        mem_unlock=True, app_default=True, persistence=True)
    labels = [c.label for c in changes]
    assert "SM applications clock: 2430 MHz -> 1800 MHz" in labels  # never "None -> 1800"
    assert "persistence mode: on -> off" in labels


def test_a_reference_that_differs_between_gpus_cannot_be_restored_by_one_policy():
    ref = {"gpu": {"gpus": [{"index": 0, "power_limit_w": 600}, {"index": 1, "power_limit_w": 500}]}}
    now = {"gpu": {"gpus": [{"index": 0, "power_limit_w": 450}, {"index": 1, "power_limit_w": 450}]}}
    (d,) = diff(ref, now)
    assert not d.controllable and "one policy" in d.detail


def test_system_env_labels_say_what_each_side_recorded():
    """Not `unset -> unset` for a variable set only now, not `WARN -> unset` for one that is
    INFO now: the now side is the node as it is, and its value is what the record shows."""
    ref = {"env": {"server": {"NCCL_DEBUG": "WARN"}}}
    now = {"env": {"server": {"NCCL_DEBUG": "INFO", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}}}
    changes = {c.key: c for c in changes_from_system(diff(ref, now))}
    assert changes["NCCL_DEBUG"].label == "NCCL_DEBUG: WARN -> INFO"
    assert changes["PYTORCH_CUDA_ALLOC_CONF"].label == \
        "PYTORCH_CUDA_ALLOC_CONF: unset -> expandable_segments:True"
    good = reference_good(Candidate.make(SHA), list(changes.values()))
    cand = apply(good, list(changes.values()), (), _same)
    assert cand.env_dict == {"NCCL_DEBUG": "WARN", "PYTORCH_CUDA_ALLOC_CONF": UNSET}


def test_explicit_specs_split_clock_parts_and_keep_the_other_parts():
    good, changes = changes_between(
        {"commit": "v1", "clock": "power:600", "env": {"NCCL_PROTO": "LL128"}},
        {"clock": "locked:1900,power:450", "patches": ["/p/a.patch"]})
    assert [(c.factor, c.key, c.good, c.bad) for c in changes] == [
        ("patch", "/p/a.patch", False, True), ("env", "NCCL_PROTO", "LL128", None),
        ("clock", "locked", None, "1900"), ("clock", "power", "600", "450")]
    assert apply(good, changes, range(4), _same) == Candidate.make(
        "v1", ["/p/a.patch"], {}, "locked:1900,power:450")
    assert changes[2].label == "SM clock lock: as the node is -> 1900 MHz"
    with pytest.raises(UserError, match="unknown candidate part"):
        changes_between({"colour": "red"}, {})


def test_two_subsets_that_launch_one_candidate_are_refused():
    """The 135-trial loop: changes that collapse to one candidate. Caught before any trial
    (`check_distinct`) and, for any pair of subsets, when a candidate is built."""
    changes = [Change("clock", "power", "600", None), Change("clock", "power", "600", None)]
    good = {"commit": SHA, "clock": "power:600"}
    with pytest.raises(SleuthError, match="does not change the candidate"):
        check_distinct(good, changes, _same)
    points = IsolatePoints(IsolateStrategy(2), good, changes, _same)
    points.candidate(points.strategy.point_of({0}))
    with pytest.raises(SleuthError, match="same candidate"):
        points.candidate(points.strategy.point_of({1}))


def test_points_and_candidates_map_both_ways():
    changes = changes_from_system(diff(
        {"gpu": _gpus(), "env": {"server": {"NCCL_ALGO": "Tree", "A": "1"}}},
        {"gpu": _gpus(power_limit_w=450, sm_clock_locked_mhz=1900), "env": {"server": {"A": "2"}}}))
    good = reference_good(Candidate.make(SHA), changes)
    strategy = IsolateStrategy(len(changes))
    points = IsolatePoints(strategy, good, changes, _same)
    for subset in ([], [0], [1, 3], [0, 1, 2, 3], [2]):
        cand = points.candidate(strategy.point_of(subset))
        assert points.subset_of(cand) == frozenset(subset)
        assert points.point(cand) == strategy.point_of(subset)
    assert points.point(Candidate.make(SHA, clock="power:100")) is None


def test_difference_json_round_trip_reads_the_older_env_factor_form():
    d = Difference("env", "NCCL_PROTO", "LL128", None, controllable=True,
                   factor=("env", "NCCL_PROTO", "LL128"))
    assert Difference.from_json(d.to_json()) == d
    old = {**d.to_json(), "factor": ["env", ["NCCL_PROTO", "LL128"], ["NCCL_PROTO", None]]}
    assert Difference.from_json(old).factor == ("env", "NCCL_PROTO", "LL128")


def test_isolate_with_a_patch_that_does_not_apply_is_bad_input(tmp_path, capsys):
    """It used to run trials (every one prepare_failed) and end inconclusive, exit 3."""
    from orchestrator.cli import main
    from tests.conftest import make_sim_repo

    repo = tmp_path / "repo"
    shas = make_sim_repo(repo, [{}, {"verify_mult": 1.2}])
    patch = tmp_path / "broken.patch"
    patch.write_text("--- a/nothere.py\n+++ b/nothere.py\n@@ -1 +1 @@\n-x\n+y\n")
    with pytest.raises(SystemExit) as exc:
        main(["isolate", "target=sim", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", f"good.commit={shas[0]}",
              f"bad.patches=[{patch}]", "good.env.NCCL_PROTO=LL128"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "broken.patch" in err and len(err.strip().splitlines()) == 1
    runs = tmp_path / "runs"
    assert not runs.exists() or not [p for p in runs.iterdir() if not p.name.startswith(".")]
