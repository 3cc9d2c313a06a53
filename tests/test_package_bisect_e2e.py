"""`sleuth bisect package=NAME` end to end: a release line built here as real wheels (offline),
listed from its directory, each release installed once into an overlay by pip, a tiny
benchmark that imports the package timed as `target=command`, a real local Ray and two nodes.

One line has a planted slow release (every later release keeps it); the other is a staircase: a
step, then a partial fix. A pre-release is left out unless asked for, and one release exists only
as a wheel for another interpreter: listed, never installable, so a skipped point if the search
needs it. Import times are sleeps (20/40/60 ms): steps of x3 and -33% that the machine's load
cannot blur, and no assertion depends on how fast this machine is.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from conftest import git
from pkgwheels import release_line

from orchestrator.commands import bisect as bisect_cmd
from orchestrator.config.compose import compose_settings
from orchestrator.errors import UserError

BENCH = textwrap.dedent("""\
    import json, time
    t0 = time.perf_counter()
    import slowpkg
    print(json.dumps({"value": (time.perf_counter() - t0) * 1000}))
""")
VERSIONS = [f"1.{i}" for i in range(10)]


def _repo(path: Path) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    (path / "bench.py").write_text(BENCH)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "bench")
    return path


def _args(tmp_path: Path, wheels: Path, run_id: str, *extra: str) -> list[str]:
    return ["package=slowpkg", "good=1.0", "bad=1.9", f"packages.find_links={wheels}",
            "target=command", f"repo={_repo(tmp_path / f'proj-{run_id}')}",
            f"target.bench={sys.executable} bench.py", "metric=value", "direction=increase",
            "bench.repetitions=2", "bench.warmup_requests=0", "trial.retries=0", "nodes=2",
            f"runs_dir={tmp_path / 'runs'}", f"run_id={run_id}", *extra]


def _findings(tmp_path: Path, run_id: str) -> dict:
    return json.loads((tmp_path / "runs" / run_id / "findings.json").read_text())


def test_bisect_names_the_planted_slow_release(tmp_path, ray_session, capsys):
    delays = {v: (60.0 if i >= 6 else 20.0) for i, v in enumerate(VERSIONS)}
    delays["1.6rc1"] = 60.0  # a pre-release of the slow one: not searched without package.pre
    wheels = release_line(tmp_path / "wheels", "slowpkg", delays, broken=("1.2",))
    code = bisect_cmd.run(compose_settings("bisect", _args(tmp_path, wheels, "planted")))
    doc = _findings(tmp_path, "planted")
    assert code == 0, doc["message"]
    top = doc["findings"][0]
    assert (top["kind"], top["id"], top["release"], top["parent"]) == (
        "package", "slowpkg 1.6", "1.6", "1.5")
    assert top["probability"] >= 0.99 and top["step"] == "regression"
    assert top["effect"]["value"]["ci"][0] > 100  # 20 ms -> 60 ms: x3
    assert doc["answer"]["causes"][0]["label"] == "slowpkg 1.5 -> 1.6"
    assert "from good slowpkg 1.0 to bad slowpkg 1.9" in doc["answer"]["sentence"]
    package = doc["package"]
    assert [r["version"] for r in package["releases"]] == VERSIONS
    assert package["excluded"] == [{"version": "1.6rc1", "why": "pre-release (package.pre=true"
                                    " includes pre-releases)"}]
    status = {s["version"]: s for s in package["versions"]}
    assert status["1.0"]["measured"] >= 2 and status["1.9"]["measured"] >= 2
    assert status["1.5"]["measured"] >= 2 and status["1.6"]["measured"] >= 2
    if "skipped" in status["1.2"]:  # only if the search needed it: never a measurement
        assert status["1.2"]["measured"] == 0
        assert "Could not find a version" in status["1.2"]["skipped"]
    assert any(n.startswith("releases measured (restarts): 1.0 (") for n in doc["notes"])
    out = capsys.readouterr().out
    assert "bisecting 10 releases of slowpkg 1.0..1.9 from" in out
    assert "slowpkg 1.5 -> 1.6: regression value x" in out
    assert "1.6 is the first bad release" in doc["message"]
    # The report lists every release: measured (with restarts), skipped, not needed, left out.
    from orchestrator.ui.report import write_report

    _, files = write_report(tmp_path / "runs" / "planted")
    md = Path(files.markdown).read_text()
    assert "## Releases" in md
    assert f"| 1.6 | - | {status['1.6']['measured']} | measured; regression here |" in md
    assert "| 1.6rc1 | - | 0 | left out: pre-release" in md


def test_bisect_answers_a_staircase_with_the_step_and_the_partial_fix(tmp_path, ray_session):
    delays = {v: (20.0 if i < 4 else 60.0 if i < 7 else 40.0) for i, v in enumerate(VERSIONS)}
    wheels = release_line(tmp_path / "wheels", "slowpkg", delays)
    code = bisect_cmd.run(compose_settings("bisect", _args(tmp_path, wheels, "stairs")))
    doc = _findings(tmp_path, "stairs")
    assert code == 0, doc["message"]
    steps = {f["release"]: f for f in doc["findings"]}
    assert set(steps) == {"1.4", "1.7"}, doc["message"]
    assert steps["1.4"]["step"] == "regression" and steps["1.4"]["parent"] == "1.3"
    assert steps["1.7"]["step"] == "partial fix" and steps["1.7"]["parent"] == "1.6"
    assert steps["1.7"]["effect"]["value"]["ci"][1] < 0
    assert all(f["probability"] >= 0.99 for f in steps.values())
    labels = {c["label"] for c in doc["answer"]["causes"]}
    assert labels == {"slowpkg 1.3 -> 1.4", "slowpkg 1.6 -> 1.7"}


def test_an_endpoint_pip_cannot_install_is_bad_input(tmp_path):
    wheels = release_line(tmp_path / "wheels", "slowpkg", {"1.0": 0.0, "1.9": 0.0},
                          broken=("1.9",))
    with pytest.raises(UserError, match=r"cannot install slowpkg==1\.9 for the trials"):
        bisect_cmd.run(compose_settings("bisect", _args(tmp_path, wheels, "bad")))
    assert not (tmp_path / "runs" / "bad").exists()


@pytest.mark.e2e
@pytest.mark.parametrize("reference", ["run", "undecided"])
def test_sim_investigate_names_the_nccl_release(tmp_path, ray_session, reference):
    """The `nccl_upgrade` story with a wheel directory holding the NCCL line 2.27.5 .. 2.28.3:
    the sim prices 2.28.0 - 2.28.6 with a small-message regression. `investigate` proves the
    package change harmful (isolate), then searches the releases in between and its answer
    names 2.28.0 against 2.27.7, not only the package.

    `undecided`: the reference is a fingerprint file of two restarts 40% apart, so the compare
    cannot decide; the system's differences are tested all the same (against the reference's
    configuration recreated now), and the answer says the compare was undecided."""
    import os

    from conftest import record_story
    from test_packages_e2e import SIM_FAST, noisy_reference

    from orchestrator.commands import trial as trial_cmd
    from orchestrator.packages.wheels import write_wheel
    from orchestrator.sim_scenarios.generate import generate_scenario
    from orchestrator.sim_scenarios.side_files import wheel_files
    from orchestrator.targets.simnode import set_node_state

    # The suite runs scenario seed 4; docs/system-level.md ran it per seed (SLEUTH_STORY_SEED)
    sc = generate_scenario(tmp_path / "sc", 20, int(os.environ.get("SLEUTH_STORY_SEED", "4")),
                           "nccl_upgrade")
    wheels = sc.out / sc.truth["system"]["wheels"]
    line = ["2.27.5", "2.27.6", "2.27.7", "2.28.0", "2.28.1", "2.28.2", "2.28.3"]
    for version in line[1:]:
        write_wheel(wheels, "nvidia-nccl-cu12", version, wheel_files("nvidia-nccl-cu12", version))
    runs = tmp_path / "runs"

    def nodes(when: str) -> None:
        for name in ("local-0", "local-1"):
            set_node_state(runs / ".nodes" / name, gpu_state_file=sc.out / f"{when}_gpu_state.json",
                           env_file=sc.out / f"{when}_env.json",
                           packages_file=sc.out / f"{when}_packages.json",
                           launcher_file=sc.out / f"{when}_launcher.json")

    base = [f"repo={sc.repo}", f"runs_dir={runs}", *SIM_FAST, "nodes=2"]
    nodes("reference")
    assert trial_cmd.run(compose_settings("trial", [*base, f"commit={sc.truth['bad']}",
                                                  "run_id=reference", "restarts=3"])) == 0
    given = noisy_reference(tmp_path, base) if reference == "undecided" else "reference"
    nodes("now")
    # as a user types it: the installed `sleuth`, in a process of its own
    done = subprocess.run([str(Path(sys.executable).parent / "sleuth"), "investigate", *base,
                           f"reference={given}", "run_id=inv", f"packages.find_links={wheels}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert "Traceback" not in done.stderr and done.returncode in (0, 3, 4), done.stderr[-3000:]
    code = done.returncode
    release = json.loads((runs / "inv" / "findings-release.json").read_text())
    answer = json.loads((runs / "inv" / "findings-investigate.json").read_text())["answer"]
    record_story(f"release_line[{reference}]", code, answer, runs / "inv",
                 release["verdict"] == "found" and (release["findings"][0]["release"],
                                                    release["findings"][0]["parent"])
                 == ("2.28.0", "2.27.7"))
    assert release["verdict"] == "found", release["message"]
    top = release["findings"][0]
    assert (top["release"], top["parent"], top["step"]) == ("2.28.0", "2.27.7", "regression")
    assert [r["version"] for r in release["package"]["releases"]] == line
    isolate = json.loads((runs / "inv" / "findings-isolate.json").read_text())
    cause = next(f for f in isolate["findings"] if f["kind"] == "package")
    assert cause["release"] == "2.28.0"
    assert "regression in 2.28.0 against 2.27.7" in answer["sentence"], answer["sentence"]
    if reference == "run":  # the package's release is the change: answered
        assert code in (0, 3), answer["headline"]
    if reference == "undecided":
        compare = json.loads((runs / "inv" / "findings-compare.json").read_text())
        assert compare["verdict"] == "unresolved"
        assert "whether the reference still reproduces is undecided" in answer["sentence"]


def test_bisect_over_an_index_names_the_release_with_its_date(tmp_path, ray_session):
    """A PEP 691 index on loopback serving wheels built here, with upload times and one
    yanked release: pip installs every overlay from it, the answer dates the release, and
    the yanked one is left out with its reason."""
    import hashlib
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    versions = ["2.0", "2.1", "2.2", "2.3", "2.4", "2.5"]
    delays = {v: (60.0 if v >= "2.3" else 20.0) for v in versions}
    wheels = release_line(tmp_path / "wheels", "slowpkg", delays)
    files = []
    for i, v in enumerate(versions):
        (whl,) = wheels.glob(f"slowpkg-{v}-*.whl")
        files.append({"filename": whl.name, "url": f"/files/{whl.name}",
                      "hashes": {"sha256": hashlib.sha256(whl.read_bytes()).hexdigest()},
                      "upload-time": f"2024-0{i + 1}-15T12:00:00Z",
                      "yanked": "install error" if v == "2.4" else False})

    class Index(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path.rstrip("/") == "/simple/slowpkg":
                body = json.dumps({"meta": {"api-version": "1.1"}, "name": "slowpkg",
                                   "files": files}).encode()
                kind = "application/vnd.pypi.simple.v1+json"
            elif self.path.startswith("/files/") and (wheels / self.path[7:]).is_file():
                body, kind = (wheels / self.path[7:]).read_bytes(), "application/octet-stream"
            else:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/simple"
        args = [a for a in _args(tmp_path, wheels, "index", "good=2.0", "bad=2.5",
                                 f"packages.index_url={url}")
                if not a.startswith(("packages.find_links", "good=1", "bad=1"))]
        code = bisect_cmd.run(compose_settings("bisect", args))
    finally:
        server.shutdown()
        server.server_close()
    doc = _findings(tmp_path, "index")
    assert code == 0, doc["message"]
    top = doc["findings"][0]
    assert (top["release"], top["parent"], top["date"]) == ("2.3", "2.2", "2024-04-15")
    assert doc["answer"]["causes"][0]["label"] == "slowpkg 2.2 -> 2.3 (released 2024-04-15)"
    assert doc["package"]["excluded"] == [{"version": "2.4", "why": "yanked: install error"}]
    assert [r["version"] for r in doc["package"]["releases"]] == ["2.0", "2.1", "2.2", "2.3",
                                                                  "2.5"]


def test_a_release_search_stopped_at_its_budget_continues_with_a_larger_one(tmp_path,
                                                                          ray_session):
    delays = {v: (60.0 if i >= 6 else 20.0) for i, v in enumerate(VERSIONS)}
    wheels = release_line(tmp_path / "wheels", "slowpkg", delays)
    code = bisect_cmd.run(compose_settings("bisect", _args(tmp_path, wheels, "budget",
                                                         "max_trials=6")))
    assert code == 3 and _findings(tmp_path, "budget")["verdict"] == "budget_exhausted"
    code = bisect_cmd.run(compose_settings("bisect", [f"runs_dir={tmp_path / 'runs'}",
                                                    "run_id=budget", "max_trials=200"]))
    doc = _findings(tmp_path, "budget")
    assert code == 0, doc["message"]
    assert doc["findings"][0]["release"] == "1.6" and doc["package"]["name"] == "slowpkg"


def test_a_release_pip_cannot_install_is_skipped_and_the_answer_says_which_two(tmp_path,
                                                                              ray_session):
    """1.5, the release before the slow one, exists only as a wheel for another interpreter:
    its trial fails to prepare, it is never counted as slow or fast, and the answer is the
    honest one: 1.5 or 1.6, measured against 1.4."""
    delays = {v: (60.0 if i >= 6 else 20.0) for i, v in enumerate(VERSIONS)}
    wheels = release_line(tmp_path / "wheels", "slowpkg", delays, broken=("1.5",))
    code = bisect_cmd.run(compose_settings("bisect", _args(tmp_path, wheels, "skip")))
    doc = _findings(tmp_path, "skip")
    assert code == 0, doc["message"]
    top = doc["findings"][0]
    assert (top["release"], top["parent"], top["range"]) == ("1.6", "1.4", ["1.5", "1.6"])
    assert "(one of 2 releases: neighbours that could not be installed or run)" in top["summary"]
    status = {s["version"]: s for s in doc["package"]["versions"]}
    assert status["1.5"]["measured"] == 0
    assert status["1.5"]["skipped"].startswith("prepare_failed:")
    assert "slowpkg==1.5" in status["1.5"]["skipped"]
    assert any(n.startswith("releases skipped: 1.5 (prepare_failed") for n in doc["notes"])


@pytest.mark.e2e
def test_a_planted_pip_configuration_does_not_reach_the_overlays(tmp_path):
    """pip's own configuration names another source holding another slowpkg 1.5 (one pip
    prefers: a more specific wheel tag, importing in no time), from every place pip reads one:
    a PIP_CONFIG_FILE, a global file (XDG_CONFIG_DIRS), the user's (HOME) and the PIP_*
    variables. With `packages.find_links=DIR` the overlays come from DIR alone: the answer is
    the one step at 1.6, and the findings name DIR's wheel of every release with its sha256."""
    import hashlib
    import os
    import subprocess

    delays = {v: (60.0 if i >= 6 else 20.0) for i, v in enumerate(VERSIONS)}
    wheels = release_line(tmp_path / "wheels", "slowpkg", delays)
    evil = release_line(tmp_path / "evil", "slowpkg", {"1.5": 0.0})
    planted = next(evil.glob("*.whl"))
    planted.rename(planted.with_name(planted.name.replace("py3-none-any", "cp311-none-any")))
    conf = f"[global]\nfind-links = {evil}\n"
    (tmp_path / "env.conf").write_text(conf)
    (tmp_path / "xdg" / "pip").mkdir(parents=True)
    (tmp_path / "xdg" / "pip" / "pip.conf").write_text(conf)
    (tmp_path / "home" / ".config" / "pip").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "pip" / "pip.conf").write_text(conf)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
           "PIP_CONFIG_FILE": str(tmp_path / "env.conf"), "XDG_CONFIG_DIRS": str(tmp_path / "xdg"),
           "HOME": str(tmp_path / "home"), "PIP_FIND_LINKS": str(evil)}
    env.pop("XDG_CONFIG_HOME", None)
    done = subprocess.run([sys.executable, "-m", "orchestrator", "bisect",
                           *_args(tmp_path, wheels, "planted-conf")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    doc = _findings(tmp_path, "planted-conf")
    assert [(f["release"], f["parent"]) for f in doc["findings"]] == [("1.6", "1.5")], \
        doc["message"]
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in wheels.glob("*.whl")}
    measured = [s for s in doc["package"]["versions"] if s["measured"]]
    assert {s["version"] for s in measured} >= {"1.0", "1.5", "1.6", "1.9"}
    for s in measured:
        (source,) = s["installed"]  # one file per release, the same for every trial
        name = f"slowpkg-{s['version']}-py3-none-any.whl"
        assert source["file"] == (wheels / name).as_uri(), source
        assert source["sha256"] == digests[name] and source["trials"]
