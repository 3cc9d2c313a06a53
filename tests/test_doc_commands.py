"""Every `sleuth` command README.md and docs/*.md show, run as a user types it.

The lane reads the documents (`doc_commands.py`: markdown-it-py and shlex), maps the documents'
placeholder paths (`/srv/src/sglang`, `R`, `DIR`, `/tmp/sc`, ...) to fixtures by one table,
`PLACEHOLDERS`, and runs each command through the installed `sleuth` entry point in a
subprocess, in its block's order, in a fresh working directory. Each command has one case in
`CASES`, keyed by the command exactly as documented:

- `Runs`: it runs here (the simulated node, `target=command` fixtures, local wheel
  directories, a local Ray); its exit code and the key line of its answer are checked, and where
  it names a cause, the cause against the fixture's truth;
- `Refused`: it needs what no machine of the test suite has (a GPU, the real SGLang, a cluster of
  GPU nodes); it is run all the same and must end in its one-line refusal, exit 2, with the
  reason given here (listed as skipped-with-reason in docs/design.md).

A command added to the documents without a case, or a case whose command left them, fails the
lane; so does a documented command whose exit code or key line changed. Inline forms
(`sleuth resume RUN`) are syntax, not runnable: their command must exist and every key they
name must be one its configuration has.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import git
from doc_commands import Block, Command, blocks, documents, forms
from pkgwheels import release_line

pytestmark = pytest.mark.e2e

SLEUTH = str(Path(sys.executable).parent / "sleuth")


# ----------------------------------------------------------------------------- fixtures


class Workspace:
    """A block's working directory and the fixtures its placeholders name, made on demand."""

    def __init__(self, base: Path):
        self.base = base
        self.cwd = base / "cwd"
        self.cwd.mkdir(parents=True)
        self._made: dict[str, str] = {}

    def get(self, name: str) -> str:
        if name not in self._made:
            self._made[name] = str(getattr(self, f"_make_{name}")())
        return self._made[name]

    # -- the fixtures ------------------------------------------------------------------------
    def _make_sglang_repo(self) -> Path:
        """Where the documents say /srv/src/sglang: a repository with the tags they name."""
        repo = self.base / "sglang"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        for i, tag in enumerate(("v0.5.9", None)):
            (repo / "version.txt").write_text(f"{i}\n")
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", f"commit {i}")
            if tag:
                git(repo, "tag", tag)
        return repo

    def _make_kernels_repo(self) -> Path:
        """/srv/src/mykernels: a make-built kernel library whose matmul got 2x slower in one
        commit between tag v1.2 and main (a sleep of 50 -> 100 ms: a busy machine's scheduling
        jitter, a few ms, cannot blur it)."""
        repo = self.base / "mykernels"
        (repo / "src").mkdir(parents=True)
        git(repo, "init", "-q", "-b", "main")
        (repo / "Makefile").write_text("all:\n\t@echo built > build.stamp\n")
        (repo / ".gitignore").write_text("build.stamp\n__pycache__/\n")
        for i, ms in enumerate((50, 50, 50, 100, 100)):
            (repo / "src" / "mykernels.py").write_text(
                f"import time\n\n\ndef matmul():\n    time.sleep({ms / 1000!r})  # rev {i}\n")
            git(repo, "add", "-A")
            git(repo, "commit", "-q", "-m", f"matmul revision {i}")
            if i == 1:
                git(repo, "tag", "v1.2")
        return repo

    def _make_kernels_bench(self) -> Path:
        """/srv/bench/matmul.py: a bench kept outside the repository; it imports the worktree's
        code through the PYTHONPATH sleuth sets."""
        bench = self.base / "bench" / "matmul.py"
        bench.parent.mkdir(parents=True)
        bench.write_text(textwrap.dedent("""\
            import json, sys, time
            import mykernels
            t0 = time.perf_counter()
            mykernels.matmul()
            ms = (time.perf_counter() - t0) * 1000
            print(json.dumps({"value": ms}) if "--json" in sys.argv else ms)
        """))
        return bench

    def _make_bench_repo(self) -> Path:
        """R: a repository holding only a bench that times importing slowpkg."""
        repo = self.base / "R"
        repo.mkdir()
        git(repo, "init", "-q", "-b", "main")
        (repo / "bench.py").write_text(textwrap.dedent("""\
            import json, time
            t0 = time.perf_counter()
            import slowpkg
            print(json.dumps({"value": (time.perf_counter() - t0) * 1000}))
        """))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "bench")
        return repo

    def _make_wheels(self) -> Path:
        """DIR / /wheels: slowpkg 1.0 ... 1.9, 1.6 and later three times slower to import."""
        versions = [f"1.{i}" for i in range(10)]
        return release_line(self.base / "wheels", "slowpkg",
                            {v: (60.0 if i >= 6 else 20.0) for i, v in enumerate(versions)})

    def _make_sglang_logs(self) -> Path:
        """/var/log/sglang/: real-format SGLang logs (tests/fixtures/sglang_logs, each line's
        source named in its README there)."""
        import shutil

        return Path(shutil.copytree(Path(__file__).parent / "fixtures" / "sglang_logs",
                                    self.base / "sglang_logs"))

    def cleanup(self) -> None:
        """A block that leaves a server running as documented (the live server relaunched, as
        the node was found) has it stopped here, as the user would stop theirs."""
        import signal

        mine = str(self.base)
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == os.getpid():
                continue
            try:
                if os.readlink(f"/proc/{entry}/cwd").startswith(mine):
                    os.kill(int(entry), signal.SIGKILL)
            except OSError:
                continue

    def _make_closed_address(self) -> str:
        """A cluster address nothing listens at: the command's refusal comes at once."""
        from orchestrator.util.process import free_port

        return f"127.0.0.1:{free_port('127.0.0.1')}"

    def prepare(self, doc: str) -> None:
        """What a block's prose says is already there before its first command."""
        if doc == "docs/kernels.md":  # "Given traces/fast/ and traces/slow/ (torch traces)"
            from test_kernels_command import _traces

            _traces(self.cwd)

    def truth(self, scenario: str, key: str) -> str:
        return json.loads((Path(self.get("tmp")) / scenario / "truth.json").read_text())[key]

    def _make_tmp(self) -> Path:
        """/tmp: the documents' scratch paths land in the test's own temporary directory."""
        return self.base / "tmp"


