"""The answer's arithmetic and wording: log-scale sums, remainders, the "explained" decision on
noisy restarts, large ratios, and the sentence each run kind leads with."""

from __future__ import annotations

import math
import random

import pytest

from orchestrator.answer import combine
from orchestrator.answer.combine import LogChange, explains, remainder, share, total
from orchestrator.answer.compose import (
    for_bisect,
    for_compare,
    for_investigation,
    for_sweep,
    not_tested,
    pick,
)
from orchestrator.answer.phases import log_change, mechanism
from orchestrator.answer.text import change_text, pct_text
from orchestrator.ui.report.answer import detail_lines


def test_effects_compound_on_the_log_scale():
    power, commit = LogChange(math.log(1.30), 0.01, 10), LogChange(math.log(1.18), 0.01, 10)
    both = total([power, commit])
    assert both.pct == pytest.approx(53.4, abs=0.01)  # 1.30 x 1.18, not 30 + 18
    assert both.se == pytest.approx(math.sqrt(2) * 0.01)
    assert both.df == pytest.approx(20)  # Welch-Satterthwaite of two equal terms
    whole = LogChange(math.log(1.534), 0.012, 8)
    rest = remainder(whole, [power, commit])
    assert abs(rest.pct) < 0.1 and rest.excludes_zero() is False
    assert share(power, whole) + share(commit, whole) == pytest.approx(1.0, abs=0.01)
    assert explains(whole, [power, commit])
    assert not explains(whole, [power])  # +18% left: confidently more than the tolerance


def test_an_effect_record_without_a_log_triple_is_read_from_its_interval():
    c = LogChange.from_effect({"pct": 53.0, "ci": [47.0, 59.0]})
    lo, hi = c.interval()
    assert c.pct == pytest.approx(53.0) and lo == pytest.approx(47.0, abs=0.3)
    assert hi == pytest.approx(59.0, abs=0.3)
    assert LogChange.from_effect({"pct": 5.0, "ci": [-math.inf, math.inf]}).se == math.inf
    assert LogChange.from_effect(None) is None


def _trials(level: float, n: int, cv: float, rng: random.Random, df: int = 3) -> list[float]:
    """Restart-level values with heavy-tailed (Student-t) multiplicative noise."""
    out = []
    for _ in range(n):
        z = rng.gauss(0, 1) / math.sqrt(sum(rng.gauss(0, 1) ** 2 for _ in range(df)) / df)
        out.append(level * math.exp(cv * z * math.sqrt((df - 2) / df)))
    return out


@pytest.mark.parametrize("cv, n", [(0.02, 4), (0.05, 4), (0.05, 12)])
def test_explained_is_rarely_wrong_on_heavy_tailed_restarts(cv, n):
    """Seeded cases in the shape of an investigation (a total between then and now, a system
    cause and a code cause, each from its own restarts, Student-t noise): when a fifth of the
    change is left, it never claims the causes explain it; when the causes are the whole
    change, it says so once the restarts pin the remainder down (with 4 restarts in 5% noise
    the remainder's interval is too wide to rule out a quarter of the change: not claimed)."""
    rng = random.Random(5)
    base, power, commit = 19.0, 1.30, 1.18
    claimed_with_gap, explained_without_gap = 0, 0
    cases = 200
    for i in range(cases):
        left = 1.20 if i % 2 else 1.0  # half the cases have a +20% cause nobody named
        then = _trials(base, max(3, n - 1), cv, rng)
        now = _trials(base * power * commit * left, n, cv, rng)
        restored = _trials(base, n, cv, rng)
        capped = _trials(base * power, n, cv, rng)
        parent = _trials(base * power, n, cv, rng)
        culprit = _trials(base * power * commit, n, cv, rng)
        whole = log_change(then, now)
        causes = [log_change(restored, capped), log_change(parent, culprit)]
        verdict = explains(whole, causes)
        if left > 1 and verdict:
            claimed_with_gap += 1
        if left == 1 and verdict:
            explained_without_gap += 1
    assert claimed_with_gap == 0
    # Seeded rates (heavy tails make some restarts' intervals wide: then "not explained").
    least = {(0.02, 4): 0.8, (0.05, 4): 0.0, (0.05, 12): 0.65}[(cv, n)]
    assert explained_without_gap >= least * cases / 2, explained_without_gap


def test_noise_alone_cannot_explain_a_change():
    """A cause measured so noisily that its interval spans everything does not make the answer
    "explained" even when its estimate lands near the total: the remainder's interval says
    how little is known."""
    whole = LogChange(math.log(1.53), 0.02, 10)
    lucky = LogChange(math.log(1.50), 0.30, 2)
    assert not explains(whole, [lucky])


