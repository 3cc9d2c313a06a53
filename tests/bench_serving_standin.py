"""A stand-in for `python -m sglang.benchmark.serving` (0.5.23) where SGLang is not installed.

It measures the way the real client does for the command line sleuth builds (`--backend
sglang --dataset-name random-ids --tokenize-prompt`, sglang/benchmark/serving.py): it asks
`/model_info` for the tokenizer, sends token-id prompts of exactly `--random-input-len` to
`/generate` with `stream: true` from at most `--max-concurrency` workers, takes TTFT at the
first chunk with text, ITL as each chunk's gap over its new tokens, TPOT as (latency - TTFT) /
(output - 1), output_throughput as output tokens over the wall-clock duration of the whole
run, reads `accept_length` from `/server_info`, and appends one JSON line whose keys are the
saved 0.5.23 `result` keys. Unknown flags are refused (argparse), like the real parser; so are
flags the saved 0.5.23 source does not have.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import threading
import time
from pathlib import Path

FACTS = Path(__file__).parent / "fixtures" / "sglang_0_5_23" / "source_facts.json"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang.benchmark.serving")
    for flag in ("--backend", "--base-url", "--dataset-name", "--model", "--tokenizer"):
        p.add_argument(flag)
    for flag in ("--num-prompts", "--random-input-len", "--random-output-len", "--max-concurrency",
                 "--seed", "--warmup-requests"):
        p.add_argument(flag, type=int)
    p.add_argument("--random-range-ratio", type=float)
    p.add_argument("--output-file", required=True)
    p.add_argument("--tokenize-prompt", action="store_true")
    p.add_argument("--disable-tqdm", action="store_true")
    return p


def _get(host: str, port: int, path: str) -> dict:
    conn = http.client.HTTPConnection(host, port, timeout=30)
    try:
        conn.request("GET", path)
        return json.loads(conn.getresponse().read())
    finally:
        conn.close()


def _one(host: str, port: int, ids: list[int], out_len: int) -> dict:
    body = {"input_ids": ids, "sampling_params": {"temperature": 0.0, "max_new_tokens": out_len,
            "ignore_eos": True}, "stream": True}  # fmt: skip
    conn = http.client.HTTPConnection(host, port, timeout=60)
    st = time.perf_counter()
    ttft, last, n_prev, itl = 0.0, st, 0, []
    try:
        conn.request("POST", "/generate", json.dumps(body), {"Content-Type": "application/json"})
        resp = conn.getresponse()
        for raw in resp:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            data = json.loads(line[6:])
            now = time.perf_counter()
            n = data["meta_info"]["completion_tokens"]
            if data.get("text"):
                if ttft == 0.0:
                    ttft = now - st
                elif n > n_prev:
                    itl += [(now - last) / (n - n_prev)] * (n - n_prev)
                last, n_prev = now, n
    finally:
        conn.close()
    return {"ttft": ttft, "latency": time.perf_counter() - st, "itl": itl, "output_len": n_prev}


def main() -> int:
    a = _parser().parse_args()
    known = set(json.loads(FACTS.read_text())["bench_serving"]["flags"])
    used = {arg.split("=", 1)[0] for arg in sys.argv[1:] if arg.startswith("--")}
    if used - known:
        print(f"error: not a 0.5.23 bench_serving flag: {sorted(used - known)}", file=sys.stderr)
        return 2
    host, port = a.base_url.split("//", 1)[1].rsplit(":", 1)
    port = int(port)
    assert a.tokenizer or _get(host, port, "/model_info")["tokenizer_path"]
    rng = random.Random(a.seed)
    prompts = [[rng.randrange(0, 32000) for _ in range(a.random_input_len)] for _ in range(a.num_prompts)]
    outputs: list[dict] = []
    queue = list(prompts)
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                if not queue:
                    return
                ids = queue.pop(0)
            out = _one(host, port, ids, a.random_output_len)
            with lock:
                outputs.append(out)

    start = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(max(1, a.max_concurrency))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    duration = time.perf_counter() - start
    state = (_get(host, port, "/server_info").get("internal_states") or [{}])[0]
    ms = [1000 * x for o in outputs for x in o["itl"]]
    tpots = [1000 * (o["latency"] - o["ttft"]) / (o["output_len"] - 1) for o in outputs if o["output_len"] > 1]
    ttfts = [1000 * o["ttft"] for o in outputs]
    total_out = sum(o["output_len"] for o in outputs)
    measured = {
        "backend": a.backend, "dataset_name": a.dataset_name, "max_concurrency": a.max_concurrency,
        "random_input_len": a.random_input_len, "random_output_len": a.random_output_len,
        "random_range_ratio": a.random_range_ratio, "duration": duration, "completed": len(outputs),
        "total_input_tokens": a.random_input_len * len(outputs), "total_output_tokens": total_out,
        "request_throughput": len(outputs) / duration, "output_throughput": total_out / duration,
        "median_ttft_ms": statistics.median(ttfts), "mean_ttft_ms": statistics.fmean(ttfts),
        "median_tpot_ms": statistics.median(tpots), "median_itl_ms": statistics.median(ms),
        "median_e2e_latency_ms": statistics.median(1000 * o["latency"] for o in outputs),
        "accept_length": state.get("avg_spec_accept_length"),
    }
    result = {key: measured.get(key) for key in json.loads(FACTS.read_text())["bench_serving"]["result_keys"]}
    with open(a.output_file, "a") as f:
        f.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
