"""Which metrics a target's servers report: refused before a restart is spent, not after."""

from __future__ import annotations

import pytest

from orchestrator.errors import UserError
from orchestrator.metrics import check_metric

EAGLE = {"name": "sglang", "speculative_algorithm": "EAGLE3"}
PLAIN = {"name": "sim", "speculative_algorithm": None}


@pytest.mark.parametrize("target, metric", [(EAGLE, "decode_ms"), (PLAIN, "verify_ms"),
                                            (PLAIN, "draft_ms")])
def test_a_phase_metric_the_server_never_reports_is_refused(target, metric):
    with pytest.raises(UserError, match="speculative"):
        check_metric(metric, target=target)


@pytest.mark.parametrize("target, metric", [(EAGLE, "verify_ms"), (EAGLE, "tpot_ms_p50"),
                                            (PLAIN, "decode_ms"), (PLAIN, "output_throughput")])
def test_what_the_server_reports_is_accepted(target, metric):
    assert check_metric(metric, target=target).name == metric


def test_a_target_with_metrics_of_its_own_is_not_second_guessed():
    """The command target prints its own JSON: whatever it names, it may report."""
    assert check_metric("verify_ms", target={"name": "command"}).name == "verify_ms"
    assert check_metric("my_latency", custom=True, target={"name": "command"}).name == "my_latency"


def test_verify_ms_is_refused_on_a_release_without_per_pass_timers():
    old = {**EAGLE, "sglang_version": "0.5.9"}
    with pytest.raises(UserError, match="0.5.9.*whole scheduler batches"):
        check_metric("verify_ms", target=old)
    assert check_metric("tpot_ms_p50", target=old).name == "tpot_ms_p50"
    assert check_metric("verify_ms", target={**EAGLE, "sglang_version": "0.5.23"}).name == "verify_ms"
    assert check_metric("verify_ms", target={**EAGLE, "sglang_version": ""}).name == "verify_ms"
