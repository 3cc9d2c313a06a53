"""Structured configuration: the dataclasses Hydra checks every composed config against.

Registered in Hydra's ConfigStore (see `register`) so that a misspelt key or a value of the wrong
type is rejected before anything runs. The YAML files under `conf/` only choose values; the
shape of the configuration lives here, in one place.

Groups (one YAML file per option under `conf/<group>/`):
  target/      the system under test: `sim` (embedded simulated SGLang node), `sglang` (a real
               SGLang server; `launcher=sim` puts the sim behind the same adapter), `command`
               (any repository with a benchmark command).
  bench/       the fixed, seeded request set each repetition sends.
  cluster/     where trials run: `local` (a Ray instance started for the run).
  experiment/  strategy tuning for the command (`trial`, `bisect`, ...).
  space/       search spaces for `sleuth sweep` (`nccl_pcie`, `spec_decode`); none by default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING


@dataclass
class TargetConf:
    """Fields every target has; each target's schema extends it."""

    name: str = MISSING
    model_path: str = ""
    host: str = "127.0.0.1"
    # Extra server flags appended verbatim (as a list, never through a shell).
    extra_args: list[str] = field(default_factory=list)
    # Argv prefix for the server (numactl, taskset, a profiler ...).
    launcher: list[str] = field(default_factory=list)
    # Environment every trial's server gets on top of the node's (candidate env comes after).
    env: dict[str, str] = field(default_factory=dict)


@dataclass
class SimTargetConf(TargetConf):
    """The embedded simulated SGLang node (`python -m orchestrator.targets.sim`)."""

    name: str = "sim"
    model_path: str = "moonshotai/Kimi-K2.5"
    tp_size: int = 8
    speculative_algorithm: str | None = "EAGLE3"
    speculative_draft_model_path: str | None = "lightseekorg/kimi-k2.5-eagle3"
    speculative_num_steps: int = 2
    speculative_eagle_topk: int = 1
    speculative_num_draft_tokens: int = 3
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    # Wall-clock sleep = modeled time x time_scale. Client timings are divided by it again, so
    # every number sleuth reports is in modeled (GPU) units.
    time_scale: float = 0.05
    noise_restart_cv: float = 0.02
    noise_request_cv: float = 0.01
    # Probability that a launch is an outlier restart running `noise_outlier_factor` x slower.
    noise_outlier_rate: float = 0.0
    noise_outlier_factor: float = 3.0
    load_seconds: float = 20.0
    # None: each launch draws its own noise (restarts are independent, as on real GPUs).
    seed: int | None = None
    # Fault injected at launch (see `python -m orchestrator.targets.sim --help`), for tests.
    fault: str | None = None
    # Simulated GPU state file of the node; empty = a file in the node's own state directory.
    gpu_state: str = ""


@dataclass
class SglangTargetConf(TargetConf):
    """A real SGLang server (`python -m sglang.launch_server`), or the sim behind the same
    adapter with `engine: sim` (`launcher=sim` on the command line)."""

    name: str = "sglang"
    engine: str | None = None  # sglang (None) | sim
    # Interpreter with SGLang installed on the nodes; empty = the node actor's own.
    python: str = ""
    # Worktree directories put first on PYTHONPATH, so a bisected commit's own code runs.
    pythonpath: list[str] = field(default_factory=lambda: ["python"])
    tp_size: int = 1
    trust_remote_code: bool = False
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    cuda_graph_max_bs: int | None = None
    disable_cuda_graph: bool = False
    mem_fraction_static: float | None = None
    context_length: int | None = None
    attention_backend: str | None = None
    decode_log_interval: int | None = None
    # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1: per-phase seconds in /metrics (verify_ms).
    device_timer: bool = True
    # Empty = ask the installed package; set it when the nodes run an unreleased checkout.
    sglang_version: str = ""
    # Run `launch_server --help` before the first trial and refuse unknown flags.
    check_flags: bool = True
    help_timeout_s: float = 300.0
    bench_client: str = "builtin"  # builtin | bench_serving
    # bench_serving's argv prefix; empty = `<python> -m sglang.bench_serving` (or its new home).
    bench_serving_command: list[str] = field(default_factory=list)
    bench_serving_args: list[str] = field(default_factory=list)
    # engine=sim only (passed as SLEUTH_SIM_* variables): see SimTargetConf.
    time_scale: float = 0.05
    noise_restart_cv: float = 0.02
    noise_request_cv: float = 0.01
    load_seconds: float = 20.0
    seed: int | None = None
    fault: str | None = None
    gpu_state: str = ""


