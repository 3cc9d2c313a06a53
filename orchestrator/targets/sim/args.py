"""Command line of the simulated server: SGLang's flag names and defaults, plus `--sim-*`.

SGLang flags follow `python -m sglang.launch_server` of the release the sim imitates
(`--sim-sglang-version`, 0.5.23 by default, or 0.5.9; see `dialect`): the CUDA-graph flags are
the ones that differ. Every `--sim-*` flag falls back to an environment variable
`SLEUTH_SIM_<NAME>` (e.g. SLEUTH_SIM_TIME_SCALE), so an adapter that only knows SGLang's flags —
the real `sglang` target pointed at the sim — can still configure it. Precedence: flag, then
environment, then default.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from orchestrator.targets.sim.dialect import DEFAULT_VERSION, Dialect, UnknownVersion, dialect
from orchestrator.targets.sim.model import SPEC_ALGORITHMS, LaunchConfig

DEFAULT_SPEC_STEPS, DEFAULT_SPEC_TOPK, DEFAULT_SPEC_DRAFT_TOKENS = 3, 1, 4
SPEC_MAX_RUNNING_REQUESTS = 48  # SGLang caps running requests at 48 with EAGLE
DEFAULT_MAX_RUNNING_REQUESTS = 1024
SPEC_CUDA_GRAPH_MAX_BS = 32
DEFAULT_CUDA_GRAPH_MAX_BS = 160

# (flag, type, default, help) of each sim flag; env var is SLEUTH_SIM_<FLAG UPPER>.
SIM_FLAGS: tuple[tuple[str, Any, Any, str], ...] = (
    ("time-scale", float, 1.0, "wall seconds per modeled second"),
    ("seed", int, None, "noise seed (default: random)"),
    ("gpu-state", str, None, "GPU state JSON file (default: built-in healthy node)"),
    ("profile", str, "sim_profile.json", "profile file; fragments in sim_profile.d beside it"),
    ("noise-restart-cv", float, 0.02, "per-launch noise coefficient of variation"),
    ("noise-request-cv", float, 0.01, "per-forward-pass noise coefficient of variation"),
    ("drift-pct-per-hour", float, 0.0, "slow drift in %% per modeled hour"),
    ("noise-outlier-rate", float, 0.0, "probability that a launch is an outlier restart"),
    ("noise-outlier-factor", float, 3.0, "how much slower an outlier restart runs"),
    ("load-seconds", float, 20.0, "modeled model-loading time before the server is healthy"),
    ("fault", str, None, "fault spec, e.g. crash_after:3 or degrade:5,never_ready"),
    ("sglang-version", str, DEFAULT_VERSION, "SGLang release to imitate: 0.5.23 or 0.5.9"),
    ("packages", str, None, "the node's installed packages, a JSON file of name -> version"),
    ("verify-log", int, 0, "1: log the window's EAGLE verify ms after each decode-log line"
     " (custom instrumentation, as the seed's EAGLE worker printed)"),
)
GRAPH_BACKENDS = ("full", "breakable", "disabled")  # 0.5.23 --cuda-graph-backend-{decode,prefill}


def sim_env_name(flag: str) -> str:
    return "SLEUTH_SIM_" + flag.upper().replace("-", "_")


def _bool_flag(parser: argparse.ArgumentParser, name: str, help_text: str) -> None:
    parser.add_argument(name, action="store_true", help=help_text)


def _graph_flags(p: argparse.ArgumentParser, per_phase: bool) -> None:
    """The CUDA-graph flags of the imitated release (the one place 0.5.9 and 0.5.23 differ)."""
    if not per_phase:
        p.add_argument("--cuda-graph-max-bs", type=int, default=None)
        _bool_flag(p, "--disable-cuda-graph", "disable CUDA graphs")
        return
    p.add_argument("--cuda-graph-backend-decode", choices=GRAPH_BACKENDS, default=None)
    p.add_argument("--cuda-graph-backend-prefill", choices=GRAPH_BACKENDS, default=None)
    p.add_argument("--cuda-graph-max-bs-decode", type=int, default=None)
    p.add_argument("--cuda-graph-max-bs-prefill", type=int, default=None)
    _bool_flag(p, "--disable-prefill-cuda-graph",
               "Disable the prefill-phase CUDA graph (= --cuda-graph-backend-prefill=disabled).")
    _bool_flag(p, "--disable-decode-cuda-graph",
               "Disable the decode-phase CUDA graph (= --cuda-graph-backend-decode=disabled).")
    _bool_flag(p, "--disable-cuda-graph",
               "Deprecated. Use --cuda-graph-backend-{decode,prefill}=disabled instead.")


def requested_version(argv: Sequence[str] | None, env: Mapping[str, str]) -> str:
    """`--sim-sglang-version` (flag, then SLEUTH_SIM_SGLANG_VERSION, then the default), read
    before the full parse because the flags themselves depend on it."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--sim-sglang-version", default=None)
    ns, _ = pre.parse_known_args(list(argv) if argv is not None else None)
    return ns.sim_sglang_version or env.get(sim_env_name("sglang-version")) or DEFAULT_VERSION