def test_large_changes_read_as_ratios_with_their_levels():
    e = {"pct": 32329.6, "ci": [30000.0, 35000.0], "before": 0.67, "after": 218.0}
    assert change_text(e, "verify_ms") == "x324 [x301, x351] (0.67 ms -> 218 ms)"
    assert pct_text(53.04) == "+53.0%" and pct_text(-60.0) == "x0.4"
    assert change_text({"pct": 5.0, "ci": [1.0, 9.0]}) == "+5.0% [+1.0, +9.0]"
    assert "%" not in change_text({"pct": 400.0, "ci": [300.0, 500.0], "before": 1.0,
                                   "after": 5.0}, "value")


def _bisect_doc(verdict="found") -> dict:
    culprit = {"rank": 1, "kind": "commit", "id": "b2d8735e1f0a" + "0" * 28, "probability": 0.999,
               "subject": "Refactor verify input preparation", "phase": "verify",
               "effect": {"verify_ms": {"pct": 30.0, "ci": [26.0, 34.0]}},
               "effect_detail": {"verify_ms": {"pct": 30.0, "ci": [26.0, 34.0],
                                               "log": [math.log(1.3), 0.015, 6]}}}
    return {"experiment": "bisect", "metric": "verify_ms", "verdict": verdict,
            "findings": [culprit] if verdict == "found" else [],
            "total_detail": {"pct": 31.0, "ci": [28.0, 34.0], "log": [math.log(1.31), 0.012, 10]}
            if verdict == "found" else {"pct": 0.3, "ci": [-1.0, 1.6],
                                        "log": [math.log(1.003), 0.0066, 10]}}


def _compare_doc() -> dict:
    findings = [
        {"id": "driver_version", "probability": None, "untested": "not settable per trial",
         "difference": {"label": "driver: 590.48.01 -> 595.45.04"}},
        *[{"id": f"SSH_{i}", "probability": None, "untested": "set aside: shell/session variable",
           "difference": {"key": f"SSH_{i}", "label": f"SSH_{i}: a -> b"}} for i in range(12)],
    ]
    return {"experiment": "compare", "metric": "verify_ms", "verdict": "not_reproduced",
            "total_effect": {"verify_ms": {"pct": 29.0, "ci": [25.0, 33.0],
                                           "log": [math.log(1.29), 0.014, 6]}},
            "findings": findings}


def _isolate_doc() -> dict:
    return {"experiment": "isolate", "metric": "verify_ms", "verdict": "found", "findings": [
        {"rank": 1, "kind": "clock", "id": "power_limit_w", "probability": 0.998,
         "differences": [{"label": "power limit: 600 W -> 450 W"}],
         "effect": {"verify_ms": {"pct": 28.0, "ci": [25.0, 31.0]}},
         "effect_detail": {"verify_ms": {"pct": 28.0, "ci": [25.0, 31.0],
                                         "log": [math.log(1.28), 0.012, 8]}}}]}


def test_the_investigation_sentence_names_each_cause_and_the_rest():
    whole = LogChange(math.log(1.28 * 1.30), 0.016, 9)
    a = for_investigation("verify_ms", whole, whole_extra={}, reference="the reference (then)",
                          bad="commit 9f8e now", compare_doc=_compare_doc(),
                          isolate_doc=_isolate_doc(), bisect_doc=_bisect_doc(), sweep_doc=None,
                          mechanism={"text": "verify +66%"})
    s = a["sentence"]
    assert s.startswith("verify_ms +66.4% [")
    assert "power limit 600 W -> 450 W +28.0%" in s
    assert 'commit b2d8735e1f0a "Refactor verify input preparation" +30.0%' in s
    assert "unexplained" in s and a["explains"] and a["status"] == "explained"
    assert [c["experiment"] for c in a["causes"]] == ["isolate", "bisect"]
    assert a["parts"]["system"]["pct"] == 29.0 and a["parts"]["code"]["pct"] == 31.0
    groups = {g["reason"]: g for g in a["not_tested"]}
    assert groups["set aside: shell/session variable"]["count"] == 12
    assert groups["set aside: shell/session variable"]["line"].startswith(
        "12 shell/session variables that changed: SSH_0, SSH_1,")
    assert "..." in groups["set aside: shell/session variable"]["line"]  # 8 shown, not 12


def test_same_code_says_code_is_not_the_cause():
    whole = LogChange(math.log(1.28), 0.013, 8)
    a = for_investigation("verify_ms", whole, whole_extra={}, reference="the reference",
                          bad="the same commit now", compare_doc=_compare_doc(),
                          isolate_doc=_isolate_doc(), bisect_doc=None, sweep_doc=None,
                          mechanism=None)
    assert "code not the cause" in a["sentence"] and a["explains"]


def test_a_range_that_measures_alike_sends_the_user_elsewhere():
    doc = _bisect_doc("not_reproducible")
    a = for_bisect(doc, good="commit aaaa", bad="commit bbbb", next_step="sleuth investigate ...")
    assert "not the cause" in a["sentence"] and not a["explains"] and a["next"]
    inv = for_investigation("verify_ms", LogChange(math.log(1.003), 0.0066, 10), whole_extra={},
                            reference="commit aaaa now", bad="commit bbbb now", compare_doc=None,
                            isolate_doc=None, bisect_doc=doc, sweep_doc=None, mechanism=None)
    assert inv["status"] == "not_in_code" and not inv["explains"]


