"""What differs between SGLang releases, as far as launching and measuring a server goes.

Every cut-over below was read from the released wheels' own source on PyPI (`sglang==X`,
`python/sglang/srt/server_args.py`, `entrypoints/http_server.py`, the metrics collector and the
scheduler's log code), not from memory:

- `--cuda-graph-max-bs`: the only spelling up to 0.5.13. 0.5.14 split CUDA-graph settings per
  phase (`--cuda-graph-max-bs-decode`, `--cuda-graph-max-bs-prefill`,
  `--cuda-graph-backend-{decode,prefill}`) and kept the old name as a deprecated alias of
  `--cuda-graph-max-bs-decode` through 0.5.19; 0.5.20 removed it (argparse then refuses it as
  an ambiguous prefix of the two new flags).
- `--disable-cuda-graph`: plain flag up to 0.5.13, a deprecated spelling of
  `--cuda-graph-backend-{decode,prefill}=disabled` from 0.5.14.
- `/server_info`: absent in 0.5.5, present in 0.5.9 (`/get_server_info` kept as a deprecated
  alias in 0.5.9 .. 0.5.23). Older releases only have `/get_server_info`. Its
  `internal_states[i].avg_spec_accept_length` is cumulative since start or the last
  `/flush_cache`.
- Per-phase device time: 0.5.9 and 0.5.10 export `sglang:gpu_execution_seconds_total` with
  scheduler-level categories (`forward_decode` covers a whole draft+verify step), 0.5.11 renamed
  it `sglang:forward_execution_seconds_total`; per-forward categories such as `target_verify`
  come with the model-runner timers. `sglang:spec_verify_calls_total` first appears in 0.5.13;
  it counts per request (each finished request adds its verify count), so verify time per pass
  divides by the decode passes of `sglang:cuda_graph_passes_total` (0.5.9 has it too). All exist
  only with `--enable-metrics` and, for the seconds, `SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`.
- `python -m sglang.bench_serving` became a deprecation shim for `sglang.benchmark.serving` in
  0.5.15.
- Scheduler log: `Decode batch. ` up to 0.5.1 (0.4.6 has no `cuda graph:` field, 0.4.10 and
  0.5.1 do), `Decode batch, ` (optionally `Decode batch [iter], `) by 0.5.5; 0.5.9 adds
  `accept rate:`; 0.5.23 appends `fwd occupancy: ...%` when the device timer is on. Fields are
  parsed by name (orchestrator/bench/sglang_log.py), so their order does not matter.

When the installed `launch_server --help` is available it is the authority (a patched fork may
differ from its version number); the version table is the fallback when it is not.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# Releases where a difference first appears (see the module docstring for the evidence).
CUDA_GRAPH_SPLIT = (0, 5, 14)
SERVER_INFO_ADDED = (0, 5, 9)
VERIFY_CALLS_ADDED = (0, 5, 13)
BENCHMARK_PACKAGE_ADDED = (0, 5, 15)

# The newest release these facts were checked against: an unknown version is assumed to be
# at least this new (a fresh checkout of SGLang's main branch usually is).
NEWEST_CHECKED = (0, 5, 23)


@dataclass(frozen=True)
class SglangFeatures:
    """The interface differences the adapter acts on, for one SGLang build."""

    version: tuple[int, int, int] | None
    # Per-phase CUDA-graph flags (`--cuda-graph-max-bs-decode`, `--cuda-graph-backend-*`).
    cuda_graph_per_phase: bool
    # `/server_info` first, then the deprecated `/get_server_info` (tried in this order).
    server_info_paths: tuple[str, ...]
    # The release exports per-phase seconds and verify calls (both needed for verify_ms);
    # informational: the adapter computes verify_ms whenever the counters are there.
    verify_ms_from_metrics: bool
    bench_serving_module: str
    source: str  # "help", "version" or "default": what these facts were derived from

    def cuda_graph_max_bs_args(self, value: int) -> list[str]:
        flag = "--cuda-graph-max-bs-decode" if self.cuda_graph_per_phase else "--cuda-graph-max-bs"
        return [flag, str(int(value))]

    def disable_cuda_graph_args(self) -> list[str]:
        if self.cuda_graph_per_phase:
            return ["--cuda-graph-backend-decode", "disabled",
                    "--cuda-graph-backend-prefill", "disabled"]
        return ["--disable-cuda-graph"]


def features_for_version(version: tuple[int, int, int] | None, source: str = "version") -> SglangFeatures:
    """Facts from the version table; an unknown version counts as the newest checked one."""
    v = version or NEWEST_CHECKED
    return SglangFeatures(
        version=version,
        cuda_graph_per_phase=v >= CUDA_GRAPH_SPLIT,
        server_info_paths=(("/server_info", "/get_server_info") if v >= SERVER_INFO_ADDED
                           else ("/get_server_info",)),
        verify_ms_from_metrics=v >= VERIFY_CALLS_ADDED,
        bench_serving_module=("sglang.benchmark.serving" if v >= BENCHMARK_PACKAGE_ADDED
                              else "sglang.bench_serving"),
        source=source if version else "default",
    )


# A flag as argparse prints it: `--tp-size TP_SIZE, --tensor-parallel-size TP_SIZE`.
_HELP_FLAG = re.compile(r"(?<![\w-])(--[A-Za-z0-9][A-Za-z0-9_-]*)")


def help_flags(help_text: str) -> frozenset[str]:
    """Every `--flag` that `launch_server --help` mentions (option lines and prose alike).

    Mentions in prose can only make the check more lenient, never reject a valid flag."""
    return frozenset(_HELP_FLAG.findall(help_text))


def features_from_help(flags: Iterable[str], version: tuple[int, int, int] | None) -> SglangFeatures:
    """The version's facts, corrected by what this build's parser actually accepts."""
    accepted = frozenset(flags)
    base = features_for_version(version, source="help")
    per_phase = "--cuda-graph-max-bs-decode" in accepted
    if not per_phase and "--cuda-graph-max-bs" not in accepted:
        per_phase = base.cuda_graph_per_phase  # neither spelling listed: trust the version
    return SglangFeatures(
        version=version,
        cuda_graph_per_phase=per_phase,
        server_info_paths=base.server_info_paths,
        verify_ms_from_metrics=base.verify_ms_from_metrics,
        bench_serving_module=base.bench_serving_module,
        source="help",
    )


def flags_in(argv: Sequence[str]) -> list[str]:
    """The `--flag` names in a command line, in order (`--x=1` counts as `--x`)."""
    return [a.split("=", 1)[0] for a in argv if a.startswith("--") and len(a) > 2]


def unknown_flag(argv: Sequence[str], accepted: Iterable[str]) -> str | None:
    """One line naming the first flag of `argv` that the server does not accept, or None.

    Matching is exact: argparse would also take an unambiguous prefix, but a prefix that is
    unambiguous today becomes ambiguous when a release adds a flag (that is exactly how 0.5.20
    broke `--cuda-graph-max-bs`), so sleuth only passes full names."""
    known = frozenset(accepted)
    for flag in flags_in(argv):
        if flag not in known:
            close = difflib.get_close_matches(flag, sorted(known), n=1, cutoff=0.75)
            hint = f" (did you mean {close[0]}?)" if close else ""
            return f"{flag}{hint}"
    return None
