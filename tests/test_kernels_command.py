"""`sleuth kernels then=... now=...`: every command docs/kernels.md shows, run as written through
the installed `sleuth` in a shell, on real-format traces (CPU torch 2.13 traces, relabelled
with device events); bad input refused in one line with exit 2 and nothing written; a CPU-only
pair says "no device time"; how files group into restarts (SGLang's per-rank and per-stage
names)."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.commands.kernels import load_side
from tests.kineto_traces import TORCH_CPU, KinetoTrace, relabel, torch_cpu, write_doc

ROOT = Path(__file__).resolve().parents[1]
SLEUTH_BIN = Path(sys.executable).parent  # the installed console script lives beside python


def _doc_commands() -> list[str]:
    text = (ROOT / "docs" / "kernels.md").read_text()
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    return [line.strip() for b in blocks for line in b.splitlines()
            if line.strip().startswith("sleuth kernels")]


def _traces(where: Path) -> Path:
    """traces/fast and traces/slow (relabelled CPU torch traces, 3 restarts each), and
    traces/cpu-fast, traces/cpu-slow (the same traces as recorded: no device time)."""
    for side in ("fast", "slow"):
        (where / "traces" / side).mkdir(parents=True)
        (where / "traces" / f"cpu-{side}").mkdir()
        for i in range(3):
            write_doc(relabel(torch_cpu(side, i)),
                      where / "traces" / side / f"{side}-{i}.trace.json.gz")
            (where / "traces" / f"cpu-{side}" / f"{side}-{i}.trace.json.gz").write_bytes(
                (TORCH_CPU / f"{side}-{i}.trace.json.gz").read_bytes())
    return where


def _sh(command: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{SLEUTH_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _run_dir(out: str) -> Path:
    return Path(re.search(r"^run directory: (.+)$", out, re.M).group(1))


@pytest.mark.e2e
def test_a_cpu_only_pair_says_no_device_time(tmp_path):
    where = _traces(tmp_path)
    done = _sh("sleuth kernels then=traces/cpu-fast now=traces/cpu-slow", where)
    assert done.returncode == 3, done.stderr
    assert "kernels: the traces hold no device time:" in done.stdout
    assert "no kernel family moved" not in done.stdout
    run_dir = _run_dir(done.stdout)
    assert "the traces hold no device time" in (run_dir / "report.md").read_text()
    assert json.loads((run_dir / "findings.json").read_text())["verdict"] == "no_device_time"


@pytest.mark.e2e
@pytest.mark.parametrize(("args", "says"), [
    ("then=traces/missing now=traces/slow", "then=traces/missing: no such file or directory"),
    ("then=traces/empty-dir now=traces/slow", "holds no trace file"),
    ("then=traces/not-a-trace.json now=traces/slow", "not a Chrome trace"),
    ("then=traces/empty.trace.json.gz now=traces/slow", "an empty profile"),
    ("now=traces/slow", "kernels needs both sides"),
    ("then=traces/fast now=traces/slow mode=decode", "mode=decode: not in every trace"),
    ("then=traces/fast now=traces/slow mode=verify", "not a forward mode"),
])  # fmt: skip
def test_bad_input_is_one_line_exit_2_and_nothing_written(tmp_path, args, says):
    where = _traces(tmp_path)
    (where / "traces" / "empty-dir").mkdir()
    (where / "traces" / "not-a-trace.json").write_text('{"rows": []}')
    (where / "traces" / "empty.trace.json.gz").write_bytes(
        (TORCH_CPU / "empty-export.trace.json.gz").read_bytes())
    done = _sh(f"sleuth kernels {args}", where)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1 and says in done.stderr, done.stderr
    assert not (where / "runs").exists()


def test_sglang_rank_and_stage_files_group_into_restarts(tmp_path):
    """SGLang writes `{id}-TP-{rank}[-{STAGE}].trace.json.gz`: one restart per profile id, rank
    0 kept, its EXTEND and DECODE files merged; any other file is a restart of its own."""
    def trace(ms: float) -> KinetoTrace:
        t = KinetoTrace()
        t.step("step[DECODE bs=1]", 0, 5_000)
        t.kernel("BatchDecodeWithPagedKVCacheKernel", 100, ms * 1000)
        return t

    files = []
    for pid, stage in (("p1", ""), ("p2", "-EXTEND"), ("p2", "-DECODE")):
        for rank in (0, 1):
            files.append(trace(1.0 + rank).write(tmp_path / f"{pid}-TP-{rank}{stage}.trace.json.gz"))
    files.append(trace(1.0).write(tmp_path / "other.pt.trace.json.gz"))
    side = load_side("then", tuple(files))
    assert len(side.profiles) == 3  # p1, p2 (two stages merged), other
    assert len(side.files) == 4 and all("-TP-1" not in f for f in side.files)
    assert "rank 0 kept" in side.note
    merged = next(p for p in side.profiles if p.passes.get("decode") == 2)
    assert merged.pass_ms("decode") == pytest.approx(1.0)  # rank 0's 1 ms, not rank 1's 2 ms


def test_traces_of_several_torch_ranks_keep_the_lowest_rank(tmp_path):
    def ranked(rank: int, path: Path) -> Path:
        doc = KinetoTrace().step("ProfilerStep#1", 0, 100).kernel("ampere_sgemm_128x64_tn",
                                                                  10, 50).doc()
        doc["distributedInfo"] = {"rank": rank, "world_size": 2}
        path.write_bytes(gzip.compress(json.dumps(doc).encode()))
        return path

    side = load_side("now", (ranked(0, tmp_path / "rank-0.json.gz"),
                             ranked(1, tmp_path / "rank-1.json.gz")))
    assert len(side.profiles) == 1 and "rank 0's kept" in side.note
