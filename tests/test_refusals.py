"""A newcomer's mistakes are refused before Ray starts; Ray's own start-up failures are one line.

Each refusal is checked for what the user sees (exit 2, one line on stderr, nothing written)
and for where it happened: before the controller would start Ray. That is asserted by
recording the controller's `start_ray` (which raises here, so a refusal that came too late
cannot go on to run trials), not by timing the command, which would measure the machine's load.

Ray itself is the one part replaced in the start-up tests below (as the GPU is elsewhere):
`ray.init` raises what Ray raises when its processes do not register in time.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.commands import common, doctor
from orchestrator.config.compose import compose_settings
from orchestrator.runner.holder import HOLDER_FILE, NODE_LOCK
from orchestrator.util.process import start_time
from orchestrator.workspace.locking import release, try_exclusive
from tests.conftest import make_sim_repo

RAY_TIMEOUT = ("The current node timed out during startup. This could happen because some of"
               " the raylet failed to startup or the GCS has become overloaded.")


@pytest.fixture
def world(tmp_path):
    repo = tmp_path / "repo"
    shas = make_sim_repo(repo, [{}, {}, {"verify_mult": 1.5}, {}, {}])
    return {"base": tmp_path, "repo": repo, "shas": shas, "runs": tmp_path / "runs"}


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file() and "/.git/" not in f"/{p}"}


def _refused(argv: list[str], base: Path, capsys) -> tuple[int, str]:
    before = _tree(base)
    with pytest.raises(SystemExit) as exc:
        main(argv)
    err = capsys.readouterr().err.strip()
    assert _tree(base) == before, "a refusal wrote something"
    return int(exc.value.code), err


@pytest.fixture
def held_node(world):
    """Node local-0 of `world`'s runs_dir held by a live run (this process, as its actor and
    its controller would be), the way a NodeRunner holds it."""
    state = world["runs"] / ".nodes" / "local-0"
    state.mkdir(parents=True)
    lock = try_exclusive(state / NODE_LOCK)
    assert lock is not None
    me = {"pid": os.getpid(), "start_time": start_time(os.getpid()),
          "host": socket.gethostname()}
    (state / HOLDER_FILE).write_text(json.dumps({**me, "run_id": "20260101-first-run",
                                                 "since": 1.0e9, "controller": me}))
    yield state
    release(lock)


NEWCOMER = {
    "unknown commit": (["bisect", "good=no-such-commit", "bad=HEAD"], "no-such-commit"),
    "metric typo": (["bisect", "good=HEAD~4", "bad=HEAD", "metric=verfy_ms"], "verfy_ms"),
    "good and bad swapped": (["bisect", "good=HEAD", "bad=HEAD~4"], "not an ancestor"),
    "wrong repo path": (["bisect", "good=HEAD~4", "bad=HEAD", "repo={base}/no-such-repo"],
                        "does not exist"),
    "a good level of zero": (["bisect", "good=HEAD~4", "bad=HEAD", "was=0"], "was"),
    "two good levels": (["bisect", "good=HEAD~4", "bad=HEAD", "was=19", "reference=ref"],
                        "give one"),
}


@pytest.mark.parametrize("name", list(NEWCOMER))
@pytest.mark.parametrize("command", ["bisect", "investigate"])
def test_a_newcomers_mistake_is_refused_before_ray(name, command, world, ray_starts, capsys):
    args, needle = NEWCOMER[name]
    argv = [command, *args[1:], "target=sim", f"runs_dir={world['runs']}"]
    if not any(a.startswith("repo=") for a in argv):
        argv.append(f"repo={world['repo']}")
    argv = [a.format(base=world["base"]) for a in argv]
    code, err = _refused(argv, world["base"], capsys)
    assert code == 2, err
    assert len(err.splitlines()) == 1 and err.startswith("sleuth: error: ") and needle in err, err
    assert ray_starts == []
    assert not world["runs"].exists()


@pytest.mark.parametrize("command", [
    ["trial"], ["bisect", "good=HEAD~4", "bad=HEAD"], ["compare", "reference=ref"],
])
def test_a_node_held_by_another_run_is_refused_before_ray(command, world, held_node, ray_starts,
                                                          capsys):
    if command[0] == "compare":  # a reference to compare against, so only the node is wrong
        (world["runs"] / "ref").mkdir()
        from orchestrator.store import RunStore

        RunStore.create(world["runs"] / "ref" / "trials.db", run_id="ref", command="trial",
                        config_yaml="{}\n").close()
    argv = [*command, "target=sim", f"repo={world['repo']}", f"runs_dir={world['runs']}"]
    code, err = _refused(argv, world["base"], capsys)
    assert code == 2, err
    assert len(err.splitlines()) == 1, err
    assert "node local-0 is held by another sleuth run (20260101-first-run" in err, err
    assert "another runs_dir=DIR" in err, err  # the way out on the simulated node
    assert ray_starts == []


def test_a_separate_runs_dir_or_a_free_node_is_not_refused(world, held_node):
    """What the refusal suggests works: another runs_dir has its own nodes; and with one of
    two nodes free the run goes on (the held one is skipped with a line once it starts)."""
    base = ["target=sim", f"repo={world['repo']}"]
    common.check_nodes_free(compose_settings("trial", [*base, f"runs_dir={world['base'] / 'r2'}"]))
    common.check_nodes_free(compose_settings("trial", [*base, f"runs_dir={world['runs']}",
                                                     "nodes=2"]))
    held = compose_settings("trial", [*base, f"runs_dir={world['runs']}"])
    with pytest.raises(Exception, match="held by another sleuth run"):
        common.check_nodes_free(held)


def test_a_node_held_by_an_orphan_is_not_refused(world):
    """An actor whose controller is gone is taken over by the next run, not a reason to refuse
    it: here the holder's controller is a pid that is not running."""
    state = world["runs"] / ".nodes" / "local-0"
    state.mkdir(parents=True)
    lock = try_exclusive(state / NODE_LOCK)
    me = {"pid": os.getpid(), "start_time": start_time(os.getpid()),
          "host": socket.gethostname()}
    gone = {"pid": 2**22 + 7, "start_time": "1", "host": socket.gethostname()}
    (state / HOLDER_FILE).write_text(json.dumps({**me, "run_id": "old", "controller": gone}))
    try:
        common.check_nodes_free(compose_settings("trial", [
            "target=sim", f"repo={world['repo']}", f"runs_dir={world['runs']}"]))
    finally:
        release(lock)


