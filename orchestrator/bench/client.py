"""The built-in benchmark client: a fixed, seeded request set sent over SGLang's `/generate`.

Why our own client and not `sglang.bench_serving` by default: it needs no GPU-side packages, it
runs against the sim and SGLang alike, and it classifies failures (a stalled stream is `hung`,
a dropped connection is a crash) instead of folding them into a slow number. Latencies follow
`bench_serving`'s definitions: TTFT = first chunk carrying tokens, ITL = gap between chunks,
TPOT = (latency - TTFT) / (output tokens - 1), output throughput = output tokens / wall time.

All durations are divided by `time_scale` (1.0 for real servers): the simulated node sleeps
modeled time x scale, so this puts its numbers back in modeled units.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import httpx


class BenchError(Exception):
    """A repetition could not be measured. `kind` is `hung`, `connection` or `http`."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class RequestSpec:
    input_ids: tuple[int, ...]
    max_new_tokens: int


@dataclass(frozen=True)
class RequestRecord:
    ttft_s: float
    latency_s: float
    itls_s: tuple[float, ...]
    completion_tokens: int
    meta_info: dict


def make_requests(n: int, input_len: int, output_len: int, seed: int) -> list[RequestSpec]:
    """The same prompts for every repetition and every candidate: only the server varies."""
    rng = random.Random(seed)
    return [
        RequestSpec(tuple(rng.randrange(100, 30000) for _ in range(input_len)), output_len)
        for _ in range(n)
    ]


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without importing numpy."""
    xs = sorted(values)
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


async def _one_request(
    client: httpx.AsyncClient, base_url: str, spec: RequestSpec, scale: float
) -> RequestRecord:
    payload = {
        "input_ids": list(spec.input_ids),
        "sampling_params": {
            "max_new_tokens": spec.max_new_tokens,
            "temperature": 0.0,
            "ignore_eos": True,
        },
        "stream": True,
    }
    start = time.perf_counter()
    first = None
    last = start
    itls: list[float] = []
    meta: dict = {}
    tokens = 0
    async with client.stream("POST", f"{base_url}/generate", json=payload) as resp:
        if resp.status_code != 200:
            body = (await resp.aread()).decode(errors="replace")[:200]
            raise BenchError("http", f"/generate returned HTTP {resp.status_code}: {body}")
        async for line in resp.aiter_lines():
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            now = time.perf_counter()
            meta = chunk.get("meta_info", meta)
            new_tokens = int(meta.get("completion_tokens", tokens))
            if new_tokens > tokens:
                if first is None:
                    first = now
                else:
                    itls.append((now - last) / scale)
                last = now
                tokens = new_tokens
    end = time.perf_counter()
    if first is None or tokens == 0:
        raise BenchError("http", "stream ended without any output tokens")
    return RequestRecord((first - start) / scale, (end - start) / scale, tuple(itls), tokens, meta)


async def _run(
    base_url: str,
    requests: Sequence[RequestSpec],
    concurrency: int,
    timeout_s: float,
    scale: float,
) -> tuple[list[RequestRecord], float]:
    # `timeout_s` bounds the wait for any single chunk (a stalled stream = hung server), and
    # the whole repetition is bounded too, so nothing can wait forever.
    timeout = httpx.Timeout(timeout_s, connect=min(timeout_s, 10.0))
    sem = asyncio.Semaphore(max(1, concurrency))
    async with httpx.AsyncClient(timeout=timeout, trust_env=False) as client:

        async def guarded(spec: RequestSpec) -> RequestRecord:
            async with sem:
                return await _one_request(client, base_url, spec, scale)

        start = time.perf_counter()
        tasks = [asyncio.ensure_future(guarded(s)) for s in requests]
        try:
            done = await asyncio.wait_for(
                asyncio.gather(*tasks), timeout=timeout_s * max(1, len(requests))
            )
        except BaseException:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            raise
        return list(done), (time.perf_counter() - start) / scale


def run_repetition(
    base_url: str,
    requests: Sequence[RequestSpec],
    *,
    concurrency: int = 1,
    timeout_s: float = 60.0,
    time_scale: float = 1.0,
) -> dict[str, float]:
    """Send `requests` and return client metrics (ms, tok/s) in the server's time units."""
    try:
        records, duration = asyncio.run(_run(base_url, requests, concurrency, timeout_s, time_scale))
    except (httpx.ReadTimeout, httpx.PoolTimeout, TimeoutError) as exc:
        raise BenchError("hung", f"no data from the server for {timeout_s:g}s ({type(exc).__name__})") from exc
    except (httpx.TransportError, httpx.RemoteProtocolError) as exc:
        raise BenchError("connection", f"connection to the server failed: {type(exc).__name__}: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise BenchError("http", f"malformed stream chunk: {exc}") from exc
    return summarize(records, duration)


def summarize(records: Sequence[RequestRecord], duration_s: float) -> dict[str, float]:
    ttft = [r.ttft_s * 1000 for r in records]
    itl = [x * 1000 for r in records for x in r.itls_s]
    tpot = [
        (r.latency_s - r.ttft_s) * 1000 / (r.completion_tokens - 1)
        for r in records
        if r.completion_tokens > 1
    ]
    tokens = sum(r.completion_tokens for r in records)
    out = {
        "output_throughput": tokens / duration_s if duration_s > 0 else float("nan"),
        "completed": float(len(records)),
        "output_tokens": float(tokens),
        "ttft_ms_p50": percentile(ttft, 50),
        "ttft_ms_p90": percentile(ttft, 90),
        "itl_ms_p50": percentile(itl, 50),
        "itl_ms_p90": percentile(itl, 90),
        "tpot_ms_p50": percentile(tpot, 50),
        "tpot_ms_p90": percentile(tpot, 90),
    }
    accept = meta_accept_length(records)
    if accept is not None:
        out["accept_len"] = accept
    return out


def meta_accept_length(records: Sequence[RequestRecord]) -> float | None:
    """Accept length of the repetition from the finished requests' `meta_info`: all completion
    tokens over all verify passes (`spec_verify_ct`), the per-request `spec_accept_length`
    pooled by weight. It covers every request of the repetition, unlike the server's
    `avg_spec_accept_length`, which SGLang only updates once per decode-log window."""
    pairs = [(r.completion_tokens, int(r.meta_info["spec_verify_ct"])) for r in records
             if isinstance(r.meta_info.get("spec_verify_ct"), int) and r.meta_info["spec_verify_ct"] > 0]
    if pairs:
        return sum(t for t, _ in pairs) / sum(c for _, c in pairs)
    ratios = [float(r.meta_info["spec_accept_length"]) for r in records
              if r.meta_info.get("spec_accept_length") is not None]
    return statistics.fmean(ratios) if ratios else None
