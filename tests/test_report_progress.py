"""Live progress: counters, durations and ETA from events, plain lines off a terminal, a rich
panel on one. A fake clock makes every number exact."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from orchestrator.records import Candidate, Outcome, TrialResult
from orchestrator.store import TrialRow
from orchestrator.strategies.base import Culprit, Verdict
from orchestrator.ui.progress import (
    Progress,
    expected_bisect_trials,
    format_duration,
    verdict_best,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _plain(total: int | None = 6) -> tuple[Progress, io.StringIO, Clock]:
    buf, clock = io.StringIO(), Clock()
    console = Console(file=buf, width=300, force_terminal=False)
    return Progress(console, total_hint=total, clock=clock), buf, clock


def _row(tid: int, node: str, outcome: Outcome, started: float, ended: float) -> TrialRow:
    return TrialRow(id=tid, candidate_id=1, candidate=Candidate.make("b" * 40), node=node,
                    phase="search", attempt=1, state="done", outcome=outcome, detail="",
                    started_at=started, ended_at=ended, log_path="", suspect=False,
                    result=TrialResult(outcome))


def test_events_give_counts_durations_and_eta():
    progress, buf, clock = _plain(total=6)
    assert not progress.live_mode  # a StringIO is not a terminal
    progress.on_event("trial 1 started on local-0: abc123 NCCL_PROTO=LL (reproduce)")
    progress.on_event("trial 2 started on local-1: def456 (reproduce)")
    clock.now += 4
    progress.on_event("trial 1 on local-0 ok in 10.0s")
    progress.on_event("trial 3 started on local-0: abc123 NCCL_PROTO=LL (reproduce)")
    clock.now += 2
    progress.on_event("trial 2 on local-1 launch_failed in 6.0s: exit 1")
    s = progress.snapshot()
    assert (s.done, s.ok, s.failed) == (2, 1, 1)
    assert [r.trial_id for r in s.running] == [3] and s.running[0].label == "abc123 NCCL_PROTO=LL"
    assert s.running[0].phase == "reproduce"
    assert s.nodes == ("local-0", "local-1") and s.done_per_node == {"local-0": 1, "local-1": 1}
    assert s.mean_duration == 8.0 and s.last_duration == 6.0
    # 3 trials not started x 8 s + (8 - 2) s left of trial 3, over 2 nodes.
    assert s.eta_s == pytest.approx((3 * 8 + 6) / 2)
    lines = buf.getvalue().splitlines()
    assert lines[0] == "trial 1 started on local-0: abc123 NCCL_PROTO=LL (reproduce)"
    assert "progress: 1/~6 trials done (1 ok, 0 failed)" in lines[3]
    assert lines[-1].startswith("progress: 2/~6 trials done (1 ok, 1 failed) · running local-0 #3")
    assert lines[-1].endswith("ETA ~15s")


def test_verdicts_print_only_when_they_change():
    progress, buf, _ = _plain()
    progress.on_verdict("searching", "abc123", 0.42)
    progress.on_verdict("searching", "abc123", 0.42)
    progress.on_verdict("searching", "abc123", 0.47)  # shows on the next trial's line
    assert "p=0.470" in progress.line()
    progress.on_verdict("verifying", "abc123", 0.995)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 2
    assert "best abc123 p=0.420 · [searching]" in lines[0]
    assert "best abc123 p=0.995 · [verifying]" in lines[1]
    progress.on_verdict("found", "abc123", 0.99996)
    assert "best abc123 p>0.999 · [found]" in buf.getvalue().splitlines()[-1]


def test_rows_count_once_even_with_their_events():
    progress, buf, _ = _plain(total=None)
    progress.on_event("trial 7 on local-2 ok in 3.0s")
    progress.on_trial(_row(7, "local-2", Outcome.OK, 10.0, 13.0))  # same trial: no new line
    progress.on_trial(_row(8, "local-2", Outcome.CRASHED, 13.0, 18.0))
    progress.on_trial(TrialRow(**{**_row(9, "local-2", Outcome.OK, 0, 0).__dict__,
                                  "outcome": None}))  # unfinished: ignored
    s = progress.snapshot()
    assert (s.done, s.ok, s.failed, s.mean_duration) == (2, 1, 1, 4.0)
    assert s.eta_s is None  # no total: no ETA is invented
    text = buf.getvalue()
    assert text.count("trial 7") == 1 and "trial 8 on local-2 crashed in 5.0s" in text
    assert "ETA" not in text


def test_a_resumed_run_counts_on_from_its_stored_trials():
    """The store's finished trials are counted (silently) from the start: a resumed run's
    count goes on from 2, not from 0, with the store's node names and durations."""
    buf, clock = io.StringIO(), Clock()
    stored = [_row(1, "gpu-a", Outcome.OK, 10.0, 14.0), _row(2, "gpu-b", Outcome.CRASHED, 10.0, 16.0),
              TrialRow(**{**_row(3, "gpu-a", Outcome.OK, 0, 0).__dict__, "outcome": None})]
    progress = Progress(Console(file=buf, width=300, force_terminal=False), total_hint=6,
                        clock=clock, done=stored)
    assert buf.getvalue() == ""  # what was done before is counted, not printed again
    progress.on_event("trial 4 started on gpu-a: abc123 (search)")
    progress.on_event("trial 4 on gpu-a ok in 2.0s")
    s = progress.snapshot()
    assert (s.done, s.ok, s.failed) == (3, 2, 1)
    assert s.nodes == ("gpu-a", "gpu-b") and s.done_per_node == {"gpu-a": 2, "gpu-b": 1}
    assert s.mean_duration == 4.0
    assert buf.getvalue().splitlines()[-1].startswith("progress: 3/~6 trials done (2 ok, 1 failed)")


