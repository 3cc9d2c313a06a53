"""One ranking across experiments: order, merging, suspect/failed flags, reading a run's files."""

from __future__ import annotations

import json

from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.run import findings
from orchestrator.store import TrialRow
from orchestrator.ui.report import ranking

CONTRACT_KEYS = {"rank", "kind", "id", "summary", "probability", "effect"}


def _finding(kind: str, fid: str, probability, pct: float, ci: tuple[float, float], **extra):
    return {"rank": 0, "kind": kind, "id": fid, "summary": f"{kind} {fid}",
            "probability": probability, "effect": {"verify_ms": {"pct": pct, "ci": list(ci)}},
            **extra}


def _doc(experiment: str, verdict: str, *found) -> dict:
    return {"run": "r", "experiment": experiment, "metric": "verify_ms", "verdict": verdict,
            "message": f"{experiment} said so", "findings": list(found)}


def _row(tid: int, outcome: Outcome, suspect: bool = False) -> TrialRow:
    result = TrialResult(outcome, measurements=(Measurement(0, {"verify_ms": 19.0}),)
                         if outcome is Outcome.OK else (), suspect=suspect)
    return TrialRow(id=tid, candidate_id=1, candidate=Candidate.make("a" * 40), node="local-0",
                    phase="search", attempt=1, state="done", outcome=outcome, detail="",
                    started_at=1.0, ended_at=2.0, log_path="", suspect=suspect, result=result)


def test_causes_ranked_by_probability_then_interval_then_size():
    docs = [
        _doc("bisect", "found",
             _finding("commit", "c1", 0.62, 40.0, (30.0, 50.0)),
             _finding("commit", "c2", 0.999, 12.0, (8.0, 16.0))),
        _doc("isolate", "found",
             _finding("env", "NCCL_PROTO", 0.62, 80.0, (-5.0, 160.0)),  # interval spans zero
             _finding("clock", "power:450", 0.62, 55.0, (40.0, 70.0))),
        _doc("sweep", "found", _finding("env", "NCCL_ALGO=Ring", None, -30.0, (-35.0, -25.0))),
    ]
    doc = ranking.rank(docs, run_id="r")
    order = [(f["rank"], f["id"]) for f in doc["findings"]]
    assert order == [(1, "c2"), (2, "power:450"), (3, "c1"), (4, "NCCL_PROTO"),
                     (5, "NCCL_ALGO=Ring")]
    assert all(CONTRACT_KEYS <= f.keys() for f in doc["findings"])
    assert doc["experiment"] == "bisect+isolate+sweep" and doc["verdict"] == "found"
    assert doc["findings"][0]["experiment"] == "bisect"
    assert [s["experiment"] for s in doc["sources"]] == ["bisect", "isolate", "sweep"]
    assert doc["findings"][2]["moved"] == {"verify_ms": 40.0}
    assert doc["findings"][3]["moved"] == {}  # an interval through zero moved nothing


def test_the_causes_table_follows_the_answers_order():
    """An investigation's answer lists its causes in its own order (system first, then code);
    the ranked causes table lists them in that order too, not by probability and size."""
    docs = [_doc("bisect", "found", _finding("commit", "c1", 1.0, 54.0, (50.0, 58.0))),
            _doc("isolate", "found", _finding("clock", "power_limit_w", 1.0, 29.0, (27.0, 31.0)),
                 _finding("env", "NCCL_PROTO", 0.9999, 4.0, (3.0, 5.0))),
            _doc("sweep", "found", _finding("env", "NCCL_ALGO=Tree", None, -3.0, (-5.0, -1.0))),
            {**_doc("investigate", "found"),
             "answer": {"causes": [{"kind": "clock", "id": "power_limit_w"},
                                   {"kind": "env", "id": "NCCL_PROTO"},
                                   {"kind": "commit", "id": "c1"}]}}]
    order = [f["id"] for f in ranking.rank(docs)["findings"]]
    assert order == ["power_limit_w", "NCCL_PROTO", "c1", "NCCL_ALGO=Tree"]
    # Without an answer the ranking rule stands: the larger of two equally probable causes.
    assert [f["id"] for f in ranking.rank(docs[:3])["findings"]][:2] == ["c1", "power_limit_w"]


