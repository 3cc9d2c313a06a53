"""Report rendering on synthetic stores: fast, and every number known in advance.

The synthetic run is a real `RunStore` filled the way the bisect command fills it: the real
`BisectStrategy` proposes points, a virtual oracle (19 ms before the culprit, 29 ms from it,
2% restart noise) answers, rows are written with `begin_trial`/`finish_trial`, and the findings
come from `orchestrator.run.findings.bisect_findings`. One trial is suspect, one commit cannot be
built, and the node's power limit changes half-way (drift a fingerprint diff must show).
"""

from __future__ import annotations

import base64
import hashlib
import html.parser
import json
import math
import random
from pathlib import Path

import pytest

from orchestrator.cli import main as cli_main
from orchestrator.commands import bisect
from orchestrator.config import params as experiment_params
from orchestrator.config.bisect import bisect_strategy
from orchestrator.config.compose import compose_settings
from orchestrator.config.requests import BisectRequest
from orchestrator.config.settings import to_yaml
from orchestrator.control.drive import Epochs, observation
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.run import findings
from orchestrator.run.posterior_steps import Recorder
from orchestrator.store import RunStore
from orchestrator.strategies.base import probability_relation, probability_text
from orchestrator.ui.render import finding_id
from orchestrator.ui.report import load_run, write_report
from orchestrator.ui.report import series as S
from orchestrator.ui.report import sweep_series as SW
from orchestrator.ui.report import tables as T
from orchestrator.ui.report.fingerprints import fingerprint_diffs
from orchestrator.ui.report.html import render_html
from orchestrator.ui.report.markdown import md_escape, render_markdown
from orchestrator.ui.report.plots import make_plots, sweep_legend
from orchestrator.workspace import CommitInfo

N, CULPRIT, BROKEN = 16, 9, 4
EVIL = "fix <script>alert(1)</script> | *bold* `code` [x](y) $a$ & more"


def _sha(i: int) -> str:
    return hashlib.sha1(f"commit {i}".encode()).hexdigest()


def _fingerprint(sha: str, power: int) -> dict:
    return {"git": {"sha": sha, "patches": {}}, "packages": {"torch": "2.9.1"},
            "gpu": {"driver_version": "590.48.01",
                    "gpus": [{"index": 0, "name": "RTX PRO 6000", "power_limit_w": power}]},
            "host": {"kernel": "6.1.0", "boot_id": "b1", "hostname": "node"},
            "env": {"server": {"NCCL_PROTO": "LL128"}}}


def _metrics(verify: float, rng: random.Random) -> dict:
    return {"verify_ms": verify, "draft_ms": 6.5 * math.exp(rng.gauss(0, 0.02)),
            "decode_ms": 11.2 * math.exp(rng.gauss(0, 0.02)), "accept_len": 2.4,
            "output_throughput": 3000.0 / (verify + 12), "cuda_graph_share": 1.0}