def build_parser(version: str | None = None) -> argparse.ArgumentParser:
    d = dialect(version)
    p = argparse.ArgumentParser(
        prog="python -m orchestrator.targets.sim",
        description=f"Simulated SGLang {d.version} server (EAGLE-3 performance model).",
    )
    p.add_argument("--model-path", "--model", required=True)
    p.add_argument("--tokenizer-path", default=None)
    p.add_argument("--served-model-name", default=None)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument(
        "--tp-size", "--tensor-parallel-size", "--tp", dest="tp_size", type=int, default=1
    )
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--speculative-algorithm", type=str, default=None)
    p.add_argument("--speculative-draft-model-path", "--speculative-draft-model", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-attention-mode", choices=["prefill", "decode"], default="prefill")
    p.add_argument("--attention-backend", default=None)
    _graph_flags(p, d.per_phase_graph_flags)
    _bool_flag(p, "--disable-custom-all-reduce", "use NCCL for every all-reduce")
    _bool_flag(p, "--enable-nccl-nvls", "enable NCCL NVLS (no effect on PCIe)")
    _bool_flag(p, "--enable-metrics", "export Prometheus metrics at /metrics")
    p.add_argument("--log-level", default="info")
    p.add_argument("--log-level-http", default=None)
    p.add_argument("--decode-log-interval", type=int, default=40)
    _bool_flag(p, "--trust-remote-code", "accepted for compatibility")
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--random-seed", type=int, default=None)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--quantization", default=None)
    _bool_flag(p, "--disable-radix-cache", "disable the prefix cache")
    _bool_flag(p, "--skip-server-warmup", "skip the warm-up request")
    p.add_argument("--gc-warning-threshold-secs", type=float, default=None,
                   help="log a warning for a garbage collection longer than this")
    for flag, typ, _default, help_text in SIM_FLAGS:
        p.add_argument(
            f"--sim-{flag}", type=typ, default=None, help=f"{help_text} [{sim_env_name(flag)}]"
        )
    return p


@dataclass(frozen=True)
class SimConfig:
    """Resolved launch configuration: SGLang server args (by SGLang's field names) + sim knobs."""

    server_args: Mapping[str, Any]
    launch: LaunchConfig
    time_scale: float
    seed: int | None
    gpu_state_path: str | None
    packages_path: str | None
    profile_path: str
    noise_restart_cv: float
    noise_request_cv: float
    drift_pct_per_hour: float
    load_seconds: float
    fault: str | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    noise_outlier_rate: float = 0.0
    noise_outlier_factor: float = 3.0
    dialect: Dialect = field(default_factory=lambda: dialect(None))
    verify_log: bool = False

    @property
    def speculative(self) -> bool:
        return self.launch.speculative


class ConfigError(ValueError):
    pass


def _sim_value(
    ns: argparse.Namespace, flag: str, typ: Any, default: Any, env: Mapping[str, str]
) -> Any:
    value = getattr(ns, "sim_" + flag.replace("-", "_"))
    if value is not None:
        return value
    raw = env.get(sim_env_name(flag))
    if raw is None or raw == "":
        return default
    try:
        return typ(raw)
    except ValueError:
        raise ConfigError(f"{sim_env_name(flag)}={raw!r} is not a valid {typ.__name__}") from None


DEPRECATED_DISABLE_CUDA_GRAPH = (
    "'--disable-cuda-graph' is deprecated and will be removed in a future release. "
    "Use '--cuda-graph-backend-{decode,prefill}=disabled' instead."
)


