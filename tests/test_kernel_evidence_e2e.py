"""Kernel evidence after an investigation, end to end on simulated nodes (real git repo, real
sim servers, real local Ray, real SQLite): a power cap and a verify-attention commit, each
profiled on its two sides; the evidence names GEMM for the power cap and attention for the
commit, each with an interval that excludes zero, and the report carries the table."""

from __future__ import annotations

import json

import pytest

from orchestrator.commands import investigate
from orchestrator.config.compose import compose_settings
from tests.test_investigate import _reference

pytestmark = pytest.mark.e2e


def test_investigation_ends_with_kernel_evidence_per_cause(tmp_path, ray_session, capsys):
    sc, base = _reference(tmp_path, "power_commit")
    code = investigate.run(compose_settings("investigate", [*base, "reference=reference",
                                                          f"bad={sc.truth['bad']}", "run_id=inv"]))
    printed = capsys.readouterr().out
    run_dir = tmp_path / "runs" / "inv"
    answer = json.loads((run_dir / "findings.json").read_text())["answer"]
    assert code == 0, answer["sentence"]
    assert "kernel evidence: on" in printed.splitlines()[0] + printed  # stated up front
    by_id = {e["id"]: e for e in answer["evidence"]}
    culprit = sc.truth["culprits"][0]["sha"]
    assert set(by_id) == {"power_limit_w", culprit}
    for cause, family in (("power_limit_w", "gemm"), (culprit, "attention")):
        e = by_id[cause]
        assert e["top"] == {"mode": "target_verify", "family": family}, e["line"]
        top = e["families"][0]
        assert top["mover"] and top["ci"][0] > 0, e["line"]
        assert f"evidence, {e['cause']}: kernels: target_verify:" in printed
    # the commit moved attention only: its GEMMs and all-reduce rows are no movers
    commit_rows = {(r["mode"], r["family"]): r for r in by_id[culprit]["families"]}
    assert not commit_rows[("target_verify", "gemm")]["mover"]
    assert not commit_rows[("target_verify", "allreduce")]["mover"]
    report = (run_dir / "report.md").read_text()
    assert "## Kernel evidence" in report and "| target_verify | attention | (all) |" in report
    assert (run_dir / "plots" / "kernels.png").stat().st_size > 0 and "plots/kernels.png" in report
    assert "<h2>Kernel evidence</h2>" in (run_dir / "report.html").read_text()
