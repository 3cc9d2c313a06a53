"""One benchmark repetition against an SGLang server (real or simulated), and where each of its
numbers came from.

Shared by the `sglang` and `sim` targets, because what SGLang reports (checked against 0.5.23's
source) needs the same care whichever client sends the requests:

- Before the repetition the prefix cache is flushed (`/flush_cache`): every repetition starts
  cold, and the server's accept-length totals start from zero.
- Phase times come from `/metrics` scrapes bracketing the repetition (`prometheus.phases`).
  When the draft model ran outside its CUDA graph its extend pass is filed under `extend`
  together with every prefill; then the same prompts are sent once more with
  `max_new_tokens=1` (after the second scrape, so outside the measurement) to measure the
  prefill part on its own, and draft_ms is the rest.
- Accept length has three sources that differ in scope: the requests' `meta_info` (built-in
  client; every request of the repetition), the Prometheus counters that sum the same
  `meta_info` fields (any client: generation tokens / verify calls), and `/server_info`'s
  `avg_spec_accept_length`, which SGLang adds to only once per decode-log window
  (`--decode-log-interval`, 40 batches): absent for a repetition shorter than one window, and
  without the last partial one. `accept_len` takes them in that order, so it never switches
  scope with the repetition's length; each source is also kept under its own name, and the
  choice is written to `measurement_sources.jsonl` in the trial directory.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import httpx

from orchestrator.bench import prometheus
from orchestrator.bench.client import RequestSpec, run_repetition
from orchestrator.bench.sglang_log import log_metrics

SOURCES_FILE = "measurement_sources.jsonl"
ACCEPT_SOURCES = (
    ("meta_accept_len", "meta_info (the repetition's finished requests)"),
    ("counter_accept_len", "prometheus generation_tokens / spec_verify_calls (sums of meta_info)"),
    ("server_accept_len", "/server_info avg_spec_accept_length (full decode-log windows only)"),
)


def flush_cache(client: httpx.Client, base_url: str) -> bool:
    try:
        r = client.post(f"{base_url}/flush_cache", timeout=30.0)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


# What `/server_info` holds beside `ServerArgs`: the scheduler's state and sizes, the release.
_NOT_SETTINGS = frozenset({"internal_states", "version", "max_total_num_tokens",
                           "max_req_input_len", "status"})


def settings_of(info: Mapping | None) -> dict | None:
    """The server's settings from its `/server_info` (SGLang puts `ServerArgs` at the top
    level), secrets redacted; None without an answer."""
    from orchestrator.system.redact import redact_config

    if not isinstance(info, Mapping):
        return None
    return {str(k): redact_config(v, str(k)) for k, v in info.items() if k not in _NOT_SETTINGS}


def server_accept_length(info: Mapping) -> float | None:
    """Mean accept length over the server's data-parallel ranks (`internal_states`)."""
    states = info.get("internal_states") or []
    values = [float(s["avg_spec_accept_length"]) for s in states
              if isinstance(s, Mapping) and s.get("avg_spec_accept_length") is not None]
    return sum(values) / len(values) if values else None


def prefill_probe(client: httpx.Client, base_url: str, requests: list[RequestSpec], *,
                  concurrency: int, timeout_s: float, time_scale: float,
                  scrape: Callable[[str], dict | None]) -> float | None:
    """`extend` seconds per computed prompt token, from the same prompts prefilled alone."""
    if not flush_cache(client, base_url):
        return None  # a warm cache would make prefill look free
    before = scrape(base_url)
    run_repetition(base_url, [RequestSpec(r.input_ids, 1) for r in requests],
                   concurrency=concurrency, timeout_s=timeout_s, time_scale=time_scale)
    after = scrape(base_url)
    if before is None or after is None:
        return None
    return prometheus.prefill_seconds_per_token(prometheus.deltas(before, after))


def measure(target, base_url: str, requests: list[RequestSpec], log_path: Path,
            *, server_info: Callable[[str], dict | None] | None = None) -> dict[str, float]:
    """Client metrics of one repetition plus the server's phase metrics bracketing it.

    `target` provides `http`, `benchmark`, `scrape`, `conf`, `bench` and `time_scale` (see
    `orchestrator.targets.base.Target`); `server_info` reads `/server_info`."""
    flushed = flush_cache(target.http, base_url)
    before = target.scrape(base_url)
    log_start = log_path.stat().st_size if log_path.exists() else 0
    metrics = dict(target.benchmark(base_url, requests, log_path))
    after = target.scrape(base_url)
    info = server_info(base_url) if (server_info and flushed) else None
    speculative = bool(getattr(target.settings, "speculative_algorithm", None))
    sources: dict[str, str] = {}
    if "accept_len" in metrics:
        metrics["meta_accept_len"] = metrics.pop("accept_len")
    if before is not None and after is not None:
        d = prometheus.deltas(before, after)
        per_token = None
        if d.needs_prefill_probe(speculative):
            per_token = prefill_probe(
                target.http, base_url, requests, concurrency=int(target.bench_settings.concurrency),
                timeout_s=float(target.bench_settings.request_timeout_s),
                time_scale=target.time_scale, scrape=target.scrape)
            sources["draft_ms"] = ("eager draft: (decode + extend - prefill) / decode passes;"
                                   " prefill measured by a prefill-only probe" if per_token else
                                   "absent: draft extend ran eagerly and the prefill probe failed")
        metrics.update(prometheus.phases(d, speculative=speculative, prefill_s_per_token=per_token))
        if speculative and d.verify_calls and d.generation_tokens:
            metrics["counter_accept_len"] = d.generation_tokens / d.verify_calls
        if "verify_ms" in metrics:
            sources["verify_ms"] = "target_verify device ms per verify pass (whole batch)"
        if "cuda_graph_share" in metrics:
            sources["cuda_graph_share"] = "prometheus cuda_graph_passes_total (every decode pass)"
    if log_path.exists():
        with open(log_path, "rb") as f:
            f.seek(log_start)
            from_log = log_metrics(f.read().decode(errors="replace"))
        if "cuda_graph_share" not in metrics and "cuda_graph_share" in from_log:
            sources["cuda_graph_share"] = "decode log lines (one per decode-log window)"
        for key, value in from_log.items():
            metrics.setdefault(key, value)
    server = server_accept_length(info) if info else None
    if server is not None:
        metrics["server_accept_len"] = server
    if speculative:
        chosen = next(((key, why) for key, why in ACCEPT_SOURCES if key in metrics), None)
        if chosen is not None:
            metrics["accept_len"] = metrics[chosen[0]]
        sources["accept_len"] = chosen[1] if chosen else "absent: no source reported one"
        if server is None:
            interval = getattr(target.settings, "decode_log_interval", None) or 40
            why = ("the cache flush was refused, so the server's total is not this repetition's"
                   if not flushed else "/server_info did not answer" if info is None else
                   f"the repetition was shorter than one decode-log window ({interval} batches)")
            sources["server_accept_len"] = "absent: " + why
    _record_sources(log_path.parent, sources)
    return metrics


def _record_sources(trial_dir: Path, sources: Mapping[str, str]) -> None:
    if not sources or not trial_dir.is_dir():
        return
    path = trial_dir / SOURCES_FILE
    rep = sum(1 for _ in path.open()) + 1 if path.exists() else 1
    with path.open("a") as f:
        f.write(json.dumps({"repetition": rep, **sources}) + "\n")
