"""The generic `command` target: any git repo with a bench command, real processes, real git.

The acceptance case: `sleuth bisect target=command` on a generated pure-Python repository whose
benchmark times a real Python function localizes the commit that made it slower.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import git

from orchestrator.bench.client import BenchError
from orchestrator.cli import run as cli_run
from orchestrator.commands import bisect
from orchestrator.config.compose import compose_settings
from orchestrator.config.settings import as_dict
from orchestrator.records import Outcome
from orchestrator.store import RunStore
from orchestrator.targets.base import NodeContext
from orchestrator.targets.command import CommandTarget, parse_bench_output, run_command
from orchestrator.util.process import group_members

FAST = ["bench.repetitions=2", "bench.warmup_requests=0", "trial.retries=0"]

FAST_WORK = "def work(n):\n    return sum(range(n))\n"
# The planted slowdown: the same result, computed in a Python loop (~10x slower).
SLOW_WORK = ("def work(n):\n    total = 0\n    for i in range(n):\n        total += i\n"
             "    return total\n")
BENCH = textwrap.dedent("""\
    import json, time
    from mylib import work

    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        work(300_000)
        times.append(time.perf_counter() - t0)
    print("timing work(300000), best of 5")
    print(json.dumps({"value": min(times), "calls": len(times)}))
""")
BUILD = textwrap.dedent("""\
    import os, pathlib, subprocess
    sha = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    with open(os.environ["BUILD_RECORD"], "a") as f:
        f.write(sha.strip() + "\\n")
    if pathlib.Path("BROKEN").exists():
        raise SystemExit("cannot build: BROKEN marker present")
    pathlib.Path("built.txt").write_text(sha)
""")


def make_python_repo(path: Path, n_commits: int, culprit: int, broken: int | None = None) -> list[str]:
    """A pure-Python project: commit `culprit` makes `work` slower, commit `broken` (if any)
    cannot be built; every other commit touches unrelated files."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "bench.py").write_text(BENCH)
    (path / "build.py").write_text(BUILD)
    shas = []
    for i in range(n_commits):
        (path / "mylib.py").write_text(SLOW_WORK if i >= culprit else FAST_WORK)
        (path / "NOTES.md").write_text(f"revision {i}\n")
        marker = path / "BROKEN"
        if i == broken:
            marker.write_text("x\n")
        elif marker.exists():
            marker.unlink()
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"change {i}")
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def _target(tmp_path: Path, **conf: object) -> CommandTarget:
    cfg = compose_settings("trial", ["target=command", "target.bench=true"])
    return CommandTarget({**as_dict(cfg.target), **conf},
                         as_dict(cfg.bench),
                         NodeContext("n0", tmp_path / "node"))


def _only_run(tmp_path: Path) -> Path:
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    return run_dir


# -- bench output -------------------------------------------------------------------------------
def test_last_line_json_object_or_bare_number():
    assert parse_bench_output("warming up\n{\"value\": 1.5, \"p99\": 3, \"name\": \"x\"}\n") == {
        "value": 1.5, "p99": 3.0}
    assert parse_bench_output("compiling...\n0.25\n\n") == {"value": 0.25}
    for bad, why in (("", "printed nothing"), ("done\n", "neither"), ("true\n", "boolean"),
                     ('["a"]\n', "not an object"), ('{"ok": "yes"}\n', "no finite numeric")):
        with pytest.raises(BenchError) as info:
            parse_bench_output(bad)
        assert why in str(info.value)


# -- process isolation --------------------------------------------------------------------------
def test_timeout_kills_the_whole_group(tmp_path):
    started: list[int] = []
    run = run_command(["sh", "-c", "sleep 30 & sleep 30"], cwd=tmp_path, env=dict(os.environ),
                      timeout_s=0.5, log_path=tmp_path / "log",
                      on_start=lambda pid: started.append(pid) if pid else None)
    # timed out (not exited after its 30 s) with no exit code: the group was killed at the limit
    assert run.timed_out and run.exit_code is None
    assert group_members(started[0]) == []  # the background sleep died too


