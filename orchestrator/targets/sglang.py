"""Adapter for a real SGLang server (`target=sglang`).

It builds `python -m sglang.launch_server ...` from the target config, with the flag spelling the
installed release accepts (see `sglang_versions`), and measures what SGLang itself reports:

- `/metrics` counters bracketing each repetition (per-phase device seconds divided by verify
  calls gives verify ms per call). SGLang attaches its device timer only with
  `SGLANG_ENABLE_METRICS_DEVICE_TIMER=1`, so the adapter sets it (and `--enable-metrics`).
- `/server_info` (or `/get_server_info` on releases before it existed) accept length. It is
  cumulative, so the cache is flushed before every repetition (`/flush_cache` resets it, and
  makes every repetition start from the same cold prefix cache); SGLang updates it once per
  decode-log window only, so the requests' own accounting comes first (see
  `orchestrator.bench.server_measure`, which does the measuring for this target and `sim`).
- the scheduler's `Decode batch` log lines written during the repetition.

The client is sleuth's own (default) or, with `target.bench_client=bench_serving`, SGLang's
`bench_serving`, whose `--output-file` is parsed (it appends, so each repetition gets a fresh
file). Its prompts are `random-ids` sent as token ids (`--tokenize-prompt`; without it they are
decoded to text and re-tokenized by the server, and the input length drifts). Against the sim
its wall-clock numbers are converted to modeled time (`time_scale`), like the built-in
client's; offline it needs a local tokenizer (`target.bench_serving_args=[--tokenizer,DIR]`, or
the sim's `--tokenizer-path DIR` through `target.extra_args`, which `/model_info` reports).

Bisecting SGLang itself means running each commit's own Python code: `target.pythonpath`
(default `python`, SGLang's package directory) is put first on PYTHONPATH inside the worktree,
while compiled kernels come from what is installed on the node.

`target.engine=sim` (or `launcher=sim` on the command line) launches the embedded simulator
instead of `sglang.launch_server`: it accepts SGLang's flags and takes its own settings from
`SLEUTH_SIM_*` variables, so this whole adapter runs end to end without a GPU.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import httpx

from orchestrator.bench import server_measure
from orchestrator.bench.client import BenchError, RequestSpec
from orchestrator.config.schema import BenchConf, SglangTargetConf
from orchestrator.records import apply_unset
from orchestrator.system import fingerprint
from orchestrator.targets import sglang_versions as versions
from orchestrator.targets.base import Target
from orchestrator.targets.command import run_command
from orchestrator.util.versions import parse_version

DEVICE_TIMER_ENV = "SGLANG_ENABLE_METRICS_DEVICE_TIMER"
SIM_MODULE = "orchestrator.targets.sim"
SIM_PLACEHOLDER_MODEL = "sim/kimi-k2.5"

# bench_serving's result keys (0.5.9 `bench_serving.py`, 0.5.23 `benchmark/serving.py`) -> ours.
BENCH_SERVING_KEYS = {
    "output_throughput": "output_throughput",
    "request_throughput": "request_throughput",
    "completed": "completed",
    "total_output_tokens": "output_tokens",
    "median_ttft_ms": "ttft_ms_p50",
    "p99_ttft_ms": "ttft_ms_p99",
    "median_itl_ms": "itl_ms_p50",
    "p95_itl_ms": "itl_ms_p95",
    "p99_itl_ms": "itl_ms_p99",
    "median_tpot_ms": "tpot_ms_p50",
    "p99_tpot_ms": "tpot_ms_p99",
    "median_e2e_latency_ms": "e2e_ms_p50",
    "p90_e2e_latency_ms": "e2e_ms_p90",
    "duration": "duration_s",
}
# Not taken: `accept_length`, which bench_serving reads from /server_info after the run (the
# server's windowed value, read here directly) and which is missing for a short repetition.
# Wall-clock keys, converted to modeled time against the sim: durations / time_scale,
# rates x time_scale.
_DURATIONS = {name for name in BENCH_SERVING_KEYS.values() if "_ms" in name or name.endswith("_s")}
_RATES = {"output_throughput", "request_throughput"}


def parse_bench_serving(path: Path, time_scale: float = 1.0) -> dict[str, float]:
    """Our metrics from the last JSON line bench_serving appended to `path`, in the server's
    time units (`time_scale`: wall seconds per modeled second, 1.0 for a real server)."""
    lines = [ln for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []
    if not lines:
        raise BenchError("http", f"bench_serving wrote no result to {path.name}")
    try:
        doc = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise BenchError("http", f"bench_serving result is not JSON: {exc}") from exc
    out = {}
    for key, name in BENCH_SERVING_KEYS.items():
        value = doc.get(key)
        if isinstance(value, int | float) and not isinstance(value, bool):
            value = float(value)
            if name in _DURATIONS:
                value /= time_scale
            elif name in _RATES:
                value *= time_scale
            out[name] = value
    return out


server_accept_length = server_measure.server_accept_length  # re-exported: used by tests, tools


class SglangTarget(Target):
    supports_profile = True  # /start_profile, /stop_profile (tests/fixtures/sglang_0_5_23)
    name = "sglang"

    def __init__(self, conf: SglangTargetConf | Mapping, bench: BenchConf | Mapping, node):
        super().__init__(conf, bench, node)
        self._features: versions.SglangFeatures | None = None
        self._worktree: Path | None = None
        self._repetition = 0
        self._packages: dict[str, str] | None = None
        self._package_paths: list[str] | None = None  # that interpreter's sys.path
        self._package_signature: tuple | None = None

    # -- what runs ---------------------------------------------------------------------------
    @property
    def engine(self) -> str:
        return self.settings.engine or "sglang"

    @property
    def simulated(self) -> bool:
        return self.engine == "sim"

    @property
    def python(self) -> str:
        """The interpreter that has SGLang installed (default: the node actor's own)."""
        return self.settings.python or sys.executable

    @property
    def time_scale(self) -> float:
        return float(self.settings.time_scale or 1.0) if self.simulated else 1.0

    @property
    def features(self) -> versions.SglangFeatures:
        """Interface facts: from `launch_server --help` once preflight ran, else from the
        installed version (a trial with its own server settings gets a fresh target)."""
        if self._features is None:
            self._features = versions.features_for_version(self.installed_version())
        return self._features

    def module_argv(self) -> list[str]:
        if self.simulated:
            # -P: the worktree must not shadow sleuth's own modules.
            return [sys.executable, "-P", "-m", SIM_MODULE]
        return [self.python, "-m", "sglang.launch_server"]

    def server_args(self, port: int) -> list[str]:
        """SGLang flags for this config, spelled for this build (no launcher, no module)."""
        c = self.settings
        model = str(c.model_path or (SIM_PLACEHOLDER_MODEL if self.simulated else ""))
        args = ["--model-path", model, "--host", self.host, "--port", str(port),
                "--tp-size", str(int(c.tp_size or 1)), "--enable-metrics"]
        if c.trust_remote_code:
            args.append("--trust-remote-code")
        if c.speculative_algorithm:
            args += ["--speculative-algorithm", str(c.speculative_algorithm)]
            for key in ("speculative_draft_model_path", "speculative_num_steps",
                        "speculative_eagle_topk", "speculative_num_draft_tokens"):
                if getattr(c, key) is not None:
                    args += ["--" + key.replace("_", "-"), str(getattr(c, key))]
        for key in ("mem_fraction_static", "context_length", "attention_backend",
                    "decode_log_interval"):
            if getattr(c, key) is not None:
                args += ["--" + key.replace("_", "-"), str(getattr(c, key))]
        if c.cuda_graph_max_bs is not None:
            args += self.features.cuda_graph_max_bs_args(int(c.cuda_graph_max_bs))
        if c.disable_cuda_graph:
            args += self.features.disable_cuda_graph_args()
        return args + [str(a) for a in c.extra_args]

    def command(self, worktree: Path, port: int) -> list[str]:
        return self.launcher() + self.module_argv() + self.server_args(port)

    def _sim_env(self) -> dict[str, str]:
        """The sim's own settings, through the `SLEUTH_SIM_*` fallbacks of its flags."""
        from orchestrator.targets.sim.args import sim_env_name

        c = self.settings
        values = {"time-scale": self.time_scale, "load-seconds": c.load_seconds,
                  "sglang-version": c.sglang_version,
                  "noise-restart-cv": c.noise_restart_cv,
                  "noise-request-cv": c.noise_request_cv, "seed": c.seed,
                  "fault": c.fault, "gpu-state": self.gpu_state_path,
                  "packages": (self.node.state_dir / "packages.json"
                               if (self.node.state_dir / "packages.json").exists() else None)}
        return {sim_env_name(k): str(v) for k, v in values.items() if v not in (None, "")}

    def environment(self, candidate_env: Mapping[str, str]) -> dict[str, str]:
        """Node env, the device timer (per-phase seconds), the worktree's code first on
        PYTHONPATH, the target's env, then the candidate's."""
        env = dict(os.environ)
        if self.settings.device_timer:
            env[DEVICE_TIMER_ENV] = "1"
        if self.simulated:
            env.update(self._sim_env())
        if self._worktree is not None and not self.simulated:
            own = [str(self._worktree / p) for p in self.settings.pythonpath]
            env["PYTHONPATH"] = os.pathsep.join([*own, *filter(None, [env.get("PYTHONPATH")])])
        env.update({str(k): str(v) for k, v in self.settings.env.items()})
        env.update(candidate_env)
        return apply_unset(env)

    # -- node state --------------------------------------------------------------------------
    @property
    def gpu_state_path(self) -> Path:
        configured = self.settings.gpu_state
        return Path(configured) if configured else self.node.state_dir / "gpu_state.json"

    def gpu_control(self):
        if self.simulated:
            from orchestrator.targets.sim.gpu_control import SimGpuControl

            return SimGpuControl(self.gpu_state_path)
        return super().gpu_control()

    def python_executable(self) -> str:
        return sys.executable if self.simulated else self.python

    def imported_packages(self, server, base_url, env, cwd, names, libraries) -> dict:
        """A probe of the server process; the sim reports its own (`GET /sim/packages`)."""
        if self.simulated:
            from orchestrator.targets.simnode import sim_report

            return sim_report(self.http, base_url)
        return super().imported_packages(server, base_url, env, cwd, names, libraries)

    def node_packages(self) -> dict[str, str] | None:
        """Packages of the interpreter that runs SGLang, when it is not this one (the sim's:
        its node's `packages.json`, if any)."""
        if self.simulated:
            path = self.node.state_dir / "packages.json"
            return json.loads(path.read_text()) if path.exists() else None
        if self.python == sys.executable:
            return None
        # Listed once and again only when that interpreter's site directories change (see
        # fingerprint.all_packages): an upgrade there between two trials is in the second's.
        if self._packages is not None and self._package_paths is not None:
            if fingerprint.site_signature(self._package_paths) == self._package_signature:
                return self._packages
        code = ("import importlib.metadata as m, json, sys; print(json.dumps({'path': sys.path,"
                " 'packages': {(d.metadata['Name'] or '').lower(): d.version"
                " for d in m.distributions()}}))")
        out = subprocess.run([self.python, "-c", code], capture_output=True, text=True,
                             timeout=120, check=False)
        try:
            doc = json.loads(out.stdout) if out.returncode == 0 else {}
        except ValueError:
            doc = {}
        self._packages = {str(k): str(v) for k, v in (doc.get("packages") or {}).items()}
        paths = [str(p) for p in doc.get("path") or []] or None
        signature = fingerprint.site_signature(paths) if paths else None
        keep = signature is not None and fingerprint.settled(signature)
        self._package_paths, self._package_signature = (paths, signature) if keep else (None, None)
        return self._packages

    def prepare(self, worktree: Path, trial_dir: Path) -> None:
        self._worktree = worktree  # environment() puts its code first on PYTHONPATH
        if self.simulated and not self.gpu_state_path.exists():
            from orchestrator.targets.sim import gpu_state

            self.gpu_state_path.parent.mkdir(parents=True, exist_ok=True)
            gpu_state.save(self.gpu_state_path, gpu_state.default_state())

    # -- before the first trial --------------------------------------------------------------
    def installed_version(self) -> tuple[int, int, int] | None:
        if self.settings.sglang_version:
            return parse_version(self.settings.sglang_version)
        if self.simulated:
            from orchestrator.targets.sim.dialect import DEFAULT_VERSION

            return parse_version(DEFAULT_VERSION)
        code = "import importlib.metadata as m; print(m.version('sglang'))"
        try:
            out = subprocess.run([self.python, "-c", code], capture_output=True, text=True,
                                 timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return parse_version(out.stdout.strip()) if out.returncode == 0 else None

    def preflight(self) -> str | None:
        """Run the installed `launch_server --help` and refuse a flag it does not list."""
        if self.engine not in ("sglang", "sim"):
            return f"launcher / target.engine must be sglang or sim, not {self.engine!r}"
        if not self.simulated and not self.settings.model_path:
            return "target.model_path is not set (the model SGLang should serve)"
        if not self.settings.check_flags:
            return None
        argv = [*self.module_argv(), "--help"]
        self.node.state_dir.mkdir(parents=True, exist_ok=True)  # cwd: anywhere but a repo
        try:
            done = subprocess.run(argv, capture_output=True, text=True, check=False,
                                  timeout=float(self.settings.help_timeout_s or 300),
                                  env=self.environment({}), cwd=self.node.state_dir,
                                  stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"cannot run `{' '.join(argv)}` on node {self.node.name}: {exc}"
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return (f"`{' '.join(argv)}` failed on node {self.node.name} (exit {done.returncode}):"
                    f" {last}")
        accepted = versions.help_flags(done.stdout)
        version = self.installed_version()
        self._features = versions.features_from_help(accepted, version)
        bad = versions.unknown_flag(self.server_args(0), accepted)
        if bad:
            shown = ".".join(map(str, version)) if version else "the installed version"
            return (f"SGLang {shown} on node {self.node.name} does not accept {bad}; fix"
                    " target.extra_args or the target config")
        return None

    # -- measuring ---------------------------------------------------------------------------
    def server_settings(self, base_url: str) -> dict | None:
        return server_measure.settings_of(self.server_info(base_url))

    def server_info(self, base_url: str) -> dict | None:
        for path in self.features.server_info_paths:
            try:
                r = self.http.get(f"{base_url}{path}", timeout=10.0)
            except httpx.HTTPError:
                return None
            if r.status_code == 200:
                return r.json()
            if r.status_code != 404:
                return None
        return None

    def benchmark(self, base_url: str, requests: list[RequestSpec], log_path: Path) -> dict[str, float]:
        if (self.settings.bench_client or "builtin") == "bench_serving":
            return self._bench_serving(base_url, log_path.parent)
        return super().benchmark(base_url, requests, log_path)

    def bench_serving_argv(self, base_url: str, output_file: Path) -> list[str]:
        b, c = self.bench_settings, self.settings
        prefix = [str(a) for a in c.bench_serving_command]
        argv = prefix or [self.python, "-m", self.features.bench_serving_module]
        argv += ["--backend", "sglang", "--base-url", base_url, "--dataset-name", "random-ids",
                 "--num-prompts", str(b.requests), "--random-input-len", str(b.input_len),
                 "--random-output-len", str(b.output_len), "--random-range-ratio", "1.0",
                 "--max-concurrency", str(b.concurrency), "--seed", str(b.seed),
                 "--tokenize-prompt", "--warmup-requests", "0", "--disable-tqdm",
                 "--output-file", str(output_file)]
        if c.model_path:
            argv += ["--model", str(c.model_path)]
        return argv + [str(a) for a in c.bench_serving_args]

    def _bench_serving(self, base_url: str, out_dir: Path) -> dict[str, float]:
        """One bench_serving run into a fresh output file (bench_serving appends to it)."""
        self._repetition += 1
        output = out_dir / f"bench_serving.{self._repetition}.jsonl"
        output.unlink(missing_ok=True)
        b = self.bench_settings
        timeout = float(b.request_timeout_s) * max(1, b.requests) + 120
        run = run_command(self.bench_serving_argv(base_url, output), cwd=out_dir,
                          env=self.environment({}), timeout_s=timeout,
                          log_path=out_dir / "bench_serving.log")
        if run.timed_out:
            raise BenchError("hung", f"bench_serving did not finish within {timeout:g}s")
        if run.exit_code != 0:
            raise BenchError("http", f"bench_serving exited with code {run.exit_code}:"
                                     f" {run.tail}")
        metrics = parse_bench_serving(output, self.time_scale)
        wanted = b.requests
        if metrics.get("completed", wanted) < wanted:
            raise BenchError("http", f"bench_serving completed {metrics['completed']:g} of"
                                     f" {wanted} requests")
        return metrics

    def measure(self, base_url: str, requests: list[RequestSpec], log_path: Path) -> dict[str, float]:
        return server_measure.measure(self, base_url, requests, log_path,
                                      server_info=self.server_info)
