"""Which stored trials are evidence (`drive.observation`), the one rule every experiment (bisect,
isolate, sweep) and its resume share.

A failure the controller does not retry must count as untestable at its first attempt: when
it was "not evidence, a retry will come", a sweep whose configuration could not get its
variables to the server (`env_mismatch`) proposed that same restart again, endlessly.
"""

from __future__ import annotations

import dataclasses

import pytest

from orchestrator.control.controller import RETRYABLE
from orchestrator.control.drive import observation, unreported
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.store import TrialRow

FINAL_ATTEMPT = 2  # trial.retries = 1


def _row(outcome: Outcome, attempt: int = 1) -> TrialRow:
    measurements = (Measurement(0, {"verify_ms": 18.0}),) if outcome is Outcome.OK else ()
    return TrialRow(id=7, candidate_id=1, candidate=Candidate.make("a" * 40), node="local-0",
                    phase="sweep/search/3", attempt=attempt, state="done", outcome=outcome,
                    detail="", started_at=1.0, ended_at=2.0, log_path="", suspect=False,
                    result=TrialResult(outcome, measurements=measurements))


@pytest.mark.parametrize("outcome", sorted(set(Outcome) - RETRYABLE - {Outcome.OK,
                                                                      Outcome.INTERRUPTED}))
def test_a_failure_the_controller_does_not_retry_is_untestable_at_once(outcome):
    o = observation(_row(outcome, attempt=1), 5, "verify_ms", FINAL_ATTEMPT)
    assert o is not None and o.value is None and o.point == 5 and o.trial_id == 7


@pytest.mark.parametrize("outcome", sorted(RETRYABLE))
def test_a_retried_failure_waits_for_its_retry_and_the_last_attempt_counts(outcome):
    assert observation(_row(outcome, attempt=1), 0, "verify_ms", FINAL_ATTEMPT) is None
    last = observation(_row(outcome, attempt=FINAL_ATTEMPT), 0, "verify_ms", FINAL_ATTEMPT)
    assert last is not None and last.value is None


def test_measured_and_interrupted_trials():
    assert observation(_row(Outcome.OK), 0, "verify_ms", FINAL_ATTEMPT).value == 18.0
    assert observation(_row(Outcome.INTERRUPTED, attempt=FINAL_ATTEMPT), 0, "verify_ms",
                       FINAL_ATTEMPT) is None  # re-run, never evidence


def test_trials_that_ran_but_did_not_report_the_metric_are_named_with_what_they_did_report():
    """They count as unmeasurable points; without this line the run would only say that an
    endpoint could not be measured."""
    rows = [_row(Outcome.OK), _row(Outcome.LAUNCH_FAILED, attempt=FINAL_ATTEMPT), _row(Outcome.OK)]
    assert unreported(rows, "verify_ms") is None
    line = unreported(rows, "decode_ms")
    assert line is not None and line.startswith("2 trial(s) ran but reported no decode_ms")
    assert "they reported: verify_ms" in line


def test_only_this_experiments_trials_count_as_not_reporting_the_metric():
    """A plain-decode reference measured in the same run has no verify_ms on purpose, and a
    trial of a candidate the experiment does not search is not its business: neither makes
    the line (the demo's bisect and isolate warned about the two reference trials)."""
    plain = dataclasses.replace(_row(Outcome.OK), phase="reference",
                                result=TrialResult(Outcome.OK,
                                                   (Measurement(0, {"decode_ms": 9.0}),)))
    assert unreported([plain], "verify_ms") is None
    other = dataclasses.replace(plain, phase="bisect", candidate=Candidate.make("b" * 40))
    assert unreported([other], "verify_ms") is not None
    assert unreported([other], "verify_ms", [Candidate.make("a" * 40)]) is None
    assert unreported([other], "verify_ms", [other.candidate]) is not None