def test_stragglers_are_killed_after_a_normal_exit(tmp_path):
    started: list[int] = []
    run = run_command(["sh", "-c", "sleep 30 >/dev/null 2>&1 & echo 7"], cwd=tmp_path,
                      env=dict(os.environ), timeout_s=20, log_path=tmp_path / "log",
                      on_start=lambda pid: started.append(pid) if pid else None)
    assert (run.exit_code, run.stdout.strip()) == (0, "7")
    assert group_members(started[0]) == []
    assert "echo 7" in (tmp_path / "log").read_text()


# -- build cache ----------------------------------------------------------------------------------
def test_build_runs_once_per_worktree_and_again_when_it_changes(tmp_path):
    wt = tmp_path / "cache" / ("a" * 40)
    wt.mkdir(parents=True)
    record = tmp_path / "record"
    build = f"{sys.executable} -c \"open('{record}', 'a').write('built\\n')\""
    target = _target(tmp_path, build=build)
    trial_dir = tmp_path / "trial"
    target.prepare(wt, trial_dir)
    target.prepare(wt, trial_dir)
    assert record.read_text() == "built\n"
    assert (trial_dir / "build.log").read_text().startswith("$ ")
    assert target.build(wt, build + " --again", tmp_path / "b.log") is True  # new command
    (wt / ".sleuth-build.json").unlink()  # a rebuilt worktree has no marker
    assert target.build(wt, build, tmp_path / "b.log") is True
    assert record.read_text().count("built") == 3


def test_failing_build_names_its_output(tmp_path):
    wt = tmp_path / "cache" / ("b" * 40)
    wt.mkdir(parents=True)
    target = _target(tmp_path, build='sh -c "echo missing header >&2; exit 3"')
    with pytest.raises(RuntimeError) as info:
        target.prepare(wt, tmp_path / "trial")
    assert "exit code 3" in str(info.value) and "missing header" in str(info.value)
    assert not (wt / ".sleuth-build.json").exists()


def test_preflight_and_launcher_for_a_bench_only_target(tmp_path):
    assert _target(tmp_path, bench="python bench.py").preflight() is None
    assert "cannot be split" in _target(tmp_path, bench="python 'bench.py").preflight()
    assert "target.bench is empty" in _target(tmp_path, bench="  ").preflight()
    # Without a server the bench is the workload: the launcher prefix wraps it.
    target = _target(tmp_path, bench="sh -c 'echo $WRAPPED'", launcher=["env", "WRAPPED=5"])
    target.prepare(tmp_path, tmp_path / "trial")
    assert target.run_bench("", tmp_path / "log") == {"value": 5.0}


# -- trials ---------------------------------------------------------------------------------------
def test_benchmark_only_trial_has_no_server_steps(tmp_path, ray_session):
    repo = tmp_path / "repo"
    make_python_repo(repo, 2, culprit=5)
    code = cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
                    "target.bench=python bench.py", "env.MY_SETTING=on", *FAST])
    assert code == 0
    (row,) = RunStore.open(_only_run(tmp_path) / "trials.db").trials()
    assert row.outcome is Outcome.OK, row.detail
    states = [s for s, _ in row.result.states]
    assert "launching" not in states and "waiting_ready" not in states
    assert states[-3:] == ["benchmarking", "tearing_down", "done"]
    assert [m.metrics["calls"] for m in row.result.measurements] == [5.0, 5.0]
    assert 0 < row.result.value("value") < 5
    assert row.result.fingerprint["env"]["requested"] == {"MY_SETTING": "on"}
    assert "timing work" in Path(row.log_path).read_text()