def test_the_same_cause_from_two_experiments_is_one_finding():
    docs = [_doc("compare", "not_reproduced",
                 _finding("clock", "power_limit_w", None, 0.0, (0.0, 0.0), evidence=[1, 2])),
            _doc("isolate", "found",
                 _finding("clock", "power_limit_w", 0.97, 50.0, (40.0, 61.0), evidence=[2, 5]))]
    (only,) = ranking.rank(docs)["findings"]
    assert only["probability"] == 0.97 and only["experiment"] == "isolate"
    assert only["experiments"] == ["compare", "isolate"]
    assert only["evidence"] == [1, 2, 5]


def test_evidence_flags_suspect_and_failed_trials():
    rows = [_row(1, Outcome.OK), _row(2, Outcome.OK, suspect=True), _row(3, Outcome.LAUNCH_FAILED),
            _row(4, Outcome.OK)]
    doc = ranking.rank([_doc("bisect", "found", _finding("commit", "c", 0.99, 50.0, (40.0, 60.0),
                                                         evidence=[1, 2, 3, 4]))], rows)
    f = doc["findings"][0]
    assert (f["suspect_trials"], f["failed_trials"], f["measured_trials"]) == ([2], [3], 2)


def test_combined_verdict():
    assert ranking.combined_verdict([_doc("bisect", "not_reproducible"),
                                     _doc("isolate", "found")]) == "found"
    assert ranking.combined_verdict([_doc("bisect", "budget_exhausted"),
                                     _doc("sweep", "inconclusive")]) == "budget_exhausted"
    assert ranking.rank([])["verdict"] == "empty"


def test_load_docs_reads_every_experiment_once(tmp_path):
    bisect_doc = _doc("bisect", "found", _finding("commit", "c", 0.99, 50.0, (40.0, 60.0)))
    isolate_doc = _doc("isolate", "found", _finding("env", "X", 0.9, 20.0, (10.0, 30.0)))
    (tmp_path / "findings.json").write_text(json.dumps(bisect_doc))
    (tmp_path / "findings-isolate.json").write_text(json.dumps(isolate_doc))
    (tmp_path / "findings-broken.json").write_text("{not json")
    docs = ranking.load_docs(tmp_path)
    assert [d["experiment"] for d in docs] == ["bisect", "isolate"]
    # A combined file written back expands to its sources; the per-experiment files beside it
    # are the same documents and are not counted twice.
    (tmp_path / "findings.json").write_text(json.dumps(ranking.rank(docs)))
    assert [d["experiment"] for d in ranking.load_docs(tmp_path)] == ["bisect", "isolate"]
    assert ranking.load_docs(tmp_path / "missing") == []


def _measured(tid: int, sha: str, verify_ms: float, phase: str) -> TrialRow:
    result = TrialResult(Outcome.OK, measurements=(Measurement(0, {"verify_ms": verify_ms}),))
    return TrialRow(id=tid, candidate_id=1, candidate=Candidate.make(sha * 40), node="local-0",
                    phase=phase, attempt=1, state="done", outcome=Outcome.OK, detail="",
                    started_at=1.0, ended_at=2.0, log_path="", suspect=False, result=result)


def test_reference_trials_of_an_earlier_node_state_do_not_blur_an_effect():
    """The demo measures the good commit as a reference on the node as it was (19 ms), then
    bisects on the node as it is now (25 ms): one candidate key, two system states."""
    now = [_measured(i, "a", 25.0 * (1 + 0.01 * d), "reproduce")
           for i, d in enumerate((-1, 0, 1, 0))]
    bad = [_measured(10 + i, "b", 38.0 * (1 + 0.01 * d), "reproduce")
           for i, d in enumerate((1, -1, 0, 1))]
    reference = [_measured(20 + i, "a", 19.0 * (1 + 0.01 * d), "reference")
                 for i, d in enumerate((0, 1, -1))]
    before, after = now[0].candidate.key, bad[0].candidate.key
    clean = findings.effects_between([*now, *bad], before, after, ["verify_ms"])
    mixed = findings.effects_between([*now, *bad, *reference], before, after, ["verify_ms"])
    assert mixed == clean
    assert clean["verify_ms"]["n"] == [4, 4]
    lo, hi = clean["verify_ms"]["ci"]
    assert 48.0 < lo < 52.0 < hi < 56.0  # 38/25 = +52%, 1% noise