# -- Ray's own start-up -----------------------------------------------------------------------

class FailingRay:
    """What `ray.init` raises (settable) and every call it got."""

    def __init__(self) -> None:
        self.failure: Exception = Exception(RAY_TIMEOUT)
        self.tries: list[dict] = []

    def init(self, *args, **kwargs):
        self.tries.append(kwargs)
        raise self.failure


@pytest.fixture
def ray_that_will_not_start(monkeypatch) -> FailingRay:
    """`ray.init` fails as Ray does when its processes miss its 30 s; any Ray already running
    in this test process (the suite's) is hidden and left alone."""
    import ray

    fake = FailingRay()
    monkeypatch.setattr(ray, "init", fake.init)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "shutdown", lambda *a, **k: None)
    return fake


@pytest.mark.parametrize("kind", ["timeout", "failure"])
def test_ray_that_does_not_start_is_one_line_exit_1_nothing_written(
        kind, world, ray_that_will_not_start, capsys, monkeypatch):
    if kind == "failure":
        ray_that_will_not_start.failure = RuntimeError("raylet exited with code 1")
    argv = ["trial", "target=sim", f"repo={world['repo']}", f"runs_dir={world['runs']}"]
    code, err = _refused(argv, world["base"], capsys)
    assert code == 1, err
    assert len(err.splitlines()) == 1 and err.startswith("sleuth: error: "), err
    if kind == "timeout":
        assert len(ray_that_will_not_start.tries) == 2  # once more: a busy machine, not a broken one
        assert "did not finish starting" in err and "busy" in err, err
    else:
        assert len(ray_that_will_not_start.tries) == 1
        assert "Ray could not start on this machine: raylet exited" in err, err
    assert not world["runs"].exists()


def test_doctor_says_slow_for_a_ray_that_runs_out_of_time(ray_that_will_not_start, tmp_path):
    status, name, detail = doctor.check_ray()
    assert (status, name) == ("slow", "ray") and "busy machine" in detail, detail
    ray_that_will_not_start.failure = RuntimeError("raylet exited with code 1")
    status, _, detail = doctor.check_ray()
    assert status == "FAIL" and "raylet exited" in detail, detail
    lines: list[str] = []
    cfg = compose_settings("doctor", [f"runs_dir={tmp_path / 'runs'}"])
    ray_that_will_not_start.failure = Exception(RAY_TIMEOUT)
    assert doctor.run(cfg, emit=lines.append) in (0, 1)
    assert any(line.split()[:2] == ["slow", "ray"] for line in lines), lines
    assert not any(line.startswith("FAIL") and " ray " in line for line in lines), lines


