"""`target=command` with a benchmark that writes a torch profiler trace (real git repo, real
processes, real local Ray, real SQLite): the trace named in SLEUTH_PROFILE_TRACE is kept per
trial, and the two commits' traces give the same kernel table as an SGLang server's would.

The bench is a stand-in for a torch script (no GPU here): it writes what
`torch.profiler.profile(...).export_chrome_trace(path)` writes, with `ProfilerStep#N` spans from
`prof.step()`, and kernel times that follow the checked-out code."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

from conftest import git

from orchestrator.cli import run as cli_run
from orchestrator.evidence import kernels as K
from orchestrator.evidence.trace import read_profile
from orchestrator.records import Outcome
from orchestrator.store import RunStore

BENCH = textwrap.dedent("""\
    import json, os, random, sys
    attn_us = float(open("attn_us.txt").read())
    rng = random.Random()
    restart = rng.gauss(1.0, 0.02)
    path = os.environ.get("SLEUTH_PROFILE_TRACE")
    if path:
        ev, ts = [], 0.0
        for step in range(5):
            kernels = [("flash_fwd_kernel", attn_us), ("sm90_xmma_gemm_bf16bf16_tn", 900.0),
                       ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 300.0)]
            start = ts
            for i, (name, us) in enumerate(kernels):
                dur = us * restart * rng.gauss(1.0, 0.01)
                ev.append({"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7,
                           "ts": ts, "dur": dur, "args": {"correlation": step * 10 + i}})
                ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel",
                           "pid": 99, "tid": 99, "ts": start + 1 + i, "dur": 1,
                           "args": {"correlation": step * 10 + i}})
                ts += dur + 5
            ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}",
                       "pid": 99, "tid": 99, "ts": start, "dur": ts - start})
            ts += 50
        json.dump({"schemaVersion": 1, "traceEvents": ev}, open(path, "w"))
    print(json.dumps({"value": attn_us / 1000 + 1.2}))
""")


def test_command_bench_trace_gives_the_kernel_table(tmp_path, ray_session):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "bench.py").write_text(BENCH)
    shas = []
    for attn in ("1000", "1400"):
        (repo / "attn_us.txt").write_text(attn)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", f"attention {attn} us")
        shas.append(git(repo, "rev-parse", "HEAD"))
    profiles = []
    for i, sha in enumerate(shas):
        code = cli_run(["trial", "target=command", f"repo={repo}", f"commit={sha}",
                        f"runs_dir={tmp_path / 'runs'}", f"run_id=r{i}", "restarts=3",
                        "target.bench=python bench.py", "trial.profile=true",
                        "bench.repetitions=1", "bench.warmup_requests=0", "trial.retries=0"])
        assert code == 0
        rows = RunStore.open(tmp_path / "runs" / f"r{i}" / "trials.db").trials()
        side = []
        for row in rows:
            assert row.outcome is Outcome.OK, row.detail
            prof = row.result.fingerprint["profile"]
            assert "error" not in prof, prof
            assert len(row.result.measurements) == 1  # the profiled run is not a repetition
            side.append(read_profile((Path(row.log_path).parent / prof["trace"]).read_bytes()))
        profiles.append(side)
    assert profiles[0][0].passes == {"step": 5}
    d = K.diff(profiles[0], profiles[1])
    assert d.top is not None and (d.top.mode, d.top.family) == ("step", "attention")
    assert d.top.ci[0] > 20  # +40% planted
    assert [r.family for r in d.movers] == ["attention"]
    table = K.table(d)
    assert re.match(r"\| step \| attention \| \(all\) \| [01]\.\d{3} \| 1\.\d{3} \| \+\d\d\.\d% \|",
                    table[2]), table[2]
    assert any("`flash_fwd_kernel`" in line for line in table)


def test_a_bench_without_a_trace_is_recorded_not_failed(tmp_path, ray_session):
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "bench.py").write_text("print(1.5)\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "bench")
    assert cli_run(["trial", "target=command", f"repo={repo}", f"runs_dir={tmp_path / 'runs'}",
                    "target.bench=python bench.py", "trial.profile=true", "bench.repetitions=1",
                    "bench.warmup_requests=0", "trial.retries=0"]) == 0
    (run_dir,) = [p for p in (tmp_path / "runs").iterdir() if not p.name.startswith(".")]
    (row,) = RunStore.open(run_dir / "trials.db").trials()
    assert row.outcome is Outcome.OK
    assert "wrote no trace" in row.result.fingerprint["profile"]["error"]