def build_bisect_run(root: Path, run_id: str = "syn", record: bool = True) -> dict:
    """A finished synthetic bisect run directory (see the module docstring); it keeps its
    posterior history as the live bisect does (`run/posterior_steps.Recorder`), unless
    `record` is false (a run older than the record)."""
    cfg = compose_settings("bisect", ["target=sim", f"runs_dir={root}", "metric=verify_ms", "nodes=2",
                                    "trial.retries=0", f"run_id={run_id}"])
    run_dir = root / run_id
    run_dir.mkdir(parents=True)
    store = RunStore.create(run_dir / "trials.db", run_id=run_id, command="bisect",
                            config_yaml=to_yaml(cfg))
    commits = [CommitInfo(_sha(i), (_sha(i - 1),) if i else (), EVIL if i == CULPRIT else
                          f"commit {i}", "Dev <dev@example.com>", "2026-01-01", ("python/x.py",))
               for i in range(N)]
    points = [Candidate.make(c.sha) for c in commits]
    bisect._save_plan(run_dir, commits, points, None)
    strategy = bisect_strategy(BisectRequest.stored(cfg), experiment_params.of(cfg), N, None)
    rng = random.Random(7)
    epochs = Epochs()  # the power limit's change is a new system epoch, as the live loop says
    obs, clock, suspect_id = [], 1000.0, None
    recorder = Recorder(run_dir) if record else None
    while not (verdict := strategy.verdict(obs)).done:
        if recorder is not None:
            recorder.record(verdict, obs)
        proposals = strategy.propose(obs, [], 2)
        assert proposals
        for k, p in enumerate(proposals):
            node = f"local-{k}"
            tid = store.begin_trial(store.candidate_id(points[p.point]), node=node, phase=p.phase)
            fp = _fingerprint(commits[p.point].sha, 600 if tid < 8 else 450)
            if p.point == BROKEN:
                result = TrialResult(Outcome.LAUNCH_FAILED, "exit 1", started_at=clock,
                                     ended_at=clock + 1, node=node, fingerprint=fp)
            else:
                level = 29.0 if p.point >= CULPRIT else 19.0
                suspect = suspect_id is None and tid >= 3
                reps = tuple(Measurement(r, _metrics(level * math.exp(rng.gauss(0, 0.02)) *
                                                     (1.6 if suspect else 1.0), rng))
                             for r in range(2))
                result = TrialResult(Outcome.OK, measurements=reps, started_at=clock,
                                     ended_at=clock + 5 + k, node=node, fingerprint=fp,
                                     suspect=suspect, suspect_reason="GPU throttled" if suspect else "")
                suspect_id = tid if suspect else suspect_id
            store.finish_trial(tid, result)
            row = store.trial(tid)
            o = observation(row, p.point, "verify_ms", 1, epochs.feed(row)[0])
            obs.append(o)
        clock += 7
    if recorder is not None:
        recorder.record(verdict, obs)
    rows = store.trials()
    doc = findings.bisect_findings(run_id=run_id, metric="verify_ms", verdict=verdict,
                                   commits=commits, keys=[p.key for p in points], rows=rows)
    findings.write(run_dir, doc)
    store.set_status("done")
    store.close()
    return {"run_dir": run_dir, "commits": commits, "points": points, "verdict": verdict,
            "n_obs": len(obs), "suspect_id": suspect_id, "store_path": run_dir / "trials.db"}


def add_sweep(run: dict) -> None:
    """Sweep trials on the bad commit over NCCL_PROTO (which matters) and a neutral setting."""
    store = RunStore.open(run["store_path"])
    bad = run["commits"][-1].sha
    rng = random.Random(3)
    clock = 5000.0
    for i in range(12):
        proto = ("LL", "LL128", "Simple")[i % 3]
        cand = Candidate.make(bad, env={"NCCL_PROTO": proto, "NCCL_MIN_NCHANNELS": str(4 + i % 2)})
        tid = store.begin_trial(store.candidate_id(cand), node=f"local-{i % 2}", phase="sweep")
        level = {"LL": 27.0, "LL128": 29.0, "Simple": 33.0}[proto]
        reps = tuple(Measurement(r, _metrics(level * math.exp(rng.gauss(0, 0.01)), rng))
                     for r in range(2))
        store.finish_trial(tid, TrialResult(Outcome.OK, measurements=reps, started_at=clock,
                                            ended_at=clock + 4, node=f"local-{i % 2}"))
        clock += 4
    store.close()
    doc = {"run": "syn", "experiment": "sweep", "metric": "verify_ms", "verdict": "found",
           "message": "NCCL_PROTO=LL is best",
           "confirmed": [{"label": "NCCL_PROTO=LL NCCL_MIN_NCHANNELS=4", "confirm": [27.1, 26.9],
                          "key": Candidate.make(bad, env={"NCCL_PROTO": "LL",
                                                          "NCCL_MIN_NCHANNELS": "4"}).key}],
           "baseline": {"key": Candidate.make(bad).key, "confirm": [29.5, 30.5]},
           "findings": [
               {"rank": 1, "kind": "env", "id": "NCCL_PROTO=LL", "summary": "best setting",
                "probability": None, "effect": {"verify_ms": {"pct": -6.9, "ci": [-8.0, -5.8]}},
                "evidence": []}]}
    (run["run_dir"] / "findings-sweep.json").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict:
    return build_bisect_run(tmp_path_factory.mktemp("report_syn"))