@pytest.mark.parametrize("name", list(NEWCOMER))
def test_a_refusal_loads_neither_ray_nor_scipy(name, world):
    """Most of a refusal's time used to be importing Ray and SciPy for a command that was about
    to be refused; the checks that need no trial now run before either is imported (counted
    in a fresh process's modules, not timed)."""
    import subprocess
    import sys

    args, _ = NEWCOMER[name]
    argv = [*args, "target=sim", f"runs_dir={world['runs']}"]
    if not any(a.startswith("repo=") for a in argv):
        argv.append(f"repo={world['repo']}")
    argv = [a.format(base=world["base"]) for a in argv]
    script = ("import sys\nfrom orchestrator.cli import run\nfrom orchestrator.errors import"
              " UserError\ntry:\n    run(sys.argv[1:])\nexcept UserError:\n    pass\nelse:\n"
              "    sys.exit('not refused')\nprint(sorted(m for m in ('ray', 'scipy.stats')"
              " if m in sys.modules))\n")
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", script, *argv], cwd=root, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


def test_a_good_level_is_refused_where_nothing_is_measured_against_it(world, ray_starts, capsys):
    """`was=VALUE` sets the change a bisect chases; a trial or a sweep has none to chase, and
    silently ignoring the value would let the user believe it counted."""
    argv = ["trial", "was=19", "target=sim", f"repo={world['repo']}",
            f"runs_dir={world['runs']}"]
    code, err = _refused(argv, world["base"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "was=19" in err and "for sleuth bisect and investigate" in err, err
    assert ray_starts == [] and not world["runs"].exists()


def test_a_resume_with_a_budget_under_four_is_refused_as_the_bisect_refuses_it(world, capsys):
    """`sleuth resume RUN max_trials=2` is the same request as `sleuth bisect run_id=RUN
    max_trials=2`, which is refused: the endpoints and a split need four restarts."""
    argv = ["resume", "some-run", "max_trials=2", f"runs_dir={world['runs']}"]
    code, err = _refused(argv, world["base"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "max_trials must be at least 4 (got 2)" in err, err


def test_a_run_another_process_is_writing_is_refused_not_joined(world, capsys):
    """`sleuth resume RUN` typed while RUN still runs (in another terminal, or on a node the
    live run does not hold) would mark its running trials interrupted and measure beside it.
    The live run holds the run's writer lock (here this process, as its controller would):
    the resume is one line, exit 2, and the live run's trial and status are as they were.
    Once the holder closes (it ended, or it was killed: the kernel drops the lock), the same
    resume goes past the lock."""
    from orchestrator.commands.parts import create_run
    from orchestrator.records import Candidate
    from orchestrator.store import RunStore

    cfg = compose_settings("bisect", ["target=sim", f"repo={world['repo']}", "good=HEAD~4",
                                      "bad=HEAD", f"runs_dir={world['runs']}", "run_id=live"])
    run_dir, live = create_run(cfg)
    trial = live.begin_trial(live.candidate_id(Candidate(world["shas"][0])), node="local-0",
                             phase="reproduce")
    before = live.trial(trial).state
    code, err = _refused(["resume", "live", f"runs_dir={world['runs']}"], world["repo"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert f"run live is being written by sleuth bisect (pid {os.getpid()})" in err, err
    assert live.trial(trial).state == before and live.status() == "running"
    live.close()
    other = RunStore.open(run_dir / "trials.db")
    other.claim()  # the holder is gone: the lock is free again
    other.close()


@pytest.mark.parametrize(("numbers", "status"), [((2, 30, 9), "FAIL"), ((2, 31, 0), "ok")])
def test_doctor_holds_git_to_the_version_every_command_needs(numbers, status, monkeypatch):
    """doctor said ok from git 2.25 while every command refuses anything before 2.31 (`git log
    --diff-merges`): it now reads the same minimum. Only git's version string is replaced."""
    import git

    monkeypatch.setattr(git.Git, "version_info", property(lambda self: numbers))
    result, name, detail = doctor.check_git()
    assert (result, name) == (status, "git"), detail
    if status == "FAIL":
        assert "need >= 2.31" in detail


def _live_run(world) -> tuple[Path, object]:
    """A run this process writes, as its controller would (the writer lock held)."""
    from orchestrator.commands.parts import create_run

    cfg = compose_settings("bisect", ["target=sim", f"repo={world['repo']}", "good=HEAD~4",
                                      "bad=HEAD", f"runs_dir={world['runs']}", "run_id=live"])
    return create_run(cfg)


EARLY = {
    "metric typo": (["bisect", "target=sim", "good=HEAD~1", "bad=HEAD", "metric=verfy_ms"],
                    "did you mean verify_ms"),
    "target typo": (["trial", "target=simm"], "did you mean sim?"),
    "resume of a run being written": (["resume", "live"], "is being written by sleuth bisect"),
    "bisect run_id= of a run being written": (["bisect", "run_id=live"],
                                              "is being written by sleuth bisect"),
}


@pytest.mark.parametrize("name", list(EARLY))
def test_a_refusal_from_the_words_alone_loads_not_even_hydra(name, world):
    """What the typed words decide (a metric or target typo, a run another process writes) is
    refused before Hydra composes anything: the refusal's cost is the interpreter's start, not
    Hydra's import and composition (counted in a fresh process's modules, not timed)."""
    import subprocess
    import sys

    run_dir, live = _live_run(world)
    args, says = EARLY[name]
    argv = [*args, f"repo={world['repo']}", f"runs_dir={world['runs']}"]
    script = ("import sys\nfrom orchestrator.cli import run\nfrom orchestrator.errors import"
              " UserError\ntry:\n    run(sys.argv[1:])\nexcept UserError as e:\n"
              "    print(e)\nelse:\n    sys.exit('not refused')\nprint(sorted(m for m in"
              " ('hydra', 'omegaconf', 'ray', 'scipy.stats') if m in sys.modules))\n")
    root = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run([sys.executable, "-c", script, *argv], cwd=root,
                              capture_output=True, text=True, timeout=120)
    finally:
        live.close()
    assert done.returncode == 0, done.stderr
    message, modules = done.stdout.strip().splitlines()
    assert says in message, message
    assert modules == "[]", modules


def test_a_run_id_is_looked_up_in_runs_dir_first_and_an_ambiguous_one_is_refused(
        world, capsys, monkeypatch):
    """`sleuth resume RUN runs_dir=D` (the line printed after a full disk) opens D/RUN even
    when the current directory holds a folder RUN; with runs_dir at its default, a run of that
    name both in ./runs and in . is refused in one line naming both."""
    from orchestrator.store.locate import locate_run

    run_dir, live = _live_run(world)
    live.close()
    monkeypatch.chdir(world["base"])
    (world["base"] / "live").mkdir()  # a folder of that name, not a run
    assert locate_run("live", str(world["runs"])) == run_dir.resolve()
    (world["base"] / "live").rmdir()
    shutil.copytree(run_dir, world["base"] / "live")  # now a run here too
    assert locate_run("live", str(world["runs"])) == run_dir.resolve()  # runs_dir= given
    shutil.copytree(run_dir, world["base"] / "runs" / "live2")
    shutil.copytree(run_dir, world["base"] / "live2")
    code, err = _refused(["report", "live2"], world["base"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "'live2' names two runs" in err and str(world["base"] / "live2") in err, err
    assert str(world["base"] / "runs" / "live2") in err, err
    assert locate_run("./live2", "runs") == (world["base"] / "live2").resolve()


@pytest.mark.parametrize(("argv", "says"), [
    (["trail"], "unknown command 'trail' (did you mean trial?)"),
    (["trial", "bench.repetitons=3"], "(did you mean repetitions"),
    (["trial", "tartget=sim"], "(did you mean target?)"),
    (["trial", "experiment.params.min_efect_pct=1"], "(did you mean min_effect_pct?)"),
    (["bisect", "target=sim", "metric=verfy_ms"], "(did you mean verify_ms"),
    (["trial", "target=simm"], "unknown target 'simm' (did you mean sim?) (known: command,"),
])
def test_a_typo_is_answered_with_the_word_meant(argv, says, world, capsys):
    code, err = _refused([*argv, f"runs_dir={world['runs']}"], world["base"], capsys)
    assert code == 2 and len(err.splitlines()) == 1, err
    assert says in err, err
