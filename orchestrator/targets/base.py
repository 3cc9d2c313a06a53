"""The target seam: how to build, launch, probe and benchmark one kind of server.

A target is a small adapter selected by config (`target=sim|sglang|command`). The trial runner
owns the sequence (prepare -> launch -> ready -> warm-up -> repetitions -> teardown); a target
only answers the questions that differ between servers. Strategies never see targets, so adding
another engine later touches nothing but a new module here.
"""

from __future__ import annotations

import os
import sys
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from orchestrator.bench import http, prometheus
from orchestrator.bench.client import RequestSpec, make_requests, run_repetition
from orchestrator.bench.sglang_log import log_metrics
from orchestrator.config.settings import (
    BenchConf,
    TargetConf,
    bench_record,
    target_record,
)
from orchestrator.records import apply_unset


@dataclass(frozen=True)
class NodeContext:
    """What a target may know about the node it runs on."""

    name: str
    state_dir: Path  # persistent per-node state (e.g. the sim's GPU state file)


class Target(ABC):
    """One kind of server. Instances are created per node from the run's `target` and `bench`
    settings records (a plain mapping is built into its record, with the schema's defaults).

    Adapters read the typed records (`settings`, `bench_settings`); `conf` and `bench` are the
    same values as plain mappings, for the trial runner and the bench module, which read them
    so."""

    name: str = ""
    _http: httpx.Client | None = None

    def __init__(self, conf: TargetConf | Mapping, bench: BenchConf | Mapping,
                 node: NodeContext):
        self.settings: Any = target_record(conf)  # this target's own TargetConf subclass
        self.bench_settings = bench_record(bench)
        self.node = node

    # -- launch -----------------------------------------------------------------------------
    @property
    def has_server(self) -> bool:
        """False for a target that is only a benchmark command: the trial then has no process to
        launch, probe or tear down, and `measure` gets an empty base URL."""
        return True

    def own_pids(self) -> list[int]:
        """Processes this target runs besides the server (a benchmark command) that may use the
        GPUs; telemetry must not count them as foreign."""
        return []

    def preflight(self) -> str | None:
        """Checked once per node before its first trial (e.g. the installed server accepts every
        flag sleuth will pass). Returns one line saying why no trial can run here, or None."""
        return None

    @property
    def host(self) -> str:
        return self.settings.host or "127.0.0.1"

    @property
    def time_scale(self) -> float:
        """Wall seconds per server-time second (1.0 for real servers)."""
        return 1.0

    def gpu_control(self):
        """The node's GPU control backend (NVML on a real node, nothing without a driver)."""
        from orchestrator.gpu.base import NoGpuControl
        from orchestrator.gpu.nvml import NvmlGpuControl, nvml_available

        return NvmlGpuControl() if nvml_available() else NoGpuControl()

    def node_packages(self) -> dict[str, str] | None:
        """Installed packages as the server sees them; None = this Python environment's."""
        return None

    def python_executable(self) -> str:
        """The interpreter that runs the server's Python code: package overlays are built for
        it (`orchestrator/packages`)."""
        return sys.executable

    def imported_packages(self, server, base_url: str, env: Mapping[str, str], cwd: Path,
                          names: Sequence[str], libraries: Sequence[str]) -> dict:
        """What the server really imports of distributions `names`, and from where it loaded
        the native `libraries`: `{"source", "packages": {name: {"version", "location",
        "modules"} | None}, "libraries": {basename: [paths]}}`. Read from the server process
        (`server`, a running ServerProcess), or for a benchmark command alone from a probe with
        its interpreter and environment; raises RuntimeError when it cannot tell."""
        from orchestrator.packages.probe import report_of_command, report_of_process

        if server is not None:
            return report_of_process(server.pid, server.pgid, names, libraries,
                                     self.python_executable())
        return report_of_command(self.command(cwd, 0), env, str(cwd), names,
                                 self.python_executable())

    def prepare(self, worktree: Path, trial_dir: Path) -> None:  # noqa: B027 - optional hook
        """Build step for the checkout (none by default). Raise to mark it untestable."""

    @abstractmethod
    def command(self, worktree: Path, port: int) -> list[str]:
        """The server's argv (a list; it is never passed through a shell)."""

    def environment(self, candidate_env: Mapping[str, str]) -> dict[str, str]:
        """Full environment of the server: this node's, the target's, then the candidate's."""
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in self.settings.env.items()})
        env.update(candidate_env)
        return apply_unset(env)

    def launcher(self) -> list[str]:
        """Optional argv prefix (numactl, taskset, a profiler ...)."""
        return [str(x) for x in self.settings.launcher]

    # -- HTTP -------------------------------------------------------------------------------
    @property
    def http(self) -> httpx.Client:
        """This target's one HTTP client: a trial's readiness polls, scrapes and probes reuse
        its connections instead of opening one per call. Made on first use; `close` (at the
        end of every trial) closes it, so no connection outlives the server it went to."""
        if self._http is None:
            self._http = http.client()
        return self._http

    def close(self) -> None:
        """Give back what the target holds between calls (its HTTP client); it makes a new
        one if used again."""
        client, self._http = self._http, None
        if client is not None:
            client.close()

    # -- probing ----------------------------------------------------------------------------
    def is_ready(self, base_url: str) -> bool:
        """SGLang answers /health_generate with 200 once a real generation works."""
        try:
            r = self.http.get(f"{base_url}/health_generate", timeout=5.0)
        except httpx.HTTPError:
            return False
        return r.status_code == 200

    def server_settings(self, base_url: str) -> dict | None:
        """The settings the running server reports (SGLang's resolved `ServerArgs`, from
        `/server_info`), for the fingerprint: a reference that recorded them (an old log's
        `server_args=`) is compared with them field by field. None: the server says none."""
        return None

    def scrape(self, base_url: str) -> dict | None:
        """Prometheus counters, or None when the server exports none."""
        try:
            r = self.http.get(f"{base_url}/metrics", timeout=5.0)
        except httpx.HTTPError:
            return None
        return prometheus.parse(r.text) if r.status_code == 200 else None

    # -- benchmark --------------------------------------------------------------------------
    def requests(self, n: int | None = None, seed_offset: int = 0) -> list[RequestSpec]:
        b = self.bench_settings
        return make_requests(n if n is not None else b.requests, b.input_len, b.output_len,
                             b.seed + seed_offset)

    def warm_up(self, base_url: str, n_requests: int) -> None:
        """Unmeasured requests after ready (compilation, caches); a BenchError fails the trial."""
        run_repetition(
            base_url, self.requests(n_requests, seed_offset=10_000),
            concurrency=self.bench_settings.concurrency,
            timeout_s=self.bench_settings.request_timeout_s,
            time_scale=self.time_scale,
        )

    def benchmark(self, base_url: str, requests: list[RequestSpec], log_path: Path) -> dict[str, float]:
        """Client-side metrics of one repetition (the built-in client by default)."""
        return run_repetition(
            base_url,
            requests,
            concurrency=self.bench_settings.concurrency,
            timeout_s=self.bench_settings.request_timeout_s,
            time_scale=self.time_scale,
        )

    # -- profile ---------------------------------------------------------------------------
    # Whether the server answers SGLang's `/start_profile` and `/stop_profile`.
    supports_profile: bool = False

    def profile(self, base_url: str, trial_dir: Path, settings: Mapping) -> dict:
        """One profiled load after the measured repetitions: the trace's summary, or
        `{"error": ...}` (see orchestrator/evidence/capture.py). The load is the measured
        request set (`settings["requests"]` of them), so both sides of a diff ran the same."""
        from orchestrator.evidence import capture

        if not self.supports_profile:
            return {"error": f"target {self.name} cannot take a profile"}
        n = int(settings.get("requests") or self.bench_settings.requests)

        def load() -> None:
            run_repetition(base_url, self.requests(n),
                           concurrency=self.bench_settings.concurrency,
                           timeout_s=self.bench_settings.request_timeout_s,
                           time_scale=self.time_scale)

        return capture.guarded(lambda: capture.capture_http(self.http, base_url, trial_dir, load))

    def measure(self, base_url: str, requests: list[RequestSpec], log_path: Path) -> dict[str, float]:
        """One repetition: client metrics plus server phase metrics bracketing it."""
        before = self.scrape(base_url)
        log_start = log_path.stat().st_size if log_path.exists() else 0
        metrics = self.benchmark(base_url, requests, log_path)
        after = self.scrape(base_url)
        if before is not None and after is not None:
            metrics.update(prometheus.phase_metrics(before, after))
        if log_path.exists():
            with open(log_path, "rb") as f:
                f.seek(log_start)
                metrics.update(log_metrics(f.read().decode(errors="replace")))
        return metrics