@pytest.fixture(scope="module")
def data(run):
    return load_run(run["run_dir"])


@pytest.fixture(scope="module")
def plots(data):
    return make_plots(data)


def test_synthetic_bisect_found_the_culprit(run, data):
    """Guards the fixture: everything below relies on a found culprit at CULPRIT."""
    assert run["verdict"].status == "found"
    top = data.ranked["findings"][0]
    assert top["id"] == _sha(CULPRIT) and top["rank"] == 1
    assert top["moved"].keys() == {"verify_ms"} and top["moved"]["verify_ms"] > 30


def test_every_trial_is_in_the_distributions(run, data):
    measured = [r for r in data.rows if r.outcome.measured]
    series = S.distributions(data, "verify_ms")
    assert sorted(p.trial_id for s in series for p in s.points) == sorted(r.id for r in measured)
    assert sum(len(s.failed) for s in series) == sum(1 for r in data.rows if not r.outcome.measured)
    (suspect,) = [p for s in series for p in s.points if p.suspect]
    assert suspect.trial_id == run["suspect_id"]
    assert all(len(p.repetitions) == 2 for s in series for p in s.points)
    # Bisect points come in commit order, labelled with their position.
    positions = [int(s.label.split()[0][1:]) for s in series]
    assert positions == sorted(positions) and positions[0] == 0 and positions[-1] == N - 1


def test_the_posterior_is_read_from_the_run_s_own_record(run, data):
    """The report draws the posterior the live bisect recorded as it went (one step per
    verdict that took in trials), never a replay of the strategy."""
    from orchestrator.run import posterior_steps

    history = S.posterior_history(data)
    lines = (data.run_dir / posterior_steps.STEPS).read_text().splitlines()
    assert len(history.steps) == len(lines) >= run["n_obs"] // 2
    assert history.steps[0].status == "reproducing" and history.steps[-1].status == "found"
    assert history.culprits == (CULPRIT,)
    assert history.steps[-1].best_point == CULPRIT
    assert history.steps[-1].best_probability >= 0.99
    assert history.steps[-1].posterior[CULPRIT] >= 0.99
    # Point masses never exceed one (the rest is the "no change in this range" hypothesis).
    assert all(0 <= sum(s.posterior) <= 1 + 1e-9 for s in history.steps)


def test_a_run_without_the_record_has_no_posterior_plot(tmp_path):
    """A run older than the record (or whose record could not be written) shows no posterior
    rather than one rebuilt by a renderer; a line cut short by a kill is left out."""
    from orchestrator.run import posterior_steps

    bare = build_bisect_run(tmp_path, "bare", record=False)
    assert S.posterior_history(load_run(bare["run_dir"])) is None
    cut = build_bisect_run(tmp_path, "cut")
    path = cut["run_dir"] / posterior_steps.STEPS
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines) + '\n{"trials": [99], "posterior"')
    assert len(S.posterior_history(load_run(cut["run_dir"])).steps) == len(lines)