SERVER = textwrap.dedent("""\
    import json, os, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            body = json.dumps({"path": self.path, "mode": os.environ.get("MODE", "")}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", int(sys.argv[sys.argv.index("--port") + 1])), H).serve_forever()
""")
CLIENT = textwrap.dedent("""\
    import json, os, sys, time, urllib.request
    url = sys.argv[1]
    assert url == os.environ["SLEUTH_BASE_URL"]
    t0 = time.perf_counter()
    doc = json.loads(urllib.request.urlopen(url + "/work").read())
    print(json.dumps({"value": time.perf_counter() - t0, "mode_ok": int(doc["mode"] == "fast")}))
""")


def test_trial_with_a_server_and_ready_url(tmp_path, ray_session):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "server.py").write_text(SERVER)
    (repo / "client.py").write_text(CLIENT)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "server")
    code = cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
                    "target.server='python server.py --port {port}'",
                    "target.ready_url='http://{host}:{port}/health'",
                    "target.bench='python client.py {base_url}'", "env.MODE=fast", *FAST])
    assert code == 0
    (row,) = RunStore.open(_only_run(tmp_path) / "trials.db").trials()
    assert row.outcome is Outcome.OK, row.detail
    assert [s for s, _ in row.result.states][2:4] == ["launching", "waiting_ready"]
    assert all(m.metrics["mode_ok"] == 1.0 for m in row.result.measurements)
    assert row.result.fingerprint["teardown"]["clean"] is True


def test_shell_mode_and_failures_are_classified(tmp_path, ray_session):
    repo = tmp_path / "repo"
    shas = make_python_repo(repo, 2, culprit=5, broken=1)
    assert cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'r1'}",
                    "target.shell=true", "target.bench='python bench.py | tail -n 1'",
                    *FAST]) == 0
    assert cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'r2'}",
                    "target.bench='sh -c \"echo boom >&2; exit 3\"'", *FAST]) == 1
    (run2,) = [p for p in (tmp_path / "r2").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(run2 / "trials.db").trials()
    assert row.outcome is Outcome.BENCH_FAILED
    assert "exit" in row.detail and "code 3" in row.detail and "boom" in row.detail
    assert cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'r3'}",
                    "target.bench='sleep 30'", "target.bench_timeout_s=0.5", *FAST]) == 1
    (run3,) = [p for p in (tmp_path / "r3").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(run3 / "trials.db").trials()
    assert row.outcome is Outcome.HUNG
    # A commit whose build fails is untestable (skipped by experiments), never measured.
    assert cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'r4'}",
                    f"commit={shas[1]}", "target.bench=python bench.py",
                    "target.build=python build.py", f"target.env.BUILD_RECORD={tmp_path / 'b'}",
                    *FAST]) == 1
    (run4,) = [p for p in (tmp_path / "r4").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(run4 / "trials.db").trials()
    assert row.outcome is Outcome.PREPARE_FAILED and "BROKEN marker" in row.detail
    assert row.result.measurements == ()


def test_a_bench_script_outside_the_repo_imports_the_commit_measured(tmp_path, ray_session):
    """The bench lives outside the repository and imports the project by name, with no
    sys.path edits of its own; an installed copy is on PYTHONPATH too. The worktree's package
    comes first (target.pythonpath), so each trial measures its own commit's code."""
    repo = tmp_path / "repo"
    (repo / "mypkg").mkdir(parents=True)
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for value in (1, 2):
        (repo / "mypkg" / "__init__.py").write_text(f"VALUE = {value}\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"value {value}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    installed = tmp_path / "site-packages" / "mypkg"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("VALUE = 99\n")
    bench = tmp_path / "elsewhere" / "bench.py"
    bench.parent.mkdir()
    bench.write_text("import json, mypkg\nprint(json.dumps({'value': mypkg.VALUE}))\n")
    for i, sha in enumerate(shas):
        runs = tmp_path / f"runs{i}"
        assert cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={runs}",
                        f"commit={sha}", f"target.bench=python {bench}",
                        f"target.env.PYTHONPATH={installed.parent}", *FAST]) == 0
        (run_dir,) = [p for p in runs.iterdir() if not p.name.startswith(".")]
        (row,) = RunStore.open(run_dir / "trials.db").trials()
        assert row.result.value("value") == i + 1, row.detail