def _graph_settings(ns: argparse.Namespace, d: Dialect, notes: list[str]) -> tuple[int | None, bool]:
    """(decode graph max batch size or None, decode graphs disabled) from either flag set."""
    if not d.per_phase_graph_flags:
        return ns.cuda_graph_max_bs, bool(ns.disable_cuda_graph)
    if ns.disable_cuda_graph:
        notes.append(DEPRECATED_DISABLE_CUDA_GRAPH)
    disabled = (ns.cuda_graph_backend_decode == "disabled" or ns.disable_decode_cuda_graph
                or ns.disable_cuda_graph)  # fmt: skip
    return ns.cuda_graph_max_bs_decode, bool(disabled)


def resolve(ns: argparse.Namespace, env: Mapping[str, str]) -> SimConfig:
    """Apply SGLang's own defaulting rules (speculative params, graph batch sizes, caps)."""
    notes: list[str] = []
    try:
        d = dialect(_sim_value(ns, "sglang-version", str, DEFAULT_VERSION, env))
    except UnknownVersion as exc:
        raise ConfigError(str(exc)) from None
    max_bs, graphs_disabled = _graph_settings(ns, d, notes)
    algo = ns.speculative_algorithm
    if algo is not None and algo.upper() not in SPEC_ALGORITHMS:
        raise ConfigError(
            f"unknown --speculative-algorithm {algo!r} (known: {', '.join(SPEC_ALGORITHMS)})"
        )
    steps = ns.speculative_num_steps if ns.speculative_num_steps is not None else DEFAULT_SPEC_STEPS
    topk = ns.speculative_eagle_topk if ns.speculative_eagle_topk is not None else DEFAULT_SPEC_TOPK
    draft = (
        ns.speculative_num_draft_tokens
        if ns.speculative_num_draft_tokens is not None
        else (steps + 1 if topk == 1 else DEFAULT_SPEC_DRAFT_TOKENS)
    )
    if algo and (steps < 1 or topk < 1 or draft < 1):
        raise ConfigError("speculative steps, topk and draft tokens must be >= 1")
    if algo and topk == 1 and draft != steps + 1:
        notes.append(
            "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
            f"speculative_eagle_topk == 1 ({draft} -> {steps + 1})"
        )
        draft = steps + 1
    if ns.tp_size < 1:
        raise ConfigError("--tp-size must be >= 1")
    if max_bs is None:
        max_bs = SPEC_CUDA_GRAPH_MAX_BS if algo else DEFAULT_CUDA_GRAPH_MAX_BS
    max_running = ns.max_running_requests
    if max_running is None:
        max_running = SPEC_MAX_RUNNING_REQUESTS if algo else DEFAULT_MAX_RUNNING_REQUESTS
    elif algo and max_running > SPEC_MAX_RUNNING_REQUESTS:
        notes.append(
            f"max_running_requests is capped at {SPEC_MAX_RUNNING_REQUESTS} with speculative decoding"
        )
        max_running = SPEC_MAX_RUNNING_REQUESTS
    launch = LaunchConfig(
        tp_size=ns.tp_size,
        speculative_algorithm=algo.upper() if algo else None,
        speculative_num_steps=steps,
        speculative_eagle_topk=topk,
        speculative_num_draft_tokens=draft,
        cuda_graph_max_bs=max_bs,
        disable_cuda_graph=graphs_disabled,
        disable_custom_all_reduce=ns.disable_custom_all_reduce,
    )
    values = {flag: _sim_value(ns, flag, typ, default, env) for flag, typ, default, _ in SIM_FLAGS}
    if values["time-scale"] <= 0:
        raise ConfigError("--sim-time-scale must be > 0")
    if ns.decode_log_interval < 1:
        raise ConfigError("--decode-log-interval must be >= 1")
    server_args = _server_args(ns, algo, steps, topk, draft, max_bs, max_running)
    if d.per_phase_graph_flags:  # 0.5.23 ServerArgs field names (see its /server_info)
        del server_args["cuda_graph_max_bs"], server_args["stream_output"]
        server_args.update({
            "cuda_graph_max_bs_decode": max_bs, "cuda_graph_max_bs_prefill": ns.cuda_graph_max_bs_prefill,
            "cuda_graph_backend_decode": "disabled" if graphs_disabled else ns.cuda_graph_backend_decode,
            "cuda_graph_backend_prefill": ns.cuda_graph_backend_prefill,
            "disable_decode_cuda_graph": graphs_disabled,
            "disable_prefill_cuda_graph": bool(ns.disable_prefill_cuda_graph),
            "disable_cuda_graph": bool(ns.disable_cuda_graph),
        })  # fmt: skip
    return SimConfig(
        server_args=server_args,
        launch=launch,
        time_scale=values["time-scale"],
        seed=values["seed"],
        gpu_state_path=values["gpu-state"],
        packages_path=values["packages"],
        profile_path=values["profile"],
        noise_restart_cv=max(0.0, values["noise-restart-cv"]),
        noise_request_cv=max(0.0, values["noise-request-cv"]),
        drift_pct_per_hour=values["drift-pct-per-hour"],
        load_seconds=max(0.0, values["load-seconds"]),
        fault=values["fault"],
        notes=tuple(notes),
        noise_outlier_rate=min(max(0.0, values["noise-outlier-rate"]), 1.0),
        noise_outlier_factor=max(values["noise-outlier-factor"], 0.01),
        dialect=d,
        verify_log=bool(values["verify-log"]),
    )