# One table: a documented placeholder (a whole word, a whole `key=value` value, or a path
# prefix) -> what the lane gives in its place.
PLACEHOLDERS: dict[str, Callable[[Workspace], str]] = {
    "/srv/src/sglang": lambda w: w.get("sglang_repo"),
    "/srv/src/mykernels": lambda w: w.get("kernels_repo"),
    "/srv/bench/matmul.py": lambda w: w.get("kernels_bench"),
    "/tmp": lambda w: w.get("tmp"),
    "R": lambda w: w.get("bench_repo"),
    "/wheels": lambda w: w.get("wheels"),
    "DIR": lambda w: w.get("wheels"),
    "PATH": lambda w: w.get("sglang_repo"),
    "REF": lambda w: "HEAD",
    "C": lambda w: "HEAD",
    "G": lambda w: "HEAD~1",
    "B": lambda w: "HEAD",
    "K": lambda w: "2",
    "RUN": lambda w: "no-such-reference",
    "GOOD": lambda w: w.truth("sc", "good"),
    "BAD": lambda w: w.truth("sc", "bad"),
    "$GOOD": lambda w: w.truth("sc", "good"),
    "$BAD": lambda w: w.truth("sc", "bad"),
    "10.0.0.1:6379": lambda w: w.get("closed_address"),
    "/var/log/sglang": lambda w: w.get("sglang_logs"),
}


def _map_value(value: str, ws: Workspace) -> str:
    if value.startswith("log:"):  # reference=log:PATH
        return "log:" + _map_value(value[4:], ws)
    if value in PLACEHOLDERS:
        return PLACEHOLDERS[value](ws)
    for name, make in PLACEHOLDERS.items():
        if name.startswith("/") and value.startswith(name + "/"):
            return make(ws) + value[len(name):]
    return value