def test_live_panel_on_a_terminal():
    buf, clock = io.StringIO(), Clock()
    console = Console(file=buf, width=140, force_terminal=True, color_system=None)
    with Progress(console, total_hint=4, clock=clock) as progress:
        assert progress.live_mode
        progress.on_event("trial 1 started on local-0: abc123 (search)")
        clock.now += 65
        progress.on_verdict("searching", "abc123", 0.5)
        panel = Console(file=io.StringIO(), width=140, color_system=None)
        panel.print(progress.render())
        text = panel.file.getvalue()
        progress.on_event("trial 1 on local-0 ok in 65.0s")
        assert progress.snapshot().eta_s == pytest.approx(195.0)  # 3 x 65 s on one node
    assert "local-0" in text and "#1 search" in text and "1m05s" in text
    assert "best: abc123  P = 0.500" in text and "ETA ~?" in text
    out = buf.getvalue()
    assert "trial 1 on local-0 ok in 65.0s" in out and "trials per node" in out
    # The frame left on the screen once the run is over promises no more time.
    last_frame = out[out.rindex("trials per node"):]
    assert "ETA" not in last_frame and "· ended" in last_frame, last_frame
    assert progress.snapshot().eta_s is None and "ETA" not in progress.line()


def test_helpers():
    assert expected_bisect_trials(100) == 4 + 7 + 2 + 4
    assert expected_bisect_trials(1) == expected_bisect_trials(2)
    assert [format_duration(s) for s in (None, 9.4, 75, 3725)] == ["?", "9s", "1m15s", "1h02m"]


def test_verdict_best():
    labels = ["good", "c1", "c2", "bad"]
    assert verdict_best(Verdict(False, "reproducing", posterior=[0.0] * 4), labels) == (None, None)
    searching = Verdict(False, "searching", posterior=[0.0, 0.2, 0.7, 0.1])
    assert verdict_best(searching, labels) == ("c2", 0.7)
    found = Verdict(True, "found", culprits=[Culprit(1, 0.6), Culprit(2, 0.995)],
                    posterior=[0.0, 0.9, 0.05, 0.05])
    assert verdict_best(found, labels) == ("c2", 0.995)


def _three_one_second_trials(progress: Progress, clock: Clock) -> None:
    for tid in (1, 2, 3):
        progress.on_event(f"trial {tid} started on local-0: abc123 (search)")
        clock.now += 1
        progress.on_event(f"trial {tid} on local-0 ok in 1.0s")


def test_an_outgrown_estimate_is_dropped_not_printed_as_more_than_all():
    progress, buf, clock = _plain(total=2)
    _three_one_second_trials(progress, clock)
    s = progress.snapshot()
    assert s.done == 3 and s.total_hint is None and s.eta_s is None
    last = buf.getvalue().splitlines()[-1]
    assert last.startswith("progress: 3 trials done (3 ok, 0 failed)") and "ETA" not in last


def test_a_strategy_forecast_sets_the_total_from_the_trials_done():
    progress, buf, clock = _plain(total=2)
    _three_one_second_trials(progress, clock)
    progress.set_remaining(40)  # the estimate was outgrown; the forecast brings the ETA back
    s = progress.snapshot()
    assert s.total_hint == 43 and s.eta_s == pytest.approx(40.0)
    assert progress.line().startswith("progress: 3/~43 trials done")