@dataclass
class CommandTargetConf(TargetConf):
    """Any repository with a benchmark command (see orchestrator/targets/command.py)."""

    name: str = "command"
    # One repetition; its last stdout line is a JSON object of metrics or a bare number.
    bench: str = MISSING
    build: str = ""  # once per worktree (commit + patches), cached
    server: str = ""  # optional; `{port}` is replaced by the trial's port
    ready_url: str = ""  # optional; default: ready when the port accepts connections
    shell: bool = False  # run the strings with /bin/sh -c instead of splitting them
    bench_timeout_s: float = 600.0
    build_timeout_s: float = 3600.0


@dataclass
class BenchConf:
    """A fixed, seeded request set: the same prompts and output length in every repetition."""

    repetitions: int = 3
    warmup_requests: int = 2
    requests: int = 4
    concurrency: int = 1
    input_len: int = 128
    output_len: int = 64
    seed: int = 0
    request_timeout_s: float = 60.0


@dataclass
class ClusterConf:
    """Where trials run. `local` starts a private Ray instance bound to loopback."""

    kind: str = "local"
    address: str | None = None
    num_cpus: int | None = None


@dataclass
class TrialConf:
    """Limits of one server lifetime."""

    ready_timeout_s: float = 120.0
    grace_s: float = 10.0
    # Attempts per candidate before it is recorded as untestable (a failed launch is retried).
    retries: int = 1
    # GPU telemetry sampling period (wall seconds) while the server runs.
    telemetry_interval_s: float = 0.5


@dataclass
class ExperimentConf:
    name: str = "trial"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class SpaceParamConf:
    """One dimension of a sweep's search space (see `orchestrator/sweep/space.py`).

    `kind` says which candidate factor the value sets: an environment variable (`env`), a
    server setting applied over the target config (`server`), or the clock policy (`clock`).
    Levels are either `values` (categorical; null = leave unset) or a `low`..`high` range.
    `when` makes the parameter conditional: it exists only while every named parameter takes
    one of the listed values.
    """

    kind: str = "env"
    values: list[Any] = field(default_factory=list)
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False
    integer: bool = False
    baseline: Any = None
    when: dict[str, list[Any]] = field(default_factory=dict)


@dataclass
class SpaceConf:
    """A named search space for `sleuth sweep` (`conf/space/<name>.yaml`)."""

    name: str = MISSING
    description: str = ""
    params: dict[str, SpaceParamConf] = field(default_factory=dict)


@dataclass
class Config:
    """Top level. Candidate keys (repo, commit, patches, env, clock) describe what to run."""

    command: str = "trial"
    run_id: str | None = None
    runs_dir: str = "runs"
    repo: str | None = None
    commit: str = "HEAD"
    patches: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    clock: str = "default"
    # bisect: refs (`good=REF bad=REF`); isolate: candidate specs
    # (`good.commit=REF good.env.NCCL_PROTO=LL128 bad.clock=power:300 bad.patches=[a.patch]`).
    good: Any = None
    bad: Any = None
    metric: str = "verify_ms"
    direction: str = "auto"
    confidence: float = 0.99
    nodes: int = 1
    max_trials: int | None = None
    first_parent: bool = True
    paths: list[str] = field(default_factory=list)
    seed: int = 0
    # `sleuth sweep`: search budget in server restarts (the confirmation adds its own rounds),
    # sampler, space.
    trials: int = 40
    sampler: str = "tpe"
    space: SpaceConf | None = None
    # `sleuth compare` / `sleuth isolate`: an earlier run (or fingerprint file) to compare with.
    reference: str | None = None
    # `sleuth scenario`: where to write, how many commits, which planted causes.
    out: str | None = None
    commits: int = 100
    preset: str = "one_culprit"
    # What serves target=sglang: `sglang` (default) or `sim`, the embedded simulator behind the
    # same adapter (`sleuth bisect target=sglang launcher=sim ...`); sets target.engine.
    launcher: str | None = None
    target: Any = MISSING
    bench: BenchConf = field(default_factory=BenchConf)
    cluster: ClusterConf = field(default_factory=ClusterConf)
    trial: TrialConf = field(default_factory=TrialConf)
    experiment: ExperimentConf = field(default_factory=ExperimentConf)


def register(cs: ConfigStore | None = None) -> None:
    """Put the schemas where the YAML defaults lists (`- base_<name>`) find them."""
    cs = cs or ConfigStore.instance()
    cs.store(name="base_config", node=Config)
    cs.store(group="target", name="base_sim", node=SimTargetConf)
    cs.store(group="target", name="base_sglang", node=SglangTargetConf)
    cs.store(group="target", name="base_command", node=CommandTargetConf)
    cs.store(group="bench", name="base_bench", node=BenchConf)
    cs.store(group="cluster", name="base_cluster", node=ClusterConf)
    cs.store(group="experiment", name="base_experiment", node=ExperimentConf)
    cs.store(group="space", name="base_space", node=SpaceConf)