def _substitute(value: str, ws: Workspace) -> str:
    """A command substitution as the shell would expand it on a machine of the suite:
    `$(cat PATH)` reads the (mapped) file; `$(pgrep ...)` finds no SGLang server here."""
    inner = value[2:-1].split()
    if inner[0] == "cat":
        return Path(_map_value(inner[1], ws)).read_text().strip()
    if inner[0] == "pgrep":
        return ""
    raise AssertionError(f"no rule for the substitution {value!r}")


def mapped(words: tuple[str, ...], ws: Workspace) -> list[str]:
    """The command's words with every placeholder replaced (inside a quoted target command
    too: `'target.bench=python /srv/bench/matmul.py --json'`) and `$(...)` expanded."""
    out = []
    for word in words:
        key, eq, value = word.partition("=")
        if not eq:
            out.append(_map_value(word, ws))
        elif value.startswith("$(") and value.endswith(")"):
            out.append(f"{key}={_substitute(value, ws)}")
        elif key.startswith("target."):  # a command line: each of its words
            out.append(f"{key}=" + " ".join(_map_value(p, ws) for p in value.split(" ")))
        else:
            out.append(f"{key}={_map_value(value, ws)}")
    return out


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Runs:
    """Runs here as documented: its exit code, the key line of its output, and (`check`) what
    its findings say against the fixture's truth."""

    exit: int | tuple[int, ...]  # the exit code, or the codes its answer may end with
    expect: str  # a regular expression one line of stdout or stderr matches
    check: Callable[[Workspace, str], None] | None = None


@dataclass(frozen=True)
class Refused:
    """Needs what no machine of the suite has: still run, it ends in this one-line refusal."""

    why: str
    expect: str
    exit: int = 2


def _findings(ws: Workspace, output: str, name: str = "findings.json") -> dict:
    run_dir = re.findall(r"^run directory: (\S+)", output, re.M)[-1]
    return json.loads((Path(run_dir) / name).read_text())


def _planted(ws: Workspace) -> dict:
    return json.loads((Path(ws.get("tmp")) / "sc" / "truth.json").read_text())


def _true_commits(named: list[str], truth: dict) -> bool:
    culprits = [c["sha"] for c in truth["culprits"]]
    return bool(named) and all(any(c.startswith(n[:12]) for c in culprits) for n in named)


def _names_the_planted_commit(ws: Workspace, output: str) -> None:
    named = [f["id"] for f in _findings(ws, output)["findings"] if f.get("kind") == "commit"]
    assert _true_commits(named, _planted(ws)), named


def _names_the_slow_matmul(ws: Workspace, output: str) -> None:
    doc = _findings(ws, output)
    top = doc["findings"][0]
    subject = git(Path(ws.get("kernels_repo")), "log", "-1", "--format=%s", top["id"])
    assert (top["kind"], subject) == ("commit", "matmul revision 3"), top
    assert top["probability"] >= 0.99


def _names_release_16(ws: Workspace, output: str) -> None:
    top = _findings(ws, output)["findings"][0]
    assert (top["kind"], top["release"], top["parent"]) == ("package", "1.6", "1.5"), top
    assert top["probability"] >= 0.99


def _nccl_named_or_left(answer: dict, truth_pct: float = 4.91) -> None:
    """The dropped NCCL_PROTO of the seed story costs +4.9% verify, just over the 4% min
    effect: a run names it, or (its restarts read it low) leaves it unnamed, and then the
    answer's unexplained part must hold it, never a claim that nothing that large is left."""
    env = [c["id"] for c in answer["causes"] if c.get("kind") == "env"]
    if env:
        assert env == ["NCCL_PROTO"], answer["sentence"]
        return
    lo, hi = answer["unexplained"]["ci"]
    assert lo <= truth_pct <= hi, answer["sentence"]


def _seed_story_answer(ws: Workspace, output: str) -> None:
    """The README's rehearsal names the planted commit and the power limit, and NCCL_PROTO
    or leaves room for it (`_nccl_named_or_left`); nothing else."""
    answer = _findings(ws, output, "findings-investigate.json")["answer"]
    causes = answer["causes"]
    named = [c["id"] for c in causes if c.get("kind") == "commit"]
    assert _true_commits(named, _planted(ws)), causes
    assert {c.get("kind") for c in causes} - {"env"} == {"commit", "clock"}, causes
    _nccl_named_or_left(answer)