def test_the_reproduction_notice_states_the_change_the_forecast_and_a_budget_it_exceeds():
    from orchestrator.commands.bisect_notes import reproduction_notice

    searching = Verdict(done=False, status="searching", n_trials=40, total_effect_pct=2.1,
                        total_effect_ci=(0.4, 3.9), expected_remaining=480)
    line, forecast = reproduction_notice(searching, "verify_ms", budget=None)
    assert "verify_ms +2.1% [+0.4%, +3.9%]" in line and "after 40 trials" in line
    assert "about 480 more trials" in forecast
    assert len(reproduction_notice(searching, "verify_ms", budget=600)) == 2  # 40 + 480 fit
    _, _, warning = reproduction_notice(searching, "verify_ms", budget=200)
    assert "needs about 480 more restarts" in warning and "budget of 200" in warning
    assert "bench.repetitions" in warning and "max_trials=N" in warning
    noisy = Verdict(done=False, status="searching", n_trials=40, total_effect_pct=43.0,
                    expected_remaining=900, noise_pct=20.0)
    assert "a +43.0% change in 20.0% restart noise, 2.1 noise widths" in \
        reproduction_notice(noisy, "value", budget=400)[2]
    unforecast = Verdict(done=False, status="searching", n_trials=4, total_effect_pct=53.0)
    (line,) = reproduction_notice(unforecast, "verify_ms", budget=5)
    assert line.endswith("after 4 trials") and "forecast" not in line


def test_a_running_bisect_says_when_the_forecast_leaves_the_budget_and_a_small_verified_step():
    """Said once each, when it shows: the forecast moving past the budget after the first
    notice, and a step under verification far smaller than the endpoints' change."""
    from orchestrator.commands.bisect_notes import running_notes

    said = {"reproduced"}
    late = Verdict(done=False, status="searching", n_trials=60, total_effect_pct=43.0,
                   expected_remaining=500, noise_pct=18.0)
    (line,) = running_notes(late, "value", 400, said)
    assert "needs about 500 more restarts" in line
    assert running_notes(late, "value", 400, said) == []  # once
    step = Verdict(done=False, status="verifying", n_trials=80, total_effect_pct=43.0,
                   verifying={"point": 35, "pct": 9.0, "ci": (2.0, 16.5)})
    (line,) = running_notes(step, "value", 400, said)
    assert "point 35 reads value +9.0% [+2.0%, +16.5%] while the endpoints differ by +43.0%" \
        in line


def _isolate_verdict(status: str, label: str | None = None, probability: float = 0.0):
    from orchestrator.strategies.isolate.report import IsolateCulprit, IsolateVerdict

    culprits = ([IsolateCulprit((0,), (label,), "single", probability)]
                if label is not None else [])
    return IsolateVerdict(done=status == "found", status=status, culprits=culprits)


def test_isolate_says_when_its_phase_or_leading_cause_changes_not_after_every_trial():
    """Off a live view, `sleuth isolate` printed '[verifying] N trials' once per trial (55
    lines in the demo) and never what it was verifying."""
    from orchestrator.commands.isolate import _reporter

    buf = io.StringIO()
    report = _reporter(Console(file=buf, width=200, markup=False), None)
    report(_isolate_verdict("reproducing"), 4)
    report(_isolate_verdict("reproducing"), 5)
    report(_isolate_verdict("verifying", "power_limit_w", 0.8), 9)
    report(_isolate_verdict("verifying", "power_limit_w", 0.9), 10)
    report(_isolate_verdict("verifying", "NCCL_PROTO", 0.6), 14)
    report(_isolate_verdict("found", "power_limit_w", 0.9999), 20)
    assert buf.getvalue().splitlines() == [
        "  [reproducing] 4 trials",
        "  [verifying] 9 trials; best power_limit_w p=0.800",
        "  [verifying] 14 trials; best NCCL_PROTO p=0.600",
        "  [found] 20 trials; best power_limit_w p>0.999",
    ]


def test_a_later_experiment_takes_the_progress_line_over():
    """In the demo one progress line serves bisect, compare and isolate in turn: the isolate
    trials ran under "best <bisect culprit> p>0.999 · [found]" and the bisect's trial total."""
    from orchestrator.commands.isolate import _reporter

    progress, buf, _ = _plain(total=20)
    progress.on_verdict("found", "abc123", 0.9999)
    report = _reporter(Console(file=io.StringIO()), progress)
    report(_isolate_verdict("reproducing"), 1)
    line = buf.getvalue().splitlines()[-1]
    assert "[reproducing]" in line and "abc123" not in line and "/~20" not in progress.line()
    report(_isolate_verdict("verifying", "NCCL_PROTO", 0.7), 9)
    assert "best NCCL_PROTO p=0.700 · [verifying]" in buf.getvalue().splitlines()[-1]
