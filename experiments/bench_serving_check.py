"""The real `sglang.benchmark.serving` client against the sim, next to sleuth's built-in client.

Runs two `sleuth trial`s on the same commit of a small sim repo (noise off, so the clients are
the only difference): one with the built-in client, one with `target.bench_client=bench_serving`
run by an interpreter that has SGLang installed. Prints each repetition's output throughput,
TPOT and accept length (with its source), the ratio of the two clients' mean throughput, and the
prompt lengths the sim prefilled for bench_serving's prompts (`--tokenize-prompt` keeps them at
exactly `bench.input_len`).

SGLang needs a tokenizer and the machine may be offline: a small word-level tokenizer is
written with the `tokenizers` package of that interpreter and passed as `--tokenizer`.

    .venv/bin/python -m experiments.bench_serving_check --sglang-python ~/sglang-venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from orchestrator.store import RunStore

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER = r"""
import sys
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast
vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, 32000)}}
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>").save_pretrained(sys.argv[1])
"""
COMMON = ["target=sglang", "launcher=sim", "target.noise_restart_cv=0", "target.noise_request_cv=0",
          "target.time_scale=0.1", "target.load_seconds=5", "bench.requests=4", "bench.input_len=128",
          "bench.output_len=64", "bench.warmup_requests=1", "trial.retries=0",
          "target.speculative_algorithm=EAGLE3", "target.speculative_num_steps=2",
          "target.speculative_eagle_topk=1", "target.speculative_num_draft_tokens=3",
          "target.tp_size=8", "target.env.HF_HUB_OFFLINE=1"]


def sim_repo(path: Path) -> str:
    path.mkdir(parents=True)
    env_git = ["-c", "user.name=check", "-c", "user.email=check@example.com"]
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    (path / "sim_profile.json").write_text("{}\n")
    subprocess.run(["git", *env_git, "-C", str(path), "add", "-A"], check=True)
    subprocess.run(["git", *env_git, "-C", str(path), "commit", "-q", "-m", "neutral"], check=True)
    return subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()


def trial(runs: Path, repo: Path, sha: str, reps: int, *extra: str) -> Path:
    out = subprocess.run([sys.executable, "-m", "orchestrator", "trial", f"repo={repo}",
                          f"commit={sha}", f"runs_dir={runs}", f"bench.repetitions={reps}",
                          *COMMON, *extra], capture_output=True, text=True, cwd=ROOT)
    if out.returncode != 0:
        sys.exit(f"trial failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    return Path(re.search(r"run directory: (\S+)", out.stdout).group(1))


def report(name: str, run_dir: Path) -> list[float]:
    (row,) = RunStore.open(run_dir / "trials.db").trials()
    trial_dir = run_dir / "trials" / str(row.id)
    sources_file = trial_dir / "measurement_sources.jsonl"
    sources = [json.loads(x) for x in sources_file.read_text().splitlines()] if sources_file.exists() else []
    print(f"{name}: trial {row.outcome.value}")
    for i, m in enumerate(row.result.measurements):
        src = sources[i]["accept_len"] if i < len(sources) else "?"
        print(f"  rep {i + 1}: output_throughput {m.metrics['output_throughput']:.2f} tok/s, "
              f"tpot p50 {m.metrics['tpot_ms_p50']:.2f} ms, verify {m.metrics.get('verify_ms', float('nan')):.2f} ms,"
              f" accept_len {m.metrics.get('accept_len', float('nan')):.3f} from {src}")
    log = Path(row.log_path).read_text()
    news = sorted({int(x) for x in re.findall(r"Prefill batch, #new-seq: 1, #new-token: (\d+)", log)})
    print(f"  prefill #new-token values seen: {news}")
    return row.result.values("output_throughput")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sglang-python", required=True)
    p.add_argument("--repetitions", type=int, default=3)
    a = p.parse_args(argv)
    version = subprocess.run([a.sglang_python, "-c", "import sglang; print(sglang.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    print(f"sglang {version} (real bench_serving client)")
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        tokenizer = tmp_path / "tokenizer"
        subprocess.run([a.sglang_python, "-c", TOKENIZER, str(tokenizer)], check=True,
                       capture_output=True)
        sha = sim_repo(tmp_path / "repo")
        ours = report("built-in client", trial(tmp_path / "runs-a", tmp_path / "repo", sha, a.repetitions))
        theirs = report("bench_serving", trial(
            tmp_path / "runs-b", tmp_path / "repo", sha, a.repetitions,
            "target.bench_client=bench_serving", f"target.python={a.sglang_python}",
            f"target.bench_serving_args=[--tokenizer,{tokenizer}]"))
    ratio = statistics.fmean(theirs) / statistics.fmean(ours)
    print(f"mean output_throughput: built-in {statistics.fmean(ours):.2f}, bench_serving "
          f"{statistics.fmean(theirs):.2f} tok/s (model time); ratio {ratio:.3f}")
    return 0 if abs(ratio - 1) <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