def _kernels_run(ws: Workspace, output: str) -> None:
    """A kernels run writes what every run does, and its table names the planted mover (the
    relabelled traces' matmul, three times slower); `sleuth report` renders it again."""
    run_dir = Path(re.findall(r"^run directory: (\S+)", output, re.M)[-1])
    for name in ("config.yaml", "trials.db", "findings.json", "report.md", "report.html",
                 "plots/kernels.png"):
        assert (run_dir / name).is_file(), name
    doc = json.loads((run_dir / "findings.json").read_text())
    entry = doc["answer"]["evidence"][0]
    assert "| mode | family |" in (run_dir / "report.md").read_text()
    if doc["verdict"] == "not_judged":  # one trace a side: the table as measured, no interval
        assert "no interval" in output
        assert entry["families"] and all(r["ci"] is None for r in entry["families"])
    else:
        assert doc["verdict"] == "moved" and entry["top"] == {"mode": "step", "family": "gemm"}
    report = subprocess.run([SLEUTH, "report", str(run_dir)], cwd=ws.cwd, capture_output=True,
                            text=True, timeout=300)
    assert report.returncode == 0 and "report.html" in report.stdout


def _old_log_answer(ws: Workspace, output: str) -> None:
    """The old log's story names the power limit (unknown then: "not in the log"), and the
    dropped NCCL variable or leaves room for it (`_nccl_named_or_left`), and nothing else."""
    answer = _findings(ws, output, "findings-investigate.json")["answer"]
    causes = {c["id"]: c for c in answer["causes"]}
    assert set(causes) - {"NCCL_PROTO"} == {"power_limit_w"}, answer["sentence"]
    assert "not in the log" in causes["power_limit_w"]["label"]
    _nccl_named_or_left(answer)


def _state_answer(ws: Workspace, output: str) -> None:
    """The live story names server state as the one cause; the original command runs again."""
    run_dir = Path(re.findall(r"^run directory: (\S+)", output, re.M)[-1])
    answer = json.loads((run_dir / "findings-investigate.json").read_text())["answer"]
    (state,) = answer["causes"]
    assert state["kind"] == "state", answer["sentence"]
    assert json.loads((run_dir / "relaunched.json").read_text())["ready"]


SGLANG_MISSING = (r"^sleuth: error: SGLang is not installed for this Python, and the default"
                  r" target is a real SGLang server")
NEEDS_SGLANG = "a real SGLang server on GPUs (the real package is not installed in the suite)"
NEEDS_GPU_CLUSTER = "a Ray cluster of GPU nodes at 10.0.0.1:6379 running SGLang"

