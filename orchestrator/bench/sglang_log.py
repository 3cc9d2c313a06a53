"""Parse SGLang's scheduler log lines (decode and prefill batches).

Formats (from SGLang's scheduler source):
- 0.5.9:  `Decode batch, #running-req: 1, #token: 310, token usage: 0.00, accept len: 2.10,
  accept rate: 0.70, cuda graph: True, gen throughput (token/s): 94.12, #queue-req: 0`
- 0.5.23 appends `, fwd occupancy: 97.12%, fwd+idle occupancy: 99.80%` with the device timer,
  and names the graph field after the device: `cuda graph`, or `cpu graph` / `npu graph` /
  `musa graph` (metrics reporter, `_graph_backend_label`).
- older releases wrote `Decode batch.` and some add a DP rank `Decode batch [0],`.
Fields are parsed by name, not position, because their order changed between releases.
"""

from __future__ import annotations

import re
import statistics
from dataclasses import dataclass

_DECODE = re.compile(r"Decode batch(?: \[\d+\])?[.,] (?P<fields>.*)$")
_PREFILL = re.compile(r"Prefill batch(?: \[\d+\])?[.,] (?P<fields>.*)$")
_GRAPH_KEY = re.compile(r"[a-z]+ graph")  # cuda graph, cpu graph, npu graph, musa graph
_FIELD = re.compile(r"(?P<key>[#A-Za-z][#A-Za-z _\-()/]*?): (?P<value>[^,]+)")


def _fields(text: str) -> dict[str, str]:
    return {m.group("key").strip(): m.group("value").strip() for m in _FIELD.finditer(text)}


@dataclass(frozen=True)
class DecodeLine:
    running_req: int | None
    accept_len: float | None
    cuda_graph: bool | None
    gen_throughput: float | None


def _num(fields: dict[str, str], key: str) -> float | None:
    try:
        return float(fields[key])
    except (KeyError, ValueError):
        return None


def parse_decode(line: str) -> DecodeLine | None:
    m = _DECODE.search(line)
    if not m:
        return None
    f = _fields(m.group("fields"))
    graph = next((v for k, v in f.items() if _GRAPH_KEY.fullmatch(k)), None)
    running = _num(f, "#running-req")
    return DecodeLine(
        running_req=int(running) if running is not None else None,
        accept_len=_num(f, "accept len"),
        cuda_graph=None if graph is None else graph == "True",
        gen_throughput=_num(f, "gen throughput (token/s)"),
    )


@dataclass(frozen=True)
class PrefillLine:
    new_seq: int | None
    new_tokens: int | None
    cached_tokens: int | None
    input_throughput: float | None


def parse_prefill(line: str) -> PrefillLine | None:
    """A `Prefill batch` line (0.5.9 and 0.5.23 order their fields differently: by name)."""
    m = _PREFILL.search(line)
    if not m:
        return None
    f = _fields(m.group("fields"))

    def count(key: str) -> int | None:
        value = _num(f, key)
        return int(value) if value is not None else None

    return PrefillLine(count("#new-seq"), count("#new-token"), count("#cached-token"),
                       _num(f, "input throughput (token/s)"))


def log_metrics(text: str) -> dict[str, float]:
    """Metrics from a slice of server log: share of decode batches in a CUDA graph, mean accept
    length and generation throughput as the server logged them."""
    lines = [d for d in map(parse_decode, text.splitlines()) if d is not None]
    out: dict[str, float] = {}
    graphs = [d.cuda_graph for d in lines if d.cuda_graph is not None]
    if graphs:
        out["cuda_graph_share"] = sum(graphs) / len(graphs)
    accepts = [d.accept_len for d in lines if d.accept_len is not None]
    if accepts:
        out["log_accept_len"] = statistics.fmean(accepts)
    gens = [d.gen_throughput for d in lines if d.gen_throughput is not None]
    if gens:
        out["log_gen_throughput"] = statistics.fmean(gens)
    return out
