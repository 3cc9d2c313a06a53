"""Bad input: one clear line on stderr, exit 2, nothing written, nothing existing damaged."""

from __future__ import annotations

import hashlib
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
    return {"base": base, "repo": repo, "shas": shas, "side": side, "runs": runs}


def _tree(path: Path) -> dict[str, str]:
    return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(path.rglob("*")) if p.is_file()}


CASES = [
    ("unknown command", ["frobnicate"], "unknown command"),
    ("unknown option", ["trial", "--bogus", "repo={repo}"], "--bogus"),
    ("malformed override", ["trial", "repo={repo}", "foo"], "foo"),
    ("unparseable override", ["trial", "repo={repo}", "commit=--x=y"], "quote"),
    ("unknown config key", ["trial", "repo={repo}", "bench.nope=1"], "nope"),
    ("wrong value type", ["trial", "repo={repo}", "nodes=many"], "nodes"),
    ("unknown target", ["trial", "repo={repo}", "target=nope"], "target"),
    ("no repo", ["trial"], "repo="),
    ("not a git repo", ["trial", "repo={base}"], "not a git"),
    ("unknown ref", ["trial", "repo={repo}", "commit=no-such-ref"], "no-such-ref"),
    ("option-like ref", ["trial", "repo={repo}", "commit='--upload-pack=touch x'"], "upload-pack"),
    ("patch missing", ["trial", "repo={repo}", "patches=[{base}/missing.patch]"], "missing.patch"),
    ("patch does not apply", ["trial", "repo={repo}", "patches=[{base}/bad.patch]"], "bad.patch"),
    ("zero repetitions", ["trial", "repo={repo}", "bench.repetitions=0"], "repetitions"),
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
]


@pytest.mark.parametrize("name, argv, needle", CASES, ids=[c[0] for c in CASES])
def test_bad_input(world, capsys, monkeypatch, name, argv, needle):
    fill = {"repo": world["repo"], "base": world["base"], "runs": world["runs"],
            "side": world["side"], **{f"s{i}": s for i, s in enumerate(world["shas"])}}
    args = [a.format(**fill) for a in argv]
    if args[0] not in ("frobnicate", "scenario") and "--config-dir" not in args:
        args.append(f"runs_dir={world['runs']}")
    monkeypatch.chdir(world["base"])
    before = _tree(world["base"])
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2, name
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("sleuth: error: ") and needle in err, err
    after = _tree(world["base"])
    # Nothing written, nothing damaged (the worktree cache may hold prepared checkouts).
    changed = {k for k in set(before) | set(after) if before.get(k) != after.get(k)
               and "/.cache/" not in f"/{k}"}
    assert not changed, changed
    assert not (world["base"] / "x").exists()
