"""Structured configuration: the dataclasses Hydra checks every composed config against.

Registered in Hydra's ConfigStore (see `register`) so that a misspelt key or a value of the wrong
type is rejected before anything runs. The YAML files under `conf/` only choose values; the
shape of the configuration lives here, in one place.

Groups (one YAML file per option under `conf/<group>/`):
  target/      the system under test: `sglang` (a real SGLang server, the default;
               `launcher=sim` puts the sim behind the same adapter), `sim` (the embedded
               simulated SGLang node), `command` (any repository with a benchmark command).
  bench/       the fixed, seeded request set each repetition sends.
  cluster/     where trials run: `local` (a Ray instance started for the run).
  experiment/  strategy tuning for the command (`trial`, `bisect`, ...).
  space/       search spaces for `sleuth sweep` (`nccl_pcie`, `spec_decode`); none by default.

Every class is a frozen dataclass: the same classes are the typed settings every layer reads
(`orchestrator/config/settings.py` builds them once from the composed config), so a value is
replaced (`settings.evolve`), never changed in place. Hydra composes over writable copies of
them (`orchestrator/config/compose.py: register`).

Values are range-checked here too, once, for every command: a field declared with `ranged(...)`
or `choice(...)` carries its bounds in its metadata, every float must be finite, and
`orchestrator/config/checks.py` walks the composed config against them before any command
looks at it (`trial.ready_timeout_s=nan` would otherwise wait forever for a server that never
gets ready). Typed settings objects can read the same metadata.

Size: the schema is one place on purpose (the shape of every setting, read top to bottom);
it is declarations, no logic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import MISSING


@dataclass(frozen=True)
class Bounds:
    """A numeric field's allowed range (None: unbounded on that side)."""

    gt: float | None = None
    ge: float | None = None
    lt: float | None = None
    le: float | None = None

    def problem(self, value: Any) -> str | None:
        """Why `value` is not allowed, or None when it is."""
        if isinstance(value, bool) or not isinstance(value, int | float):
            return f"must be {self.describe()}"
        if isinstance(value, float) and not math.isfinite(value):
            return f"must be {self.describe()}"
        ok = ((self.gt is None or value > self.gt) and (self.ge is None or value >= self.ge)
              and (self.lt is None or value < self.lt) and (self.le is None or value <= self.le))
        return None if ok else f"must be {self.describe()}"

    def describe(self) -> str:
        parts = [f"{op} {_num(v)}" for op, v in
                 ((">", self.gt), (">=", self.ge), ("<", self.lt), ("<=", self.le)) if v is not None]
        return "a finite number" + (f" {' and '.join(parts)}" if parts else "")