def test_compare_alone_lists_suspects_untested_and_sweep_settings_are_not_causes():
    a = for_compare(_compare_doc())
    assert a["causes"] == [] and not a["explains"] and "system level" in a["sentence"]
    assert sum(g["count"] for g in a["not_tested"]) == 13
    sweep = {"experiment": "sweep", "metric": "verify_ms", "verdict": "found",
             "n_configurations": 12, "findings": [
                 {"id": "NCCL_PROTO=LL128", "config": {"NCCL_PROTO": "LL128"},
                  "effect": {"verify_ms": {"pct": -3.6, "ci": [-5.5, -1.7]}}}]}
    s = for_sweep(sweep)
    assert s["causes"] == [] and s["settings"][0]["id"] == "NCCL_PROTO=LL128"
    assert "best of 12 configurations" in s["sentence"]
    # A run holding compare + isolate answers with the system's causes.
    picked = pick([_compare_doc(), _isolate_doc()])
    assert [c["id"] for c in picked["causes"]] == ["power_limit_w"]


def test_not_tested_groups_by_reason():
    groups = not_tested(_compare_doc())
    assert [g["reason"] for g in groups] == ["not settable per trial",
                                             "set aside: shell/session variable"]
    assert groups[0]["line"] == ("1 difference that cannot be set per trial:"
                                 " driver 590.48.01 -> 595.45.04")


def test_mechanism_names_the_phase_and_the_gpu_state():
    rng = random.Random(1)
    before = {"verify_ms": _trials(19.0, 4, 0.01, rng), "draft_ms": _trials(6.4, 4, 0.01, rng),
              "cuda_graph_share": [1.0] * 4}
    after = {"verify_ms": _trials(29.0, 4, 0.01, rng), "draft_ms": _trials(6.4, 4, 0.01, rng),
             "cuda_graph_share": [1.0] * 4}
    tel = [{"n_samples": 5, "sm_clock_mhz": {"mean": 2430}, "power_w": {"mean": 580}}]
    now = [{"n_samples": 5, "sm_clock_mhz": {"mean": 1785}, "power_w": {"mean": 450}}]
    m = mechanism(before, after, tel, now, before_label="reference", after_label="now")
    assert m["phase"] == "verify" and m["phases"]["verify_ms"]["ci"][0] > 40
    assert "SM clock under load 2430 MHz -> 1785 MHz, power 580 W -> 450 W" in m["text"]
    assert "CUDA-graph share 100% -> 100%" in m["text"]


def test_tolerance_follows_the_size_of_the_change():
    assert combine.tolerance(LogChange(math.log(1.05), 0.01, 5)) == pytest.approx(math.log(1.04))
    assert combine.tolerance(LogChange(math.log(2.0), 0.01, 5)) == pytest.approx(
        0.25 * math.log(2.0))
    # A confidently non-zero remainder passes only while it is small (an inexact composition).
    whole = LogChange(math.log(2.05), 0.004, 10)
    assert explains(whole, [LogChange(math.log(2.09), 0.005, 10)])
    assert not explains(whole, [LogChange(math.log(1.80), 0.005, 10)])


def test_a_bisect_verdict_names_commits_not_positions():
    from orchestrator.answer.text import name_points

    shas = [f"{i:02d}" + "ab" * 19 for i in range(40)]
    message = ("Found 1 culprit: point 35 is the first bad commit with probability 0.99;"
               " against its parents (point 33 and point 34) it changes the metric by +52%;"
               " the first bad commit is one of points 12..14 (untestable commits hide which);"
               " -0.1% [-3.1%, +3.1%] between points 0 and 33")
    named = name_points(message, shas)
    assert "point" not in named.replace("endpoints", ""), named
    assert f"commit {shas[35][:12]} is the first bad commit" in named
    assert f"(commit {shas[33][:12]} and commit {shas[34][:12]})" in named
    assert f"commits {shas[12][:12]}..{shas[14][:12]}" in named
    assert f"between commits {shas[0][:12]} and {shas[33][:12]}" in named
    assert name_points("point 99 of 40", shas) == "point 99 of 40"  # never a wrong commit


def test_a_not_tested_line_says_not_tested_once():
    doc = {"findings": [{"id": "flashinfer", "untested": "not tested: no package source"
                         " (packages.find_links=DIR of wheels, or packages.index_url=URL)",
                         "difference": {"label": "flashinfer: 0.2.3 -> 0.2.5"}}]}
    (group,) = not_tested(doc)
    line = detail_lines({"not_tested": [group]})[0]
    assert line.count("not tested") == 1, line
    assert line == ("not tested: 1 difference: flashinfer 0.2.3 -> 0.2.5 (no package source"
                    " (packages.find_links=DIR of wheels, or packages.index_url=URL))")