CASES: dict[str, Runs | Refused] = {
    # README.md: the question, in two commands
    "sleuth trial repo=/srv/src/sglang commit=v0.5.9 restarts=3 run_id=ref-0509"
    " target=sglang_kimi_k25_eagle3": Refused(NEEDS_SGLANG, SGLANG_MISSING),
    "sleuth investigate repo=/srv/src/sglang reference=ref-0509 bad=HEAD metric=verify_ms":
        Refused(NEEDS_SGLANG, SGLANG_MISSING),
    # README.md: rehearse both steps without a GPU
    "sleuth scenario out=/tmp/sc preset=seed_story": Runs(0, r"^next: sleuth scenario out=.*"
                                                            r" apply=reference"),
    "sleuth scenario out=/tmp/sc apply=reference runs_dir=/tmp/runs":
        Runs(0, r"^next: sleuth trial target=sim"),
    "sleuth trial target=sim repo=/tmp/sc/repo runs_dir=/tmp/runs commit=GOOD restarts=3"
    " run_id=reference": Runs(0, r"^reference: sleuth investigate reference=reference bad=HEAD"
                                 r" target=sim"),
    "sleuth scenario out=/tmp/sc apply=now runs_dir=/tmp/runs":
        Runs(0, r"^next: sleuth investigate target=sim"),
    "sleuth investigate target=sim repo=/tmp/sc/repo runs_dir=/tmp/runs reference=reference"
    " bad=BAD": Runs(0, r"^  compared: verify_ms .* from the reference", _seed_story_answer),
    # README.md: one GPU box
    "sleuth doctor": Runs(0, r"^\s*(ok|warn)\s+git\s"),
    "sleuth investigate target=sglang_kimi_k25_eagle3 repo=/srv/src/sglang reference=ref-0509"
    " bad=HEAD target.model_path=/models/Kimi-K2.5"
    " target.speculative_draft_model_path=/models/eagle3 trial.ready_timeout_s=1800":
        Refused(NEEDS_SGLANG, SGLANG_MISSING),
    # README.md and docs/cluster.md: a Ray cluster of GPU nodes
    "sleuth investigate cluster=ray cluster.address=10.0.0.1:6379 nodes=2"
    " target=sglang_kimi_k25_eagle3 repo=/srv/src/sglang reference=ref-0509 bad=HEAD":
        Refused(NEEDS_GPU_CLUSTER, r"^sleuth: error: no run 'ref-0509'"),
    "sleuth bisect cluster=ray cluster.address=10.0.0.1:6379 nodes=2"
    " target=sglang_kimi_k25_eagle3 repo=/srv/src/sglang good=v0.5.9 bad=HEAD metric=verify_ms"
    " trial.ready_timeout_s=1800 bench.requests=8 bench.input_len=512 bench.output_len=256"
    " bench.repetitions=3": Refused(NEEDS_GPU_CLUSTER, r"^sleuth: error: cannot reach the Ray"
                                                       r" cluster at 127\.0\.0\.1:\d+"),
    "sleuth bisect target=command repo=/srv/src/mykernels good=v1.2 bad=main"
    " target.build=make -j8 target.bench=python bench/matmul.py --json cluster=ray"
    " cluster.address=10.0.0.1:6379 nodes=4":
        Refused("a Ray cluster of four nodes at 10.0.0.1:6379 (tests/test_multinode.py runs"
                " `ray start` clusters)", r"^sleuth: error: cannot reach the Ray cluster at"
                                          r" 127\.0\.0\.1:\d+"),
    # README.md: any other project
    "sleuth bisect target=command repo=/srv/src/mykernels good=v1.2 bad=main"
    " target.build=make -j8 target.bench=python /srv/bench/matmul.py --json":
        Runs(0, r'^answer: value .* = commit \w+ ', _names_the_slow_matmul),
    "sleuth trial target=command repo=/srv/src/mykernels commit=v1.2 restarts=3 run_id=ref-k"
    " target.bench=python /srv/bench/matmul.py --json":
        Runs(0, r"^reference: sleuth investigate reference=ref-k bad=HEAD target=command"),
    # the answer, whatever the remainder's interval decided (0 or 3), never a traceback
    "sleuth investigate target=command repo=/srv/src/mykernels reference=ref-k bad=main":
        Runs((0, 3), r'^answer: value .* = commit \w+ ', _names_the_slow_matmul),
    # docs/cluster.md: rehearse without GPUs (the simulator behind the SGLang adapter); the
    # bisect names the planted commit, and what is left beside it over the whole range is
    # decided (0) or, on the endpoints' few restarts, undecided against 4% (3): a run here
    # read +3.8% [-5.4, +13.9] left after 15 restarts.
    "sleuth scenario out=/tmp/sc commits=120 preset=one_culprit":
        Runs(0, r"^next: sleuth bisect target=sim"),
    "sleuth bisect target=sglang launcher=sim repo=/tmp/sc/repo good=$GOOD bad=$BAD"
    " metric=verify_ms nodes=2 target.tp_size=8 target.speculative_algorithm=EAGLE3"
    " target.speculative_num_steps=2 target.speculative_eagle_topk=1"
    " target.speculative_num_draft_tokens=3": Runs((0, 3), r"^answer: verify_ms ",
                                                   _names_the_planted_commit),
    # docs/benchmarks.md: the sweep on real sim servers
    "sleuth scenario out=sc commits=30 seed=1": Runs(0, r"^next: sleuth bisect target=sim"),
    "sleuth sweep target=sim repo=sc/repo commit=v0.5.8 space=nccl_pcie metric=verify_ms"
    " trials=40 nodes=2": Runs(0, r"^answer: "),
    # docs/packages.md
    "sleuth trial repo=R commit=C packages=[nvidia-nccl-cu12==2.27.5] packages.find_links=/wheels":
        Refused(NEEDS_SGLANG, SGLANG_MISSING),
    "sleuth bisect repo=R good=G bad=B packages=[flashinfer-python==0.2.3]":
        Refused(NEEDS_SGLANG, SGLANG_MISSING),
    "sleuth isolate repo=R good.packages=[flashinfer-python==0.2.3]"
    " bad.packages=[flashinfer-python==0.2.5] bad.env.NCCL_PROTO=Simple"
    " packages.find_links=/wheels": Refused(NEEDS_SGLANG, SGLANG_MISSING),
    "sleuth isolate reference=RUN packages.find_links=/wheels":
        Refused(NEEDS_SGLANG, SGLANG_MISSING),
    "sleuth bisect package=slowpkg good=1.0 bad=1.9 packages.find_links=/wheels target=command"
    " repo=R target.bench=python bench.py metric=value":
        Runs(0, r"^answer: value x\d.* = slowpkg 1\.5 -> 1\.6 ", _names_release_16),
    # README.md: you have only logs; the slow server is running now
    "sleuth investigate repo=/srv/src/sglang reference=log:/var/log/sglang/"
    " log.pattern=verify (?P<verify_ms>[0-9.]+) ms": Refused(NEEDS_SGLANG, SGLANG_MISSING),
    "sleuth trial from_log=/var/log/sglang/ run_id=ref-log":
        Runs(0, r"^reference: sleuth investigate reference=ref-log"),
    "sleuth investigate live=$(pgrep -of sglang.launch_server) live.restart=true was=19":
        Refused(NEEDS_SGLANG, SGLANG_MISSING),
    # docs/system-level.md: an old log on the simulated node
    "sleuth scenario out=/tmp/oldlog preset=old_log": Runs(0, r"old log:"),
    "sleuth scenario out=/tmp/oldlog apply=now runs_dir=/tmp/runs-oldlog":
        Runs(0, r"reference=log:"),
    "sleuth investigate target=sim repo=/tmp/oldlog/repo runs_dir=/tmp/runs-oldlog"
    " reference=log:/tmp/oldlog/old_logs": Runs((0, 4), r"^answer: verify_ms", _old_log_answer),
    "sleuth trial from_log=/tmp/oldlog/old_logs run_id=oldlog runs_dir=/tmp/runs-oldlog"
    " log.pattern=verify (?P<verify_ms>[0-9.]+) ms":
        Runs(0, r"^reference: sleuth investigate reference=oldlog"),
    # docs/system-level.md: the slow server, running now
    "sleuth scenario out=/tmp/slow preset=server_state": Runs(0, r"apply=live"),
    "sleuth scenario out=/tmp/slow apply=live runs_dir=/tmp/runs-slow": Runs(0, r"live="),
    "sleuth investigate target=sim runs_dir=/tmp/runs-slow live=$(cat /tmp/slow/live/pid)"
    " live.restart=true was=19.0":
        Runs(0, r"^answer: verify_ms .* = server state ", _state_answer),
    # docs/kernels.md: traces a user already has
    "sleuth kernels then=traces/fast now=traces/slow":
        Runs(0, r"kernels: step: GEMM", _kernels_run),
    "sleuth kernels then=traces/fast/*.json.gz now=traces/slow/*.json.gz mode=step":
        Runs(0, r"kernels: step: GEMM", _kernels_run),
    "sleuth kernels then=[traces/fast/fast-0.trace.json.gz]"
    " now=[traces/slow/slow-0.trace.json.gz]": Runs(3, r"no interval", _kernels_run),
    # docs/statistics.md
    "sleuth sweep repo=PATH commit=REF space=nccl_pcie metric=output_throughput trials=40"
    " nodes=K": Refused(NEEDS_SGLANG, SGLANG_MISSING),
}

