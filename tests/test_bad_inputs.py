"""Bad input: one clear line on stderr, exit 2, nothing written, nothing existing damaged."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import main
from tests.conftest import git, make_sim_repo


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A repo with history and a side branch, a trial run, a corrupt store: shared, read-only."""
    base = tmp_path_factory.mktemp("bad-inputs")
    repo = base / "repo"
    shas = make_sim_repo(repo, [{}, {}, {"verify_mult": 1.5}, {}])
    git(repo, "checkout", "-q", "-b", "side", shas[1])
    (repo / "side.txt").write_text("x\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "side commit")
    side = git(repo, "rev-parse", "HEAD")
    git(repo, "checkout", "-q", "main")
    runs = base / "runs"
    (runs / "trialrun").mkdir(parents=True)
    from orchestrator.store import RunStore

    RunStore.create(runs / "trialrun" / "trials.db", run_id="trialrun", command="trial",
                    config_yaml="{}\n").close()
    (runs / "corrupt").mkdir()
    (runs / "corrupt" / "trials.db").write_bytes(b"not a database" * 64)
    (base / "bad.patch").write_text("--- a/nothere.py\n+++ b/nothere.py\n@@ -1 +1 @@\n-x\n+y\n")
    (base / "garbage.patch").write_text("this is not a patch\n")
    (base / "empty.patch").write_text("")
    # Outside `base`, whose every file the cases read before and after.
    locked = tmp_path_factory.mktemp("locked") / "unreadable.patch"
    locked.write_text("--- a/x\n")
    locked.chmod(0)
    return {"base": base, "repo": repo, "shas": shas, "side": side, "runs": runs,
            "locked": locked}


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


CASES = [
    ("unknown command", ["frobnicate"], "unknown command"),
    ("unknown option", ["trial", "--bogus", "repo={repo}"], "--bogus"),
    ("malformed override", ["trial", "repo={repo}", "foo"], "foo"),
    ("unparseable override", ["trial", "repo={repo}", "target.model_path=--x=y"], "quote"),
    ("option-like ref as typed", ["trial", "repo={repo}", "commit=--x=y"], "may not start with"),
    ("unknown config key", ["trial", "repo={repo}", "bench.nope=1"], "nope"),
    ("wrong value type", ["trial", "repo={repo}", "nodes=many"], "nodes"),
    ("unknown target", ["trial", "repo={repo}", "target=nope"], "target"),
    ("no repo", ["trial"], "repo="),
    ("not a git repo", ["trial", "repo={base}"], "not a git"),
    ("unknown ref", ["trial", "repo={repo}", "commit=no-such-ref"], "no-such-ref"),
    ("option-like ref", ["trial", "repo={repo}", "commit='--upload-pack=touch x'"], "upload-pack"),
    ("patch missing", ["trial", "repo={repo}", "patches=[{base}/missing.patch]"], "missing.patch"),
    ("patch does not apply", ["trial", "repo={repo}", "patches=[{base}/bad.patch]"], "bad.patch"),
    # Patches are checked before the worktree cache exists (see FRESH_RUNS_DIR).
    ("patch that is not a patch", ["trial", "repo={repo}", "patches=[{base}/garbage.patch]"],
     "garbage.patch does not apply"),
    ("empty patch", ["trial", "repo={repo}", "patches=[{base}/empty.patch]"], "is empty"),
    ("patch outside the directory", ["trial", "repo={repo}", "patches=[../x]"], "../x"),
    ("unreadable patch", ["trial", "repo={repo}", "patches=[{locked}]"],
     "cannot read patch file"),
    ("isolate patch that is not a patch", ["isolate", "repo={repo}", "good.commit={s0}",
                                           "bad.commit={s3}", "bad.patches=[{base}/garbage.patch]"],
     "garbage.patch does not apply"),
    ("zero repetitions", ["trial", "repo={repo}", "bench.repetitions=0"], "repetitions"),
    ("package pin not exact", ["trial", "repo={repo}", "packages=[torch>=2]"], "name==version"),
    ("package pin not installable", ["trial", "repo={repo}", "packages=[nosuchpkg==1.0]",
                                     "packages.find_links={base}"],
     "cannot install nosuchpkg==1.0 for the trials: Could not find a version"),
    ("isolate pin not installable", ["isolate", "repo={repo}", "good.packages=[nosuchpkg==1.0]",
                                     "packages.find_links={base}"], "nosuchpkg==1.0"),
    ("no wheel directory", ["bisect", "repo={repo}", "good={s0}", "bad={s2}",
                            "packages.find_links={base}/no-wheels"], "not a directory of wheels"),
    ("negative retries", ["trial", "repo={repo}", "trial.retries=-1"], "retries"),
    ("zero nodes", ["bisect", "repo={repo}", "good={s0}", "bad={s3}", "nodes=0"], "nodes"),
    ("tiny budget", ["bisect", "repo={repo}", "good={s0}", "bad={s3}", "max_trials=0"], "max_trials"),
    ("confidence too high", ["bisect", "repo={repo}", "good={s0}", "bad={s3}", "confidence=1.5"],
     "confidence"),
    ("confidence too low", ["bisect", "repo={repo}", "good={s0}", "bad={s3}", "confidence=0.3"],
     "confidence"),
    ("unknown metric", ["bisect", "repo={repo}", "good={s0}", "bad={s3}", "metric=speed"], "speed"),
    ("metric the speculative server never reports",
     ["bisect", "repo={repo}", "good={s0}", "bad={s3}", "metric=decode_ms"], "speculative"),
    ("metric only a speculative server reports",
     ["isolate", "good.commit={s0}", "bad.commit={s3}", "repo={repo}", "metric=verify_ms",
      "target.speculative_algorithm=null"], "speculative"),
    ("bad direction", ["bisect", "repo={repo}", "good={s0}", "bad={s3}", "direction=up"], "direction"),
    ("missing endpoint", ["bisect", "repo={repo}", "good={s0}"], "good=REF bad=REF"),
    ("good equals bad", ["bisect", "repo={repo}", "good={s2}", "bad={s2}"], "same"),
    ("reversed range", ["bisect", "repo={repo}", "good={s3}", "bad={s0}"], "ancestor"),
    ("good not an ancestor", ["bisect", "repo={repo}", "good={side}", "bad={s3}"], "ancestor"),
    ("invalid NCCL value", ["trial", "repo={repo}", "env.NCCL_PROTO=LL129"], "NCCL_PROTO"),
    ("invalid NCCL channels", ["trial", "repo={repo}", "env.NCCL_MAX_NCHANNELS=0"], "NCCL_MAX"),
    ("invalid env name", ["trial", "repo={repo}", "env.1BAD=x"], "1BAD"),
    ("bad clock policy", ["trial", "repo={repo}", "clock=turbo:9000"], "clock"),
    ("corrupt store", ["resume", "{runs}/corrupt"], "not a readable"),
    ("resume a non-resumable run", ["resume", "{runs}/trialrun"], "cannot be resumed"),
    ("bisect into another experiment's run", ["bisect", "run_id=trialrun"], "not a bisect"),
    ("resume a missing run", ["resume", "{runs}/nope"], "no run"),
    ("compare without reference", ["compare", "repo={repo}"], "reference"),
    ("compare against a missing run", ["compare", "repo={repo}", "reference=nope"], "no run"),
    ("scenario without out", ["scenario"], "out=DIR"),
    ("scenario too small", ["scenario", "out={base}/sc", "commits=5"], "commits"),
    ("missing config dir", ["trial", "--config-dir", "{base}/nope", "repo={repo}"], "config-dir"),
    # A new run's id names a directory inside runs_dir, nothing else.
    ("run_id escaping runs_dir", ["trial", "repo={repo}", "run_id=../../x"], "run_id"),
    ("absolute run_id", ["trial", "repo={repo}", "run_id={base}/elsewhere"], "run_id"),
    # Numbers are checked once, at composition, whatever the command.
    ("NaN ready timeout", ["trial", "repo={repo}", "trial.ready_timeout_s=nan"], "ready_timeout_s"),
    ("infinite ready timeout", ["trial", "repo={repo}", "trial.ready_timeout_s=inf"],
     "ready_timeout_s"),
    ("negative grace", ["trial", "repo={repo}", "trial.grace_s=-1"], "grace_s"),
    ("negative warm-up", ["trial", "repo={repo}", "bench.warmup_requests=-1"], "warmup_requests"),
    ("negative restart noise", ["trial", "repo={repo}", "target.noise_restart_cv=-0.1"],
     "noise_restart_cv"),
    ("zero telemetry interval", ["trial", "repo={repo}", "trial.telemetry_interval_s=0"],
     "telemetry_interval_s"),
    ("negative request timeout", ["trial", "repo={repo}", "bench.request_timeout_s=-1"],
     "request_timeout_s"),
    ("NaN request timeout", ["trial", "repo={repo}", "bench.request_timeout_s=nan"],
     "request_timeout_s"),
    ("negative time scale", ["trial", "repo={repo}", "target.time_scale=-1"], "time_scale"),
    ("NaN time scale", ["trial", "repo={repo}", "target.time_scale=nan"], "time_scale"),
    ("zero tensor parallelism", ["trial", "repo={repo}", "target.tp_size=0"], "tp_size"),
    ("absurd output length", ["trial", "repo={repo}", "bench.output_len=1000000000000"],
     "output_len"),
    ("negative min effect", ["bisect", "repo={repo}", "good={s0}", "bad={s3}",
                             "experiment.params.min_effect_pct=-5"], "min_effect_pct"),
    ("non-numeric min effect", ["bisect", "repo={repo}", "good={s0}", "bad={s3}",
                                "experiment.params.min_effect_pct=abc"], "min_effect_pct"),
    ("misspelt experiment knob", ["bisect", "repo={repo}", "good={s0}", "bad={s3}",
                                  "experiment.params.min_efect_pct=5"], "min_efect_pct"),
    ("knob that is not a whole number", ["isolate", "repo={repo}", "good.commit={s0}",
                                         "bad.commit={s3}", "experiment.params.batch=2.5"],
     "whole number"),
    ("knob that is not a boolean", ["isolate", "repo={repo}", "good.commit={s0}",
                                    "bad.commit={s3}", "experiment.params.all_env=maybe"],
     "true or false"),
    ("unknown cluster kind", ["trial", "repo={repo}", "cluster.kind=bogus"], "cluster.kind"),
    ("unknown launcher", ["trial", "repo={repo}", "target=sglang", "launcher=bogus"], "launcher"),
    # Only the node can tell these; the run directory made meanwhile is removed again.
    ("clock beyond the GPUs", ["trial", "repo={repo}", "clock=locked:999999"], "SM clock"),
    ("server flag the installed server rejects",
     ["trial", "repo={repo}", "target=sglang", "launcher=sim", "target.extra_args=[--no-such-flag]"],
     "does not accept --no-such-flag"),
    ("unreachable cluster", ["trial", "repo={repo}", "cluster=ray", "cluster.address=127.0.0.1:1"],
     "cannot reach the Ray cluster at 127.0.0.1:1"),
    # No silent simulator: without SGLang the default target refuses and names the others.
    ("default target without SGLang", ["trial", "repo={repo}"], "target=sim"),
    ("default target names target=command", ["trial", "repo={repo}"], "target=command"),
    ("investigate without a reference or a range", ["investigate", "repo={repo}"],
     "reference=RUN"),
    ("investigate with good but no bad", ["investigate", "repo={repo}", "good={s0}"],
     "good=REF bad=REF"),
    ("investigate against a missing run", ["investigate", "repo={repo}", "reference=nope"],
     "no run"),
    ("sweep in the bisect's direction words", ["sweep", "repo={repo}", "space=nccl_quick",
                                              "direction=up"], "maximize"),
    ("cfg of hydra", ["trial", "--cfg", "hydra"], "--cfg job"),
    # Hydra's grammar is larger than sleuth's: no key added, no group deleted, no key twice,
    # no Hydra runtime setting (the compose API would ignore it without a word).
    ("unknown key added with +", ["trial", "repo={repo}", "+foo=bar"], "'+foo=bar'"),
    ("unknown key added with ++", ["trial", "repo={repo}", "++foo=bar"], "'++foo=bar'"),
    ("group deleted", ["trial", "repo={repo}", "~bench"], "'~bench'"),
    ("key given twice", ["trial", "repo={repo}", "commit=HEAD", "commit={s0}"],
     "commit is given twice ('commit=HEAD' and 'commit="),
    ("env key given twice", ["trial", "repo={repo}", "env.NCCL_PROTO=LL", "env.NCCL_PROTO=LL128"],
     "env.NCCL_PROTO is given twice"),
    ("hydra runtime setting", ["trial", "repo={repo}", "hydra.run.dir=X"], "'hydra.run.dir=X'"),
    # Hydra's config groups as much as its settings: the compose API ignores them all.
    ("hydra launcher group", ["trial", "repo={repo}", "hydra/launcher=basic"],
     "'hydra/launcher=basic': sleuth composes its configuration with Hydra's compose API"),
    ("hydra sweeper group", ["trial", "repo={repo}", "hydra/sweeper=basic"], "hydra/sweeper"),
    ("hydra logging group", ["trial", "repo={repo}", "hydra/job_logging=disabled"],
     "hydra/job_logging"),
    ("hydra group at a package", ["trial", "repo={repo}", "hydra/launcher@hydra.x=basic"],
     "runtime settings or groups"),
    # A pasted blob is shown by its ends, not echoed back whole.
    ("a 100,000-character key", ["trial", "repo={repo}", "a" * 100_000 + "=1"],
     "(100,000 characters) is not a setting"),
    ("a 100,000-character value", ["trial", "repo={repo}", "commit=" + "b" * 100_000],
     "b (100,000 characters)': no such commit"),
    ("env value with a newline", ["trial", "repo={repo}", "env.NCCL_DEBUG='INFO\nX=1'"],
     "control character"),
    ("isolate env value with a tab", ["isolate", "repo={repo}", "good.commit={s0}",
                                      "bad.commit={s3}", "bad.env.NCCL_DEBUG='IN\tFO'"],
     "bad.env.NCCL_DEBUG"),
    # The server under test listens on loopback unless asked otherwise, explicitly.
    ("server on every interface", ["trial", "repo={repo}", "target.host=0.0.0.0"],
     "target.allow_remote=true"),
    ("server on a network address", ["trial", "repo={repo}", "target.host=10.0.0.1"],
     "target.host=10.0.0.1"),
]

# Commands that run trials: their cases name target=sim, except those about the default.
RUNS_TRIALS = ("trial", "bisect", "compare", "isolate", "sweep", "investigate")
DEFAULT_TARGET = {"default target without SGLang", "default target names target=command"}
# Cases judged on the nodes: they start Ray (the session's instance, to keep this quick).
AT_LAUNCH = {"clock beyond the GPUs", "server flag the installed server rejects"}
# Cases that need a process where Ray is not running yet: run through the real entry point.
FRESH_PROCESS = {"unreachable cluster"}
# Cases run against a runs_dir that does not exist yet: nothing at all may appear, not even the
# worktree cache or a node's state directory (the shared one may hold both from other cases).
FRESH_RUNS_DIR = {"patch does not apply", "patch that is not a patch", "empty patch",
                  "patch outside the directory", "unreadable patch",
                  "isolate patch that is not a patch", "clock beyond the GPUs"}


@pytest.mark.parametrize("name, argv, needle", [c for c in CASES if c[0] not in AT_LAUNCH],
                         ids=[c[0] for c in CASES if c[0] not in AT_LAUNCH])
def test_bad_input(world, capsys, monkeypatch, tmp_path, ray_starts, name, argv, needle):
    _refused(world, capsys, monkeypatch, tmp_path, name, argv, needle, ray_starts)


@pytest.mark.parametrize("name, argv, needle", [c for c in CASES if c[0] in AT_LAUNCH],
                         ids=[c[0] for c in CASES if c[0] in AT_LAUNCH])
def test_bad_input_found_at_launch(ray_session, world, capsys, monkeypatch, tmp_path, name,
                                   argv, needle):
    _refused(world, capsys, monkeypatch, tmp_path, name, argv, needle)


def _refused(world, capsys, monkeypatch, tmp_path, name, argv, needle, ray_starts=None):
    """`ray_starts` (None for the cases only a node can judge): the controller's attempts to
    start Ray, which must stay none."""
    if name in DEFAULT_TARGET and importlib.util.find_spec("sglang") is not None:
        pytest.skip("SGLang is installed here: the default target can run")
    if name == "unreadable patch" and os.access(world["locked"], os.R_OK):
        pytest.skip("this user reads any file (root): no unreadable patch to give")
    runs = tmp_path / "fresh-runs" if name in FRESH_RUNS_DIR else world["runs"]
    fill = {"repo": world["repo"], "base": world["base"], "runs": world["runs"],
            "locked": world["locked"],
            "side": world["side"], **{f"s{i}": s for i, s in enumerate(world["shas"])}}
    args = [a.format(**fill) for a in argv]
    if args[0] not in ("frobnicate", "scenario") and "--config-dir" not in args:
        args.append(f"runs_dir={runs}")
    if args[0] in RUNS_TRIALS and not any(a.startswith("target=") for a in args) \
            and name not in DEFAULT_TARGET:
        args.append("target=sim")  # the cases mean the simulated node (the default is SGLang)
    monkeypatch.chdir(world["base"])
    before = _tree(world["base"])
    if name in FRESH_PROCESS:
        done = subprocess.run([sys.executable, "-m", "orchestrator", *args], cwd=world["base"],
                              capture_output=True, text=True, timeout=120)
        code, err = done.returncode, done.stderr.strip()
    else:
        with pytest.raises(SystemExit) as exc:
            main(args)
        code, err = exc.value.code, capsys.readouterr().err.strip()
    assert code == 2, name
    assert not ray_starts, "refused only after the controller began to start Ray"
    assert len(err.splitlines()) == 1, err
    assert err.startswith("sleuth: error: ") and needle in err, err
    assert len(err) < 2048, f"{len(err)} characters"  # a line a person reads
    after = _tree(world["base"])
    # Nothing written, nothing damaged. The worktree cache may hold prepared checkouts and the
    # nodes their own state (`.nodes/`: the sim's GPU state, the node lock), both kept across
    # runs by design; but no lock file and no half-made worktree is left in the cache.
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)
               and "/.cache/" not in f"/{k}" and "/.nodes/" not in f"/{k}"}
    assert not changed, changed
    assert not (world["base"] / "x").exists() and not (world["base"] / "elsewhere").exists()
    if name in FRESH_RUNS_DIR:
        assert not runs.exists(), sorted(str(p.relative_to(runs)) for p in runs.rglob("*"))
    cache = world["runs"] / ".cache"
    assert not [p for p in cache.rglob("*") if p.suffix == ".lock" or p.name.startswith(".tmp-")]