def _num(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def ranged(default: Any, **bounds: float) -> Any:
    """A numeric field with bounds (`gt`, `ge`, `lt`, `le`), checked once after composition."""
    return field(default=default, metadata={"bounds": Bounds(**bounds)})


def choice(default: Any, *options: Any) -> Any:
    """A field that takes one of a few values (None allowed only when it is the default)."""
    return field(default=default, metadata={"choices": tuple(options)})


# `experiment.params` knobs are typed and checked in `orchestrator/config/params.py`.

# Large enough for any real benchmark, small enough that a typo (an extra digit or three)
# is refused instead of asking a server for a billion tokens.
MAX_TOKENS = 1 << 20


@dataclass(frozen=True)
class TargetConf:
    """Fields every target has; each target's schema extends it."""

    name: str = MISSING
    model_path: str = ""
    # The address the server under test listens on. Anything but loopback exposes it (and
    # whatever it serves: the model, its admin endpoints) to other machines, so it also needs
    # `allow_remote: true`; the benchmark client runs on the same node and needs no more.
    host: str = "127.0.0.1"
    allow_remote: bool = False
    # Extra server flags appended verbatim (as a list, never through a shell).
    extra_args: list[str] = field(default_factory=list)
    # Argv prefix for the server (numactl, taskset, a profiler ...).
    launcher: list[str] = field(default_factory=list)
    # Environment every trial's server gets on top of the node's (candidate env comes after).
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class SimTargetConf(TargetConf):
    """The embedded simulated SGLang node (`python -m orchestrator.targets.sim`)."""

    name: str = "sim"
    model_path: str = "moonshotai/Kimi-K2.5"
    tp_size: int = ranged(8, ge=1, le=1024)
    speculative_algorithm: str | None = "EAGLE3"
    speculative_draft_model_path: str | None = "lightseekorg/kimi-k2.5-eagle3"
    speculative_num_steps: int = ranged(2, ge=1, le=64)
    speculative_eagle_topk: int = ranged(1, ge=1, le=64)
    speculative_num_draft_tokens: int = ranged(3, ge=1, le=1024)
    cuda_graph_max_bs: int | None = ranged(None, ge=1)
    disable_cuda_graph: bool = False
    # Wall-clock sleep = modeled time x time_scale. Client timings are divided by it again, so
    # every number sleuth reports is in modeled (GPU) units.
    time_scale: float = ranged(0.05, gt=0, le=1000)
    noise_restart_cv: float = ranged(0.02, ge=0, le=10)
    noise_request_cv: float = ranged(0.01, ge=0, le=10)
    # Probability that a launch is an outlier restart running `noise_outlier_factor` x slower.
    noise_outlier_rate: float = ranged(0.0, ge=0, le=1)
    noise_outlier_factor: float = ranged(3.0, gt=0, le=100)
    load_seconds: float = ranged(20.0, ge=0)
    # None: each launch draws its own noise (restarts are independent, as on real GPUs).
    seed: int | None = None
    # Fault injected at launch (see `python -m orchestrator.targets.sim --help`), for tests.
    fault: str | None = None
    # Simulated GPU state file of the node; empty = a file in the node's own state directory.
    gpu_state: str = ""
    # SGLang release the sim imitates (flags, metrics, meta_info): 0.5.23 (empty) or 0.5.9.
    sglang_version: str = ""


@dataclass(frozen=True)
class SglangTargetConf(TargetConf):
    """A real SGLang server (`python -m sglang.launch_server`), or the sim behind the same
    adapter with `engine: sim` (`launcher=sim` on the command line)."""

    name: str = "sglang"
    engine: str | None = choice(None, "sglang", "sim")  # sglang (None) | sim
    # Interpreter with SGLang installed on the nodes; empty = the node actor's own.
    python: str = ""
    # Worktree directories put first on PYTHONPATH, so a bisected commit's own code runs.
    pythonpath: list[str] = field(default_factory=lambda: ["python"])
    tp_size: int = ranged(1, ge=1, le=1024)
    trust_remote_code: bool = False
    speculative_algorithm: str | None = None
    speculative_draft_model_path: str | None = None
    speculative_num_steps: int | None = ranged(None, ge=1, le=64)
    speculative_eagle_topk: int | None = ranged(None, ge=1, le=64)
    speculative_num_draft_tokens: int | None = ranged(None, ge=1, le=1024)
    cuda_graph_max_bs: int | None = ranged(None, ge=1)
    disable_cuda_graph: bool = False
    mem_fraction_static: float | None = ranged(None, gt=0, le=1)
    context_length: int | None = ranged(None, ge=1)
    attention_backend: str | None = None
    decode_log_interval: int | None = ranged(None, ge=1)
    # SGLANG_ENABLE_METRICS_DEVICE_TIMER=1: per-phase seconds in /metrics (verify_ms).
    device_timer: bool = True
    # Empty = ask the installed package; set it when the nodes run an unreleased checkout.
    # With engine=sim: the release the sim imitates (0.5.23 when empty, or 0.5.9).
    sglang_version: str = ""
    # Run `launch_server --help` before the first trial and refuse unknown flags.
    check_flags: bool = True
    help_timeout_s: float = ranged(300.0, gt=0)
    bench_client: str = "builtin"  # builtin | bench_serving
    # bench_serving's argv prefix; empty = `<python> -m sglang.bench_serving` (or its new home).
    bench_serving_command: list[str] = field(default_factory=list)
    bench_serving_args: list[str] = field(default_factory=list)
    # engine=sim only (passed as SLEUTH_SIM_* variables): see SimTargetConf.
    time_scale: float = ranged(0.05, gt=0, le=1000)
    noise_restart_cv: float = ranged(0.02, ge=0, le=10)
    noise_request_cv: float = ranged(0.01, ge=0, le=10)
    load_seconds: float = ranged(20.0, ge=0)
    seed: int | None = None
    fault: str | None = None
    gpu_state: str = ""


@dataclass(frozen=True)
class CommandTargetConf(TargetConf):
    """Any repository with a benchmark command (see orchestrator/targets/command.py)."""

    name: str = "command"
    # One repetition; its last stdout line is a JSON object of metrics or a bare number.
    # Required (`commands/common.py: require_bench`), unless a reference run supplies its own.
    bench: str = ""
    build: str = ""  # once per worktree (commit + patches), cached
    server: str = ""  # optional; `{port}` is replaced by the trial's port
    ready_url: str = ""  # optional; default: ready when the port accepts connections
    # optional: the command of a profiled run (default: the bench), which writes a torch
    # profiler / Chrome trace to the file named in SLEUTH_PROFILE_TRACE
    profile: str = ""
    shell: bool = False  # run the strings with /bin/sh -c instead of splitting them
    # The interpreter of the project's code, for package overlays: empty = the first word of
    # the server (or bench) command when it is a Python interpreter, else sleuth's own.
    python: str = ""
    # Worktree directories put first on PYTHONPATH (those that exist), so a bench script kept
    # outside the repository imports the commit's code rather than an installed copy.
    pythonpath: list[str] = field(default_factory=lambda: [".", "src"])
    bench_timeout_s: float = ranged(600.0, gt=0)
    build_timeout_s: float = ranged(3600.0, gt=0)


@dataclass(frozen=True)
class BenchConf:
    """A fixed, seeded request set: the same prompts and output length in every repetition."""

    repetitions: int = ranged(3, ge=1, le=100_000)
    # A bisect chooses each restart's repetitions in min..max by information per GPU-minute
    # (the two noise levels and the measured costs); false keeps `repetitions` throughout.
    adaptive_repetitions: bool = True
    min_repetitions: int = ranged(1, ge=1, le=100_000)
    max_repetitions: int = ranged(32, ge=1, le=100_000)
    # The node's earlier runs in runs_dir (same server, workload and metric, same hosts) start
    # the two noise levels and the costs; false: every run measures them from nothing.
    noise_prior: bool = True
    warmup_requests: int = ranged(2, ge=0, le=100_000)
    requests: int = ranged(4, ge=1, le=1_000_000)
    concurrency: int = ranged(1, ge=1, le=100_000)
    input_len: int = ranged(128, ge=1, le=MAX_TOKENS)
    output_len: int = ranged(64, ge=2, le=MAX_TOKENS)
    seed: int = 0
    request_timeout_s: float = ranged(60.0, gt=0)


@dataclass(frozen=True)
class ClusterConf:
    """Where trials run. `local` starts a private Ray instance bound to loopback."""

    kind: str = choice("local", "local", "ray")
    address: str | None = None
    num_cpus: int | None = ranged(None, ge=1)
    # cluster=ray: how long to wait for the head to answer before giving up with one line.
    connect_timeout_s: float = ranged(30.0, gt=0, le=3600)
    # When every sleuth node is lost, how long to wait for one to (re)join before the run
    # stops as interrupted (resumable).
    rejoin_timeout_s: float = ranged(600.0, ge=0)


@dataclass(frozen=True)
class TrialConf:
    """Limits of one server lifetime."""

    ready_timeout_s: float = ranged(120.0, gt=0)
    grace_s: float = ranged(10.0, ge=0, le=3600)
    # Attempts per candidate before it is recorded as untestable (a failed launch is retried).
    retries: int = ranged(1, ge=0, le=100)
    # GPU telemetry sampling period (wall seconds) while the server runs.
    telemetry_interval_s: float = ranged(0.5, gt=0, le=3600)
    # Take a profile (torch trace) after each trial's measured repetitions; it is stored in the
    # trial directory and never touches the measurement (orchestrator/evidence/capture.py).
    profile: bool = False


@dataclass(frozen=True)
class EvidenceConf:
    """Evidence below the phase, after the answer (orchestrator/evidence): each named cause's
    two sides are profiled with `restarts` server restarts each and their kernels diffed.
    `kernels`: null = the target's default (on for the sim, off where restarts cost GPU time)."""

    kernels: bool | None = None
    restarts: int = ranged(3, ge=2, le=100)
    requests: int | None = ranged(None, ge=1, le=100_000)  # profiled load; null: bench.requests
    max_causes: int = ranged(3, ge=1, le=20)


@dataclass(frozen=True)
class CacheConf:
    """The worktree cache under `runs_dir/.cache/worktrees` (one checkout per commit + patch
    set), bounded: past `max_gb` the least recently used checkouts are removed."""

    max_gb: float = ranged(20.0, gt=0)


@dataclass(frozen=True)
class PackagesConf:
    """The `packages` factor's settings (see `orchestrator/packages`, docs/packages.md).

    `pins` are installed over the node's packages for every candidate of the run (a bisect
    under a fixed overlay): `packages=[flashinfer-python==0.2.3]` on the command line sets
    them. Overlays are built with pip from `find_links` (a wheel directory: offline, unless
    `index_url` is given too) or `index_url`, else from pip's own configuration; a system-level
    isolate tests package changes only when one of the two is given."""

    pins: list[str] = field(default_factory=list)
    find_links: str = ""  # a directory of wheels (more: pip_args=[--find-links,DIR2])
    index_url: str = ""
    pip_args: list[str] = field(default_factory=list)
    # Overlays under runs_dir/.cache/overlays; past this the least recently used are removed.
    max_gb: float = ranged(20.0, gt=0)
    timeout_s: float = ranged(1800.0, gt=0)
    # `investigate`: a package change isolate proved harmful is followed by a search of the
    # releases in between (`bisect package=NAME`) when the source lists them.
    bisect: bool = True


@dataclass(frozen=True)
class PackageSearchConf:
    """`sleuth bisect package=NAME good=V1 bad=V2`: the releases of one package searched like
    commits (see `orchestrator/packages/releases.py`). `package=NAME` sets `name`."""

    name: str = ""
    pre: bool = False  # pre-releases and development releases take part too


@dataclass(frozen=True)
class LogConf:
    """How an old server log is read (`reference=log:PATH`, `sleuth trial from_log=PATH`):
    `pattern` is a regular expression whose named groups are metrics, for lines the server's
    own instrumentation prints (`log.pattern='verify (?P<verify_ms>[0-9.]+) ms'`)."""

    pattern: str = ""


@dataclass(frozen=True)
class LiveConf:
    """The slow server as it runs now (`live=PID` or `live=URL` sets `server`): measured
    without a restart; `restart=true` then stops it, starts the same command and environment
    fresh `restarts` times (at most; fewer when the answer is clear), and relaunches the
    original command at the end, leaving the node as it was found."""

    server: str = ""
    restart: bool = False
    restarts: int = ranged(5, ge=2, le=100)
    # How long the running server may take to stop (SIGTERM) before SIGKILL.
    grace_s: float = ranged(60.0, ge=0, le=3600)


@dataclass(frozen=True)
class ExperimentConf:
    """The experiment's name and its knobs (typed in `orchestrator/config/params.py`)."""

    name: str = "trial"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SpaceParamConf:
    """One dimension of a sweep's search space (see `orchestrator/strategies/sweep/space.py`).

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


@dataclass(frozen=True)
class SpaceConf:
    """A named search space for `sleuth sweep` (`conf/space/<name>.yaml`)."""

    name: str = MISSING
    description: str = ""
    params: dict[str, SpaceParamConf] = field(default_factory=dict)


@dataclass(frozen=True)
class RunSettings:
    """Top level: the run's whole typed settings tree (`orchestrator/config/settings.py` builds
    it from the composed config). Candidate keys (repo, commit, patches, env, clock) describe
    what to run."""

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
    confidence: float = ranged(0.99, gt=0.5, lt=1)
    nodes: int = ranged(1, ge=1, le=4096)
    max_trials: int | None = ranged(None, ge=1)
    first_parent: bool = True
    paths: list[str] = field(default_factory=list)
    seed: int = 0
    # `sleuth sweep`: search budget in server restarts (the confirmation adds its own rounds),
    # sampler, space.
    trials: int = ranged(40, ge=1)
    sampler: str = "tpe"
    space: SpaceConf | None = None
    # `sleuth compare` / `isolate` / `investigate`: an earlier run (or fingerprint file) that
    # measured the good state.
    reference: str | None = None
    # `sleuth bisect was=19` (and investigate's bisect without a reference): the metric's value
    # when it was fast, as the user knows it (a dashboard, an earlier log). It sets the change
    # being chased as a reference run's level does, so a range that does not hold it is ruled
    # out as soon as its change is confidently under half of it.
    was: float | None = ranged(None, gt=0)
    # `sleuth investigate recover=true`: end with a short sweep of `space` on the bad commit.
    recover: bool = False
    # `sleuth investigate budget=6h` (node time: h, m, d) or `budget=40` (restarts): the whole
    # run's bound; at it the answer so far, and what finishing would cost (orchestrator/run/plan.py).
    budget: Any = None
    # `sleuth trial restarts=N`: N trials (server restarts) of the candidate, e.g. a reference.
    restarts: int = ranged(1, ge=1, le=10_000)
    # `sleuth trial from_log=PATH run_id=NAME`: an old server log kept as a reference run.
    from_log: str | None = None
    # `sleuth scenario`: where to write, how many commits, which planted causes.
    out: str | None = None
    commits: int = ranged(100, ge=1)
    preset: str = "one_culprit"
    # `sleuth scenario out=DIR apply=reference|now`: put the simulated nodes of `runs_dir` into
    # the scenario's recorded system state (as it was when fast, or as it is now).
    apply: str | None = choice(None, "reference", "now", "live")
    # `sleuth kernels then=DIR|FILES now=DIR|FILES [mode=NAME]`: profiler traces of the fast
    # and the slow runs (a directory, a file, a glob, or a list), and which forward mode(s) to
    # compare (empty: every mode both sides have; `all`: each trace as one pass).
    then: Any = None
    now: Any = None
    mode: str | None = None
    # What serves target=sglang: `sglang` (default) or `sim`, the embedded simulator behind the
    # same adapter (`sleuth bisect target=sglang launcher=sim ...`); sets target.engine.
    launcher: str | None = choice(None, "sglang", "sim")
    target: Any = MISSING
    bench: BenchConf = field(default_factory=BenchConf)
    cluster: ClusterConf = field(default_factory=ClusterConf)
    trial: TrialConf = field(default_factory=TrialConf)
    cache: CacheConf = field(default_factory=CacheConf)
    packages: PackagesConf = field(default_factory=PackagesConf)
    package: PackageSearchConf = field(default_factory=PackageSearchConf)
    experiment: ExperimentConf = field(default_factory=ExperimentConf)
    evidence: EvidenceConf = field(default_factory=EvidenceConf)
    log: LogConf = field(default_factory=LogConf)
    live: LiveConf = field(default_factory=LiveConf)

    @property
    def runs_root(self) -> Path:
        """`runs_dir` as an absolute path (relative to where sleuth was invoked)."""
        return Path(self.runs_dir).expanduser().resolve()


# The schema of `target` by its name (`target` itself is `Any` in RunSettings: each group
# option brings its own, and the typed tree holds an instance of that class).
TARGET_SCHEMAS: dict[str, type] = {
    "sim": SimTargetConf, "sglang": SglangTargetConf, "command": CommandTargetConf}