def test_phase_pairs_and_timeline(run, data):
    pairs = S.phase_pairs(data)
    top = pairs[0]
    # In words: the culprit's parent and the culprit, each as SHA + subject.
    assert top.before_label == f"parent {_sha(CULPRIT - 1)[:7]} commit {CULPRIT - 1}"
    assert top.after_label.startswith(f"commit {_sha(CULPRIT)[:7]} fix <script>")
    verify = {m: (a, b) for m, a, b in top.metrics}["verify_ms"]
    assert 18 < verify[0].mean < 20 and 28 < verify[1].mean < 30
    assert verify[0].lo < verify[0].mean < verify[0].hi
    assert pairs[-1].title.startswith("bisect endpoints")
    spans = S.timeline(data.rows)
    assert len(spans) == len(data.rows) and {s.node for s in spans} == {"local-0", "local-1"}
    assert min(s.start for s in spans) == 0


def test_fingerprint_diff_shows_the_power_limit_drift(data):
    views = fingerprint_diffs(data)
    titles = [v.title for v in views]
    drift = next(v for v in views if v.title.startswith("during the run"))
    assert [d.key for d in drift.differences] == ["power_limit_w"], titles
    assert (drift.differences[0].reference, drift.differences[0].now) == (600, 450)
    endpoints = views[0]
    assert endpoints.title == f"{_sha(0)[:10]} vs {_sha(N - 1)[:10]}"
    assert "git" in {d.key for d in endpoints.differences}


