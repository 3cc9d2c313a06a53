"""An interrupted compare stores and says what it measured so far: its interval against the
reference, marked provisional, so `sleuth report` on the stopped run opens with it (it used
to store nothing), and a resumed investigation measures the compare again rather than taking
that answer for a finished one. A controller stand-in, no Ray and no server."""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from orchestrator.commands import compare
from orchestrator.config.compose import compose_settings
from orchestrator.config.requests import CompareRequest
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.store import TrialRow

REF = Candidate.make("a" * 40)
FINGERPRINT = {"gpu": {"driver_version": "590.48.01", "gpus": [{"index": 0, "name": "H200",
                                                                 "power_limit_w": 450}]},
               "packages": {}, "host": {"kernel": "6.8.0"}}


class _Stopped:
    """Measures the reference 15% slower than then, and is interrupted (Ctrl-C) while it
    waits for its fourth restart."""

    def __init__(self):
        self.nodes, self.rows, self.running, self.run_id = ["local-0"], [], [], "cmp"
        self.store = self

    def trials(self) -> list[TrialRow]:
        return list(self.rows)

    def idle_nodes(self) -> list[str]:
        return [] if self.running else list(self.nodes)

    def in_flight(self) -> int:
        return len(self.running)

    def submit(self, cand: Candidate, phase: str) -> None:
        self.running.append((cand, phase))

    def wait(self) -> list[TrialRow]:
        if len(self.rows) == 3:
            raise KeyboardInterrupt
        cand, phase = self.running.pop(0)
        n = len(self.rows) + 1
        value = 23.0 * (1.0 + 0.01 * (n % 3 - 1))
        result = TrialResult(Outcome.OK, measurements=(Measurement(0, {"verify_ms": value}),),
                             node="local-0", fingerprint=FINGERPRINT)
        self.rows.append(TrialRow(id=n, candidate_id=1, candidate=cand, node="local-0",
                                  phase=phase, attempt=1, state="done", outcome=Outcome.OK,
                                  detail="", started_at=None, ended_at=None, log_path="",
                                  suspect=False, result=result))
        return self.rows[-1:]


def test_an_interrupted_compare_stores_its_answer_so_far(tmp_path):
    cfg = compose_settings("compare", ["target=sim", "metric=verify_ms", "max_trials=9",
                                     "experiment.params.batch=2"])
    req = CompareRequest.step(cfg, cfg.max_trials)
    ref = {"candidate": REF, "name": "reference", "values": {"verify_ms": [20.0, 20.2, 19.8]},
           "fingerprint": {**FINGERPRINT, "gpu": {**FINGERPRINT["gpu"], "gpus": [
               {"index": 0, "name": "H200", "power_limit_w": 600}]}}, "telemetry": []}
    buf = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        compare.execute(cfg, req, _Stopped(), tmp_path, ref, Console(file=buf, width=300),
                        findings_name="compare")
    doc = json.loads((tmp_path / "findings-compare.json").read_text())
    answer = doc["answer"]
    assert doc["provisional"]["why"] == "interrupted after 3 restarts"
    assert answer["status"] == "provisional" and not answer["explains"]
    assert answer["sentence"].startswith("so far (interrupted after 3 restarts): verify_ms +"
                                         ), answer["sentence"]
    assert "against the reference" in answer["sentence"]
    assert answer["total"]["pct"] > 10 and doc["n_trials"] == 3
    assert compare.finished(tmp_path) is None  # measured again when the run is resumed
    # Its own run says it before the resume line.
    buf = io.StringIO()
    with pytest.raises(KeyboardInterrupt):
        compare.execute(cfg, req, _Stopped(), tmp_path, ref, Console(file=buf, width=300))
    assert "answer: so far (interrupted after 3 restarts)" in buf.getvalue()
    assert json.loads((tmp_path / "findings.json").read_text())["answer"]["status"] == (
        "provisional")
