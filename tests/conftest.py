"""Shared fixtures: one real local Ray instance per test session, real git repos in temp dirs,
and a guard that fails any test leaving a server process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# pytest-xdist's workers (`make test` runs the suite on several) start with COLUMNS=80 and
# LINES=24, a terminal size nobody chose: the commands under test would wrap their lines at 80
# columns as on a narrow terminal, where a single process writes them whole (160 columns when
# piped, `ui/render.console`). A test that wants a width sets COLUMNS itself.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("COLUMNS", "LINES"):
        os.environ.pop(_name, None)


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@example.com",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@example.com"}
    return subprocess.run(["git", *args], cwd=repo, env=env, check=True, capture_output=True,
                          text=True).stdout.strip()


def record_story(story: str, code: int, answer: dict, run_dir: Path, right: bool) -> None:
    """One line of the system-level stories' table (docs/system-level.md), appended to
    `$SLEUTH_STORY_RECORD` when it is set: the story, the scenario seed, the exit code, the
    causes named and whether they are the planted ones, the answer's status and first line,
    and the restarts the run spent. Called before the story's assertions, so a run whose
    causes are wrong is in the table too."""
    path = os.environ.get("SLEUTH_STORY_RECORD")
    if not path:
        return
    trials = None
    db = run_dir / "trials.db"
    if db.exists():
        import sqlite3

        with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
            trials = conn.execute("SELECT COUNT(*) FROM trials").fetchone()[0]
    row = {"story": story, "seed": int(os.environ.get("SLEUTH_STORY_SEED", "0") or 0),
           "code": code, "right": right, "causes": [c.get("id") for c in answer.get("causes", [])],
           "status": answer.get("status"), "headline": answer.get("headline"),
           "unexplained": (answer.get("unexplained") or {}).get("ci"), "trials": trials,
           "final_check": answer.get("final_check")}
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def kill_after_finished(args: list[str], db: Path, count: int, pause: float = 0.5) -> None:
    """Start a sleuth command in its own process group, wait until ``count`` of its trials
    have finished in ``db``, then SIGKILL the group: the controller and every server it
    started, as a crashed controller host would leave them."""
    from orchestrator.store import RunStore

    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 120
    finished = 0
    while time.monotonic() < deadline and finished < count:
        time.sleep(pause)
        if db.exists():
            store = RunStore.open(db)
            finished = sum(1 for r in store.trials() if r.finished)
            store.close()
        assert proc.poll() is None, f"{args[3]} ended before it could be killed"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@contextmanager
def read_only_view(path: Path, view: Path) -> Iterator[Path]:
    """`path` as a user without write access sees it, at `view`: a read-only bind mount when
    running as root (root ignores permission bits), else a copy without write permission.
    Skips the test where neither can be made."""
    if os.geteuid() == 0:
        view.mkdir(parents=True)
        if subprocess.run(["mount", "--bind", str(path), str(view)],
                          capture_output=True).returncode != 0:
            pytest.skip("running as root without permission to make a read-only bind mount")
        try:
            if subprocess.run(["mount", "-o", "remount,bind,ro", str(view)],
                              capture_output=True).returncode != 0:
                pytest.skip("cannot remount a bind mount read-only here")
            yield view
        finally:
            subprocess.run(["umount", str(view)], check=False)
        return
    subprocess.run(["cp", "-a", str(path), str(view)], check=True)
    subprocess.run(["chmod", "-R", "a-w", str(view)], check=True)
    try:
        yield view
    finally:
        subprocess.run(["chmod", "-R", "u+w", str(view)], check=False)


def make_sim_repo(path: Path, profiles: list[dict]) -> list[str]:
    """A git repo whose commit i carries `sim_profile.json` = profiles[i]; returns SHAs."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, "init", "-q", "-b", "main")
    (path / "python").mkdir(exist_ok=True)
    shas = []
    for i, profile in enumerate(profiles):
        (path / "sim_profile.json").write_text(json.dumps(profile, indent=2) + "\n")
        (path / "python" / "worker.py").write_text(f"# revision {i}\n")
        git(path, "add", "-A")
        git(path, "commit", "-q", "-m", f"commit {i}")
        shas.append(git(path, "rev-parse", "HEAD"))
    return shas


def point_stats(values_by_point):
    """The bisect's per-point counts, sums and sums of squares of lists of signed log values
    (`strategies.bisect.posterior.PointStats`), as the strategy accumulates them."""
    import math

    import numpy as np

    from orchestrator.strategies.bisect.posterior import PointStats

    return PointStats(np.array([len(v) for v in values_by_point], dtype=float),
                      np.array([math.fsum(v) for v in values_by_point], dtype=float),
                      np.array([math.fsum(x * x for x in v) for v in values_by_point],
                               dtype=float))