def test_html_is_self_contained_and_escaped(data, plots):
    assert [p.name for p in plots] == ["distributions", "posterior", "phases", "timeline"]
    page = render_html(data, plots)

    class Collect(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.urls, self.text = [], [], []

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.urls += [v for k, v in attrs if k in ("src", "href")]

        def handle_data(self, d):
            self.text.append(d)

    parsed = Collect()
    parsed.feed(page)
    assert "script" not in parsed.tags
    assert EVIL in "".join(parsed.text)  # shown as text, character for character
    assert "<script>alert" not in page
    images = [u for u in parsed.urls if u.startswith("data:image/png;base64,")]
    assert len(images) == len(plots)
    assert all(base64.b64decode(u.split(",", 1)[1]).startswith(b"\x89PNG") for u in images)
    assert set(parsed.urls) - set(images) == {"data:,"}  # nothing else is loaded
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


def test_markdown_escapes_every_cell(data, plots):
    assert md_escape("a|b") == "a\\|b" and md_escape("<s>") == "&lt;s>"
    assert md_escape("line\nbreak") == "line break"
    md = render_markdown(data, plots)
    assert "<script>" not in md
    findings_rows = [ln for ln in md.splitlines() if ln.startswith("| 1 | commit |")]
    (row,) = findings_rows
    # An escaped pipe does not split a cell: the row has exactly the table's 12 cells.
    assert len([c for c in row.replace("\\|", "").split("|")[1:-1]]) == 12
    assert "![Per-candidate metric distributions](plots/distributions.png)" in md
    assert "suspect: GPU throttled" in md  # the trials table says why a trial was set aside


# Text that would format, link, split a table or become HTML if it were not escaped, and text
# that a terminal reader should see as typed (no escape it does not need).
MARKDOWN_TRAPS = (EVIL, "a _b_ c __d__", "[x][y] ![i](u) <http://e>", "&lt; &amp; &#60;",
                  "# h", "> q", "- li", "+ li", "12. x", "3) y", "~~s~~", "x\\y", "a\\|b",
                  "<!-- c -->", "NCCL_PROTO verify_ms")


@pytest.mark.parametrize("text", MARKDOWN_TRAPS)
def test_markdown_escape_renders_as_typed_in_a_paragraph_and_a_cell(text):
    """A CommonMark renderer with GFM tables shows escaped text character for character."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("commonmark").enable(["table", "strikethrough"])
    typed = html.escape(text, quote=False).replace('"', "&quot;")
    assert md.render(md_escape(text)) == f"<p>{typed}</p>\n"
    cell = md.render(f"| h | g |\n|---|---|\n| {md_escape(text, line_start=False)} | z |\n")
    assert f"<td>{typed}</td>\n<td>z</td>" in cell


def test_markdown_escape_leaves_what_formats_nothing():
    """report.md is read in terminals too: arrows, intervals, PR numbers and snake_case names
    need no backslash or entity."""
    plain = "power limit 600 W -> 450 W +28.6% [+27.2, +30.0] (#12693) NCCL_PROTO verify_ms -1.4%"
    assert md_escape(plain) == plain
    assert md_escape(">0.999", line_start=False) == ">0.999"  # a cell starts no quote


def test_a_simulated_runs_gpu_time_is_called_modeled(data):
    """No GPU spent the simulator's hours: the run table does not bill them as real ones."""
    gpu_time = dict(T.run_table(data).rows)["GPU time"]
    assert "modeled GPU-" in gpu_time and gpu_time.endswith(f"over {len(data.rows)} restarts")


def test_untested_differences_are_listed_once_with_the_answer():
    """Every medium opens with the answer and its "not tested" lines; the causes section does
    not list them a second time (it does when there is no answer to carry them)."""
    untested = {"kind": "package", "id": "rich", "probability": None,
                "untested": "not tested: no package source",
                "difference": {"label": "rich: 13.9.4 -> 14.2.0"}}
    ranked = {"findings": [untested], "answer": {"not_tested": [{"line": "1 difference: rich"}]}}
    assert T.untested_lines(ranked) == []
    assert T.untested_lines({"findings": [untested]}) == [
        "1 difference: rich 13.9.4 -> 14.2.0 (no package source)"]


def test_report_command_prints_tables_and_paths(run, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", str(run["run_dir"])])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    assert f"report: {run['run_dir'] / 'report.html'}" in out
    assert _sha(CULPRIT)[:12] in out and "Causes (" in out and out.startswith("run syn")
    assert f'#1 commit {_sha(CULPRIT)[:12]} "{EVIL}"' in out  # printed as typed, no markup
    for name in ("report.md", "report.html", "plots/posterior.png"):
        assert (run["run_dir"] / name).stat().st_size > 1000


def test_missing_run_is_bad_input_and_writes_nothing(tmp_path, capsys):
    runs = tmp_path / "runs"
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report", "no-such-run", f"runs_dir={runs}"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("sleuth: error: no run 'no-such-run'") and "\n" not in err
    assert not runs.exists()
    with pytest.raises(SystemExit) as exit_info:
        cli_main(["report"])
    assert exit_info.value.code == 2


def test_second_experiment_is_ranked_in_and_findings_rewritten(tmp_path):
    run = build_bisect_run(tmp_path / "runs", run_id="two")
    add_sweep(run)
    data, files = write_report(run["run_dir"])
    assert files.findings == run["run_dir"] / "findings.json"
    doc = json.loads(files.findings.read_text())
    assert doc["experiment"] == "bisect+sweep"
    assert [(f["rank"], f["kind"]) for f in doc["findings"]] == [(1, "commit"), (2, "env")]
    assert [s["experiment"] for s in doc["sources"]] == ["bisect", "sweep"]
    sweep = SW.sweep_series(data)
    assert len(sweep.history) == 12
    assert sweep.importance[0][0] == "env.NCCL_PROTO" and sweep.importance[0][1] > 0.9
    assert dict(sweep.importance)["env.NCCL_MIN_NCHANNELS"] < 0.2
    # "Best so far" is the best configuration's mean (lower verify is better), not the luckiest
    # single restart; it starts once a configuration has two restarts.
    by_config: dict[int, list[float]] = {}
    for i, (_, value, _, _) in enumerate(sweep.history):
        by_config.setdefault(i % 6, []).append(value)  # add_sweep's 6 configurations, twice
    best_mean = min(sum(v) / len(v) for v in by_config.values())
    assert [b for _, _, b, _ in sweep.history[:6]] == [None] * 6
    assert sweep.history[-1][2] == pytest.approx(best_mean)
    assert sweep.history[-1][2] > min(v for _, v, _, _ in sweep.history)
    # Every dot says what it measured; the winner's and the baseline's means are drawn.
    kinds = [k for *_, k in sweep.history]
    assert kinds.count(SW.WINNER) == 2 and kinds.count(SW.OTHER) == 10
    assert sweep.winner == "NCCL_PROTO=LL NCCL_MIN_NCHANNELS=4"
    assert (sweep.winner_mean, sweep.baseline_mean) == (pytest.approx(27.0), 30.0)
    assert sweep_legend(sweep) == [
        "a restart of another configuration",
        "a restart of the confirmed winner (NCCL_PROTO=LL NCCL_MIN_NCHANNELS=4)",
        "best configuration so far (its mean, >= 2 restarts)",
        "confirmed winner: mean of its confirmation restarts",
        "baseline: mean of its confirmation restarts"]
    assert "plot-sweep" in files.html.read_text()
    # Reading the rewritten file back gives the same ranking, nothing duplicated.
    again = json.loads(json.dumps(load_run(run["run_dir"]).ranked, default=float))
    assert again["findings"] == doc["findings"] and len(again["sources"]) == 2


def test_a_run_without_measurements_still_reports(tmp_path):
    cfg = compose_settings("trial", ["target=sim", f"runs_dir={tmp_path}"])
    run_dir = tmp_path / "empty"
    run_dir.mkdir()
    store = RunStore.create(run_dir / "trials.db", run_id="empty", command="trial",
                            config_yaml=to_yaml(cfg))
    tid = store.begin_trial(store.candidate_id(Candidate.make("a" * 40)), node="local-0")
    store.finish_trial(tid, TrialResult(Outcome.LAUNCH_FAILED, "exit 1", started_at=1.0,
                                        ended_at=2.0, node="local-0"))
    store.close()
    (run_dir / "plots").mkdir()
    (run_dir / "plots" / "posterior.png").write_bytes(b"from an older report")
    (run_dir / "plots" / "mine.png").write_bytes(b"not the report's")
    data, files = write_report(run_dir)
    assert data.ranked["findings"] == [] and data.ranked["verdict"] == "empty"
    assert sorted(p.name for p in (run_dir / "plots").iterdir()) == ["mine.png", "timeline.png"]
    assert "No findings." in files.markdown.read_text()
    assert [p.name for p in files.plots] == ["timeline.png"]


def test_compare_differences_are_listed_and_ranked_after_causes(tmp_path):
    from orchestrator.system.fingerprint_diff import Difference

    run = build_bisect_run(tmp_path / "runs", run_id="cmp")
    driver = Difference("driver", "driver_version", "590.48.01", "595.10", "")
    power = Difference("clock", "power_limit_w", 600, 450, "on 8/8 GPUs", True,
                       ("clock", "power:600", "default"))
    doc = {"run": "cmp", "experiment": "compare", "metric": "verify_ms",
           "verdict": "not_reproduced", "message": "same code, different result",
           "reference": {"name": "ref-run", "trials": [1]},
           "total_effect": {"verify_ms": {"pct": 52.0, "ci": [40.0, 65.0]}},
           "differences": [driver.to_json(), power.to_json()],
           "findings": [{"rank": i, "kind": "system", "id": d.key, "summary": d.label,
                         "probability": None, "effect": {}, "difference": d.to_json()}
                        for i, d in enumerate((driver, power), 1)]}
    (run["run_dir"] / "findings-compare.json").write_text(json.dumps(doc))
    data = load_run(run["run_dir"])
    reported = fingerprint_diffs(data)[0]
    assert reported.title == "compare: ref-run vs now"
    assert [(d.key, d.reference, d.now, d.controllable) for d in reported.differences] == [
        ("driver_version", "590.48.01", "595.10", False), ("power_limit_w", 600, 450, True)]
    assert [f["id"] for f in data.ranked["findings"]] == [_sha(CULPRIT), "driver_version",
                                                         "power_limit_w"]
    experiments = T.experiments_table(data.ranked)
    assert experiments.rows[1][:5] == ("compare", "verify_ms", "not_reproduced", "2",
                                       "+52.0% [+40.0, +65.0]")


def test_the_combined_findings_name_each_system_change(data):
    """The fixture lowers the power limit from trial 8 on, on both nodes: one change each,
    found at the first trial that saw it."""
    changes = data.ranked["system_changes"]
    assert sorted(c["node"] for c in changes) == ["local-0", "local-1"]
    for change in changes:
        assert change["after_trial"] >= 8 > change["before_trial"]
        (diff,) = change["differences"]
        assert (diff["key"], diff["reference"], diff["now"]) == ("power_limit_w", 600, 450)
    views = [v.title for v in fingerprint_diffs(data)]
    for change in changes:
        assert (f"during the run, on {change['node']}: trial {change['before_trial']} vs trial"
                f" {change['after_trial']}") in views


def test_tables_show_a_commit_by_its_hash_and_a_patch_by_its_file_name():
    """A patch's id is its path: cut to 12 characters it showed only the directory."""
    assert finding_id({"kind": "commit", "id": _sha(3)}) == _sha(3)[:12]
    pair = {"kind": "patch", "id": "scenario/patches/11-kimi-shared-gate.patch + "
                                    "scenario/patches/12-chat-template-cache.patch"}
    assert finding_id(pair, width=60) == "11-kimi-shared-gate.patch + 12-chat-template-cache.patch"
    assert finding_id(pair) == "11-kimi-shared-gate.patch + 12-chat-t..."
    assert finding_id({"kind": "env", "id": "NCCL_PROTO"}) == "NCCL_PROTO"


def test_a_near_certain_probability_is_never_rounded_to_one():
    assert probability_text(0.99996) == ">0.999" and probability_text(0.9994) == ">0.999"
    assert probability_text(0.9987) == "0.999" and probability_relation(0.42) == "= 0.420"
    assert probability_relation(0.99996) == "> 0.999"
    assert probability_relation(0.99996, "") == ">0.999"


def test_a_verdict_without_findings_is_one_line_not_an_empty_table():
    """A "not reproducible" bisect printed a findings table with headers and no rows."""
    from rich.table import Table

    from orchestrator.ui.render import findings_table

    empty = findings_table({"experiment": "bisect", "verdict": "not_reproducible",
                            "metric": "verify_ms", "findings": []})
    assert str(empty) == "findings · bisect · not_reproducible: none"
    one = findings_table({"experiment": "bisect", "verdict": "found", "metric": "verify_ms",
                          "findings": [{"rank": 1, "kind": "commit", "id": _sha(3),
                                        "probability": 0.995, "effect": {}}]})
    assert isinstance(one, Table) and one.row_count == 1


def test_the_terminal_report_reads_at_80_columns(data):
    """The answer first, then tables that fit an 80-column terminal without folding a commit
    hash: the findings' summaries and the rest are lines of their own."""
    import io

    from rich.console import Console

    from orchestrator.ui.report.terminal import print_report

    buf = io.StringIO()
    print_report(Console(file=buf, width=80, color_system=None), data)
    lines = buf.getvalue().splitlines()
    assert max(len(line) for line in lines) <= 80
    assert lines[0].startswith("run syn") and lines[1].startswith("answer: verify_ms")
    assert any(_sha(CULPRIT)[:12] in line for line in lines)  # never split across lines
    answer_table = next(i for i, line in enumerate(lines) if "Causes of the change" in line)
    assert answer_table < 12


def test_plot_labels_are_short_and_interrupted_trials_are_not_failed(tmp_path):
    """A candidate reads as SHA + subject (wrapped), settings as they are said; a trial cut
    short is counted apart from the failed ones."""
    from orchestrator.ui.report import labels

    cand = Candidate.make("557fc874c92b" + "0" * 28, env={"NCCL_PROTO": "<unset>",
                                                          "NCCL_ALGO": "Tree"},
                          clock="power:600,locked:off")
    text = labels.short(cand, {cand.commit: "Use a shared workspace buffer for the flashinfer"
                               " prefill wrapper"}, prefix="#3")
    assert text.startswith("#3 557fc87 Use a shared")
    assert all(len(line) <= labels.WIDTH for line in text.splitlines())
    # The commit takes one line, cut; the settings below it are never the part cut off.
    assert text.splitlines()[0].endswith("...")
    assert labels.settings(cand) == ["NCCL_ALGO=Tree", "NCCL_PROTO unset", "power limit 600 W",
                                     "SM clock lock unlocked"]
    assert text.splitlines()[1:] == labels.settings(cand)  # one line each
    # Two candidates of one commit that differ in their third setting read differently.
    env = {"HF_HUB_ENABLE_HF_TRANSFER": "1", "NCCL_PROTO": "LL128"}
    one = Candidate.make(cand.commit, env=env)
    two = Candidate.make(cand.commit, env={**env, "WANDB_RUN_GROUP": "g"})
    assert labels.short(one, {cand.commit: "Release v0.5.8 (#12241)"}) != \
        labels.short(two, {cand.commit: "Release v0.5.8 (#12241)"})
    assert "WANDB_RUN_GROUP=g" in labels.short(two).splitlines()
    assert labels.clock_text("power:600,locked:off") == ["power limit 600 W",
                                                         "SM clock lock unlocked"]
    run = build_bisect_run(tmp_path / "runs", run_id="cut")
    store = RunStore.open(run["store_path"])
    bad = run["points"][-1]
    tid = store.begin_trial(store.candidate_id(bad), node="local-0", phase="search")
    store.finish_trial(tid, TrialResult(Outcome.INTERRUPTED, "stopped by the user"))
    store.close()
    series = {s.key: s for s in S.distributions(load_run(run["run_dir"]), "verify_ms")}
    assert tid in series[bad.key].interrupted and tid not in series[bad.key].failed


def test_a_figure_with_glyphs_the_font_lacks_says_nothing(capfd):
    """A commit subject with an emoji or CJK text is drawn (boxes where the font has no
    glyph) without a warning per glyph in the run's output."""
    import warnings

    from matplotlib.figure import Figure

    from orchestrator.ui.report import plots

    fig = Figure()
    fig.subplots().set_title("verify: 修复 \N{ROCKET} faster")
    with warnings.catch_warnings():
        warnings.simplefilter("always")  # shown if raised, whatever the session's filters
        png = plots._png(fig)
    assert png.startswith(b"\x89PNG")
    out, err = capfd.readouterr()
    assert "Glyph" not in out + err and "findfont" not in out + err, (out, err)


def test_importing_the_commands_and_renderers_does_not_import_matplotlib():
    """matplotlib costs about a second to import (and builds a font cache on a fresh machine);
    only drawing a figure needs it. Counted in a fresh process's modules, not timed: the CLI,
    every command module and every report module (the figure modules too) import without it,
    and drawing one figure does import it, so the check cannot pass by never loading it."""
    import subprocess
    import sys

    script = (
        "import importlib, pkgutil, sys\n"
        "import orchestrator.cli, orchestrator.commands, orchestrator.ui.report\n"
        "for pkg in (orchestrator.commands, orchestrator.ui.report):\n"
        "    for m in pkgutil.iter_modules(pkg.__path__, pkg.__name__ + '.'):\n"
        "        importlib.import_module(m.name)\n"
        "print('matplotlib' in sys.modules)\n"
        "from orchestrator.ui.report.figure import new_figure\n"
        "new_figure(figsize=(1, 1))\n"
        "print('matplotlib' in sys.modules)\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"], done.stdout