def test_a_first_parent_refusal_names_the_merge_to_use(tmp_path):
    from orchestrator.errors import UserError
    from orchestrator.workspace import Workspace

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    for name in ("a", "b"):
        (repo / name).write_text(name)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", name)
    git(repo, "checkout", "-q", "-b", "side", "HEAD~1")
    (repo / "side").write_text("s")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "side work")
    side = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge side", "side")
    merge = git(repo, "rev-parse", "HEAD")
    (repo / "c").write_text("c")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "after")
    with pytest.raises(UserError) as info:
        Workspace(repo, tmp_path / "cache").commits_between(side, "HEAD")
    message = str(info.value)
    assert f"good={merge[:12]}" in message and "Merge side" in message
    assert "first_parent=false" in message


@pytest.mark.e2e
def test_bisect_localizes_a_planted_python_slowdown(tmp_path, ray_session):
    repo = tmp_path / "repo"
    shas = make_python_repo(repo, 24, culprit=15, broken=6)
    record = tmp_path / "builds"
    cfg = compose_settings("bisect", [
        "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}", f"good={shas[0]}",
        f"bad={shas[-1]}", "target.bench=python bench.py", "target.build=python build.py",
        f"target.env.BUILD_RECORD={record}", "nodes=2", "bench.repetitions=3",
        "bench.warmup_requests=0", "trial.retries=0"])
    code = bisect.run(cfg)
    run_dir = _only_run(tmp_path)
    doc = json.loads((run_dir / "findings.json").read_text())
    # The bench is a real Python loop timed on this machine: on a busy host its restarts
    # scatter by 15-20% (a run beside other tests measured sd 14% a restart), and what is left
    # beside the culprit may then stay undecided against the 1% the bisect looks for: exit 3,
    # saying so. The culprit is named either way; only an undecided remainder may end in 3.
    assert code == 0 or (code == 3 and doc["answer"]["unexplained"]["decision"] == "undecided"), (
        code, doc["answer"]["sentence"])
    top = doc["findings"][0]
    assert top["id"] == shas[15] and top["probability"] >= 0.99
    # The loop is several times slower, but it is timed on a shared machine and the endpoints
    # may hold only two restarts each (a run here measured +100% [+43, +181]): the estimate is
    # large and the interval clear of zero, its width is not the point.
    assert doc["total_effect"]["pct"] > 50 and doc["total_effect"]["ci"][0] > 10
    assert doc["metric"] == "value"  # the command target's own metric, without metric=
    # The answer leads with the change and the commit; a large change reads as a ratio with
    # its levels, and the report leaves out the columns only an SGLang server fills.
    answer = doc["answer"]
    assert answer["causes"][0]["sha"] == shas[15] and answer["sentence"].startswith("value ")
    if answer["total"]["pct"] >= 100:
        assert answer["sentence"].startswith("value x") and " -> " in answer["sentence"]
    from orchestrator.ui.report import load_run
    from orchestrator.ui.report import tables as T

    headers = T.findings_table(load_run(run_dir).ranked).headers
    assert not {"phase", "accept len", "cuda graph share"} & set(headers)
    rows = RunStore.open(run_dir / "trials.db").trials()
    for row in rows:
        if row.candidate.commit == shas[6]:
            assert row.outcome is Outcome.PREPARE_FAILED and "BROKEN" in row.detail
    # One build per worktree, however often its commit was measured.
    built = record.read_text().split()
    assert len(built) == len(set(built))
    measured = [r.candidate.commit for r in rows if r.outcome is Outcome.OK]
    repeated = {c for c in measured if measured.count(c) > 1}
    assert repeated and repeated <= set(built)