# Documented commands that cannot run as written: `...` stands for the rest of a line shown
# in full just above it.
ELLIPSIS = "..."


# ----------------------------------------------------------------------------- the lane


def _all_blocks() -> list[Block]:
    return [b for doc in documents() for b in blocks(doc)]


def _runnable(command: Command) -> bool:
    return ELLIPSIS not in command.words


def test_every_documented_command_has_a_case():
    documented = [c for b in _all_blocks() for c in b.commands if _runnable(c)]
    missing = [f"{c.doc}:{c.line}: {c.key}" for c in documented if c.key not in CASES]
    assert not missing, ("documented commands without a case in tests/test_doc_commands.py"
                         " CASES (add one: Runs or Refused):\n" + "\n".join(missing))
    stale = set(CASES) - {c.key for c in documented}
    assert not stale, f"cases whose command is no longer documented: {sorted(stale)}"


def _run(command: Command, ws: Workspace) -> subprocess.CompletedProcess:
    words = mapped(command.words, ws)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "COLUMNS": "1000"}
    return subprocess.run([SLEUTH, *words], cwd=ws.cwd, env=env, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.parametrize("block", _all_blocks(), ids=lambda b: b.id)
def test_documented_block_runs_as_written(block: Block, tmp_path):
    ws = Workspace(tmp_path)
    ws.prepare(block.doc)
    try:
        _run_block(block, ws)
    finally:
        ws.cleanup()


def _run_block(block: Block, ws: Workspace) -> None:
    for command in block.commands:
        if not _runnable(command):
            continue
        case = CASES.get(command.key)
        if case is None:
            pytest.fail(f"{command.doc}:{command.line}: no case for {command.key!r}")
        done = _run(command, ws)
        output = done.stdout + done.stderr
        where = f"{command.doc}:{command.line}: {command.text}\n{output[-4000:]}"
        assert "Traceback" not in output, where
        assert done.returncode in (case.exit if isinstance(case.exit, tuple) else (case.exit,)), where
        assert re.search(case.expect, output, re.M), f"expected /{case.expect}/ in\n{where}"
        if isinstance(case, Refused):
            errors = [ln for ln in done.stderr.splitlines() if ln.strip()]
            assert len(errors) == 1, where  # one line, nothing else
        elif case.check is not None:
            case.check(ws, output)


# -------------------------------------------------------------------------- inline forms

# Placeholder-looking values in prose: a key given one is checked for existence only.
OPEN_KEYS = ("env.", "good.", "bad.", "experiment.params.", "target.env.")


def _all_forms() -> list[Command]:
    return [f for doc in documents() for f in forms(doc)]


@pytest.mark.parametrize("form", _all_forms(), ids=lambda f: f"{f.doc}:{f.line}:{f.text}")
def test_inline_forms_name_real_commands_and_keys(form: Command):
    from omegaconf import OmegaConf

    from orchestrator.cli import COMMANDS
    from orchestrator.config.compose import compose_config

    command = form.words[0] if form.words else ""
    if command in ("help", "<command>"):  # `sleuth help <command>`, `sleuth <command> --help`
        return
    assert command in COMMANDS, form.text
    keys = [w.split("=", 1)[0] for w in form.words[1:] if "=" in w]
    if not keys:
        return
    target = next((w.split("=", 1)[1] for w in form.words if w.startswith("target=")), "sim")
    cfg = compose_config(command, [f"target={target if target.isidentifier() else 'sim'}"])
    aliases = {"package": "package.name", "packages": "packages.pins"}
    for key in keys:
        if key.startswith(OPEN_KEYS):
            continue
        key = aliases.get(key, key)
        assert OmegaConf.select(cfg, key, default="<absent>") != "<absent>", (form.text, key)


# ----------------------------------------------------------------------------- the table


def test_design_lists_the_refused_commands_with_their_reasons():
    """docs/design.md's table of documented commands the suite cannot run names each reason."""
    design = (Path(__file__).resolve().parents[1] / "docs" / "design.md").read_text()
    for case in CASES.values():
        if isinstance(case, Refused):
            assert case.why in design, case.why