def seed_counts(many: int, few: int) -> list:
    """The seeds a many-seed statistical test runs, as a parametrization: `few` in every lane,
    `many` only where the `stats` marker is run (`make test`, `make test-stats`). The seeds are
    fixed, so a few-seed version checks the same cases every time."""
    return [pytest.param(few, id=f"{few}-seeds"),
            pytest.param(many, id=f"{many}-seeds", marks=pytest.mark.stats)]


def pytest_collection_modifyitems(config, items) -> None:
    """A test that uses the session's Ray instance is end-to-end whether or not its file says
    so: `make test-fast` (-m "not e2e") must never start Ray, or its time bound means nothing.

    The soak lane (`@pytest.mark.soak`, tens of minutes) runs only when asked for by a marker
    expression that names it (`pytest -m soak`); every other test runs as before."""
    soak = "soak" in (config.getoption("markexpr") or "")
    skip = pytest.mark.skip(reason="soak lane: run it with pytest -m soak")
    for item in items:
        if "ray_session" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
        if not soak and "soak" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def fast_lane_starts_no_ray(request):
    """A test not marked `e2e` that starts Ray fails, naming the marker: the fast lane's
    promise (no Ray) is checked, not hoped for. In this process `ray.init` is watched; in a
    child process (a `sleuth` command, a script) Ray is seen by where it writes: `RAY_TMPDIR`
    points every child at a directory of this test's own, where a Ray instance leaves its
    `ray/session_*` directory (Ray's `get_default_system_temp_dir`).

    Its own MonkeyPatch, not the test's `monkeypatch`: set up before the test's, it is undone
    after it, so the check and the clean-up run with the test's own patches gone."""
    if request.node.get_closest_marker("e2e") is not None:
        yield
        return
    import shutil
    import tempfile

    import ray

    started: list[str] = []
    real_init = ray.init

    def recording_init(*args, **kwargs):
        started.append(str(kwargs.get("address", args[0] if args else "")))
        return real_init(*args, **kwargs)

    watched = Path(tempfile.mkdtemp(prefix="sl-noray-"))  # short: Ray's socket paths
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(ray, "init", recording_init)
        patch.setenv("RAY_TMPDIR", str(watched))
        yield
    in_children = sorted(p.name for p in (watched / "ray").glob("session_*"))
    shutil.rmtree(watched, ignore_errors=True)
    assert not started, "this test starts Ray: mark it @pytest.mark.e2e"
    assert not in_children, ("this test starts Ray in a child process"
                             f" ({', '.join(in_children)}): mark it @pytest.mark.e2e")


class RayWouldStart(Exception):
    """Raised in place of starting Ray: a refusal came too late."""


@pytest.fixture
def ray_starts(monkeypatch) -> list[str]:
    """Every call the controller makes to start Ray, recorded and stopped there: a test of a
    refusal asserts it stays empty (where the refusal happened, not how long it took)."""
    from orchestrator.control import controller

    calls: list[str] = []

    def record(cluster, nodes=None):
        calls.append(str(cluster.get("kind")))
        raise RayWouldStart("the controller began to start Ray before the input was refused")

    monkeypatch.setattr(controller, "start_ray", record)
    return calls


@pytest.fixture(scope="session")
def ray_session():
    """One real local Ray instance for the whole session; controllers reuse it."""
    import ray

    from orchestrator.control.controller import loopback_only
    from orchestrator.control.ray_cluster import gpus_left_alone, lean_head, stop_owned

    stop_owned()  # an instance an earlier test's command left for the rest of its process
    loopback_only()
    with lean_head(), gpus_left_alone():  # as sleuth starts its own local instance
        ray.init(address="local", num_cpus=2, include_dashboard=False,
                 _node_ip_address="127.0.0.1", log_to_driver=False, namespace="sleuth-tests")
    yield ray
    ray.shutdown()


@pytest.fixture
def sim_repo(tmp_path: Path) -> tuple[Path, list[str]]:
    repo = tmp_path / "repo"
    shas = make_sim_repo(repo, [{}, {"decode_mult": 1.0}, {"verify_mult": 1.5}])
    return repo, shas


def _our_processes(base: Path) -> list[str]:
    """Processes whose working directory lies under this session's temp dirs."""
    found = []
    base_s = str(base)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        state = stat[stat.rfind(")") + 2:].split()[0]
        if cwd.startswith(base_s) and state != "Z":
            cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            found.append(f"{entry}: {cmd[:120]}")
    return found


@pytest.fixture(autouse=True)
def no_orphans(tmp_path_factory):
    """Every test must leave no process running from its temp dirs (servers, workers...)."""
    yield
    base = tmp_path_factory.getbasetemp()
    leftovers = _our_processes(base)
    # A process that is already exiting gets up to a second to finish; the check ends as soon
    # as none is left, so a test whose processes are gone a moment later does not wait it out.
    deadline = time.monotonic() + 1.0
    while leftovers and time.monotonic() < deadline:
        time.sleep(0.05)
        leftovers = _our_processes(base)
    assert not leftovers, f"processes left behind: {leftovers}"