def _server_args(
    ns: argparse.Namespace,
    algo: str | None,
    steps: int,
    topk: int,
    draft: int,
    max_bs: int,
    max_running: int,
) -> dict[str, Any]:
    """`ServerArgs` as SGLang's /server_info reports it (its field names)."""
    spec = bool(algo)
    return {
        "model_path": ns.model_path,
        "tokenizer_path": ns.tokenizer_path or ns.model_path,
        "tokenizer_mode": "auto",
        "skip_tokenizer_init": False,
        "load_format": "auto",
        "trust_remote_code": ns.trust_remote_code,
        "dtype": ns.dtype,
        "kv_cache_dtype": ns.kv_cache_dtype,
        "quantization": ns.quantization,
        "context_length": ns.context_length,
        "device": "cuda",
        "served_model_name": ns.served_model_name or ns.model_path,
        "is_embedding": False,
        "host": ns.host,
        "port": ns.port,
        "mem_fraction_static": ns.mem_fraction_static or 0.85,
        "max_running_requests": max_running,
        "max_total_tokens": None,
        "chunked_prefill_size": ns.chunked_prefill_size or 8192,
        "max_prefill_tokens": 16384,
        "schedule_policy": "fcfs",
        "page_size": 1,
        "tp_size": ns.tp_size,
        "pp_size": 1,
        "dp_size": ns.dp_size,
        "stream_interval": 1,
        "stream_output": False,
        "random_seed": ns.random_seed,
        "log_level": ns.log_level,
        "log_level_http": ns.log_level_http,
        "enable_metrics": ns.enable_metrics,
        "decode_log_interval": ns.decode_log_interval,
        "speculative_algorithm": algo.upper() if algo else None,
        "speculative_draft_model_path": ns.speculative_draft_model_path,
        "speculative_num_steps": steps if spec else None,
        "speculative_eagle_topk": topk if spec else None,
        "speculative_num_draft_tokens": draft if spec else None,
        "speculative_accept_threshold_single": 1.0,
        "speculative_accept_threshold_acc": 1.0,
        "speculative_attention_mode": ns.speculative_attention_mode,
        "attention_backend": ns.attention_backend,
        "cuda_graph_max_bs": max_bs,
        "disable_cuda_graph": bool(getattr(ns, "disable_cuda_graph", False)),
        "disable_cuda_graph_padding": False,
        "disable_custom_all_reduce": ns.disable_custom_all_reduce,
        "enable_nccl_nvls": ns.enable_nccl_nvls,
        "disable_radix_cache": ns.disable_radix_cache,
        "enable_mixed_chunk": False,
        "skip_server_warmup": ns.skip_server_warmup,
        "gc_warning_threshold_secs": ns.gc_warning_threshold_secs,
        "weight_version": "default",
        "preferred_sampling_params": None,
    }


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> SimConfig:
    """Parse and resolve; argparse exits 2 on unknown flags (and, imitating 0.5.23, on the
    removed `--cuda-graph-max-bs`, an ambiguous prefix there), ConfigError on bad values."""
    env = os.environ if env is None else env
    version = requested_version(argv, env)
    try:
        parser = build_parser(version)
    except UnknownVersion as exc:
        raise ConfigError(str(exc)) from None
    return resolve(parser.parse_args(argv), env)
