"""Adapter for any git repository with a benchmark command (`target=command`).

    sleuth bisect target=command repo=R good=G bad=B 'target.bench=python bench.py'

The metric is `value` (the bench's bare number) unless `metric=` names one of its JSON keys.

Config keys (all run in the trial's worktree, as argv split with `shlex`, never through a shell
unless `target.shell=true`):

- `target.bench` (required): one repetition. Its last line of stdout is a JSON object of
  metrics (`{"value": 1.23, "p99_ms": 4.5}`) or a bare number, which becomes the metric `value`.
- `target.build` (optional): run once per worktree before its first trial, cached by the
  worktree key (commit SHA + patch-set hash) and the build command itself. A failing build makes
  the commit untestable (skipped), never "slow".
- `target.pythonpath` (default `[., src]`): worktree directories put first on PYTHONPATH (those
  that exist), so a bench script kept outside the repository (`python /srv/bench/b.py`)
  imports the commit's own package, not an installed copy, without any `sys.path` edits.
- `target.profile` (optional): with a profile wanted (`trial.profile=true`, or the kernel
  evidence after an answer), one more run after the repetitions, of this command (default: the
  bench itself) with `SLEUTH_PROFILE_TRACE` set to the file it should write a torch profiler /
  Chrome trace to; sleuth keeps it compressed in the trial directory and diffs its kernels.
- `target.server` + `target.ready_url` (optional): a server launched for the trial like any
  other (own process group, readiness, teardown); `{port}`, `{host}` and `{base_url}` in the
  server, ready URL and bench strings are replaced, and the bench also sees `SLEUTH_BASE_URL`.
  Without `ready_url` the server is ready once its port accepts connections. Without a server
  the trial has no process to launch or tear down: only the bench command runs, k times.

`bench.repetitions` runs make a trial; with `bench.warmup_requests > 0` one unmeasured run comes
first. Every command runs in its own process group with a timeout, and the whole group is killed
when the command exits, so a benchmark cannot leave a stray process holding a GPU or a port.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx

from orchestrator.bench.client import BenchError, RequestSpec
from orchestrator.config.schema import BenchConf, CommandTargetConf
from orchestrator.targets.base import Target
from orchestrator.util.process import dying_with_parent, group_members
from orchestrator.workspace.locking import LOCKS_DIRNAME, exclusive_lock

BUILD_MARKER = ".sleuth-build.json"
TAIL_CHARS = 600


@dataclass(frozen=True)
class CommandRun:
    exit_code: int | None  # None when it was killed at the timeout
    timed_out: bool
    stdout: str
    tail: str  # the last lines of its output, for a one-line failure message
    duration_s: float


def _kill_group(pgid: int, wait_s: float = 5.0) -> None:
    """SIGKILL the group and wait (briefly) until none of it is left."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return
    deadline = time.monotonic() + wait_s
    while group_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.02)


def run_command(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_s: float,
    log_path: Path,
    on_start=None,
) -> CommandRun:
    """Run `argv` as the leader of a new process group; stdout is captured, stdout and stderr
    are appended to `log_path`. At the timeout, and after a normal exit (stragglers it left in
    the background), the whole group is killed."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with open(log_path, "ab") as log:
        log.write(f"$ {shlex.join(argv)}\n".encode())
        log.flush()
        spawn, preexec = dying_with_parent(argv, cwd, env)
        proc = subprocess.Popen(spawn, cwd=cwd, env=dict(env), stdin=subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=log, start_new_session=True,
                                preexec_fn=preexec)
        if on_start:
            on_start(proc.pid)
        timed_out = False
        try:
            out, _ = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(proc.pid)
            out, _ = proc.communicate()
        finally:
            _kill_group(proc.pid)
            if on_start:
                on_start(None)
        log.write(out)
    stdout = out.decode(errors="replace")
    text = log_path.read_bytes()[-4096:].decode(errors="replace")
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    tail = " | ".join(lines[-3:])[-TAIL_CHARS:]
    return CommandRun(None if timed_out else proc.returncode, timed_out, stdout, tail,
                      time.monotonic() - started)


def parse_bench_output(stdout: str) -> dict[str, float]:
    """Metrics from the last non-empty stdout line: a JSON object or a bare number (`value`)."""
    lines = [ln.strip() for ln in stdout.splitlines() if ln.strip()]
    if not lines:
        raise BenchError("http", "the bench command printed nothing; its last line must be a"
                                 " JSON object of metrics or a number")
    last = lines[-1]
    try:
        doc = json.loads(last)
    except json.JSONDecodeError:
        raise BenchError("http", "the last line of the bench output is neither a JSON object"
                                 f" nor a number: {last[:120]!r}") from None
    if isinstance(doc, bool):
        raise BenchError("http", f"the bench printed a boolean, not a metric: {last[:120]!r}")
    if isinstance(doc, int | float):
        doc = {"value": doc}
    if not isinstance(doc, dict):
        raise BenchError("http", f"the bench's last line is JSON but not an object: {last[:120]!r}")
    metrics = {str(k): float(v) for k, v in doc.items()
               if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}
    if not metrics:
        raise BenchError("http", f"the bench's JSON has no finite numeric metric: {last[:120]!r}")
    return metrics


class CommandTarget(Target):
    name = "command"

    def __init__(self, conf: CommandTargetConf | Mapping, bench: BenchConf | Mapping, node):
        super().__init__(conf, bench, node)
        self._worktree: Path | None = None
        self._trial_dir = node.state_dir
        self._trial_env: dict[str, str] | None = None
        self._running_pgid: int | None = None

    @property
    def has_server(self) -> bool:
        return bool(self.settings.server.strip())

    def _fill(self, text: str, base_url: str = "", port: int | None = None) -> str:
        if port is None and base_url:
            port = int(base_url.rsplit(":", 1)[1])
        for key, value in (("{port}", "" if port is None else str(port)), ("{host}", self.host),
                           ("{base_url}", base_url or (f"http://{self.host}:{port}"
                                                       if port is not None else ""))):
            text = text.replace(key, value)
        return text

    def argv(self, text: str) -> list[str]:
        """A configured command line as argv: shlex-split, or `sh -c` when target.shell=true."""
        if self.settings.shell:
            return ["/bin/sh", "-c", text]
        return shlex.split(text)

    def preflight(self) -> str | None:
        """Every configured command line must split into an argv."""
        for key in ("bench", "build", "server"):
            text = str(getattr(self.settings, key) or "")
            if key == "bench" and not text.strip():
                return "target.bench is empty: give the benchmark command to run"
            try:
                self.argv(text)
            except ValueError as exc:
                return f"target.{key} cannot be split into arguments ({exc}): {text!r}"
        return None

    def python_executable(self) -> str:
        """`target.python`, else the first word of the server (or bench) command when it is a
        Python interpreter (found on the trial's PATH), else sleuth's own: package overlays
        are built for it."""
        from orchestrator.packages.probe import python_invocation

        if self.settings.python:
            return self.settings.python
        text = self.settings.server or self.settings.bench or ""
        try:
            invocation = python_invocation(self.argv(self._fill(text, port=0)), ".")
        except ValueError:
            invocation = None
        if invocation is not None:
            found = shutil.which(invocation[0][0], path=(self._trial_env or os.environ).get("PATH"))
            if found:
                return found
        return sys.executable

    def command(self, worktree: Path, port: int) -> list[str]:
        """The server's argv; without a server, the benchmark's (for the trial's record)."""
        if self.has_server:
            return self.launcher() + self.argv(self._fill(self.settings.server, port=port))
        return self.launcher() + self.argv(self._fill(self.settings.bench, port=port))

    # -- build ---------------------------------------------------------------------------------
    def prepare(self, worktree: Path, trial_dir: Path) -> None:
        self._worktree, self._trial_dir, self._trial_env = worktree, trial_dir, None
        build = self.settings.build.strip()
        if build:
            self.build(worktree, build, trial_dir / "build.log")

    def build(self, worktree: Path, build: str, log_path: Path) -> bool:
        """Run the build once per worktree; True when it ran now, False when it was cached.

        The marker lives inside the worktree: when the worktree is rebuilt (damaged, pruned)
        the marker goes with it and the build runs again. A lock serialises two nodes of one
        machine that want the same worktree at once."""
        key = {"worktree": worktree.name, "build": build}
        marker = worktree / BUILD_MARKER
        with exclusive_lock(worktree.parent / LOCKS_DIRNAME / f"{worktree.name}.build.lock"):
            try:
                if json.loads(marker.read_text()) == key:
                    return False
            except (OSError, ValueError):
                pass
            timeout = float(self.settings.build_timeout_s or 3600)
            run = run_command(self.argv(build), cwd=worktree,
                              env=self._with_worktree_path(super().environment({})),
                              timeout_s=timeout, log_path=log_path, on_start=self._track)
            if run.timed_out:
                raise RuntimeError(f"build did not finish within {timeout:g}s: {run.tail}")
            if run.exit_code != 0:
                raise RuntimeError(f"build failed with exit code {run.exit_code}: {run.tail}")
            marker.write_text(json.dumps(key) + "\n")
            return True

    # -- server --------------------------------------------------------------------------------
    def is_ready(self, base_url: str) -> bool:
        url = self.settings.ready_url.strip()
        if url:
            try:
                r = self.http.get(self._fill(url, base_url), timeout=5.0)
            except httpx.HTTPError:
                return False
            return 200 <= r.status_code < 300
        host, port = base_url.split("//", 1)[1].rsplit(":", 1)
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                return True
        except OSError:
            return False

    def scrape(self, base_url: str) -> dict | None:
        return None  # a generic server exports no SGLang counters

    # -- benchmark -----------------------------------------------------------------------------
    def environment(self, candidate_env: Mapping[str, str]) -> dict[str, str]:
        """The trial's environment; kept, because the bench command needs it as much as a server.
        The worktree's own code comes first on PYTHONPATH (:meth:`_with_worktree_path`)."""
        self._trial_env = self._with_worktree_path(super().environment(candidate_env))
        return self._trial_env

    def _with_worktree_path(self, env: dict[str, str]) -> dict[str, str]:
        """`target.pythonpath` (default `.` and `src`), those that exist in the worktree, go
        first on PYTHONPATH: a bench script kept outside the repository then imports the
        commit being measured, not a copy installed in the environment. Entries already on
        PYTHONPATH (from the node or the candidate) keep their order after them."""
        if self._worktree is None:
            return env
        own = [str(self._worktree / p) for p in self.settings.pythonpath
               if (self._worktree / p).is_dir()]
        if own:
            rest = [p for p in (env.get("PYTHONPATH") or "").split(os.pathsep) if p]
            env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*own, *rest]))
        return env

    def _track(self, pid: int | None) -> None:
        self._running_pgid = pid

    def own_pids(self) -> list[int]:
        pgid = self._running_pgid
        return group_members(pgid) if pgid else []

    def run_bench(self, base_url: str, log_path: Path, command: str | None = None,
                  extra_env: Mapping[str, str] | None = None) -> dict[str, float]:
        """One run of the bench command (or `command`) in the worktree; its metrics."""
        if self._worktree is None:
            raise BenchError("http", "the bench command ran before its worktree was prepared")
        env = dict(self._trial_env or self._with_worktree_path(super().environment({})))
        env.update(extra_env or {})
        if base_url:
            env["SLEUTH_BASE_URL"] = base_url
        timeout = float(self.settings.bench_timeout_s or 600)
        argv = self.argv(self._fill(str(command or self.settings.bench), base_url))
        if not self.has_server:  # the bench is the workload: numactl & co. apply to it
            argv = self.launcher() + argv
        run = run_command(argv, cwd=self._worktree, env=env, timeout_s=timeout,
                          log_path=log_path, on_start=self._track)
        if run.timed_out:
            raise BenchError("hung", f"the bench command did not finish within {timeout:g}s")
        if run.exit_code != 0:
            raise BenchError("http", f"the bench command exited with code {run.exit_code}:"
                                     f" {run.tail}")
        return parse_bench_output(run.stdout)

    supports_profile = True  # through the bench itself: SLEUTH_PROFILE_TRACE names its trace

    def profile(self, base_url: str, trial_dir: Path, settings: Mapping) -> dict:
        """One more, unmeasured run after the repetitions, of `target.profile` (else the bench)
        with `SLEUTH_PROFILE_TRACE` naming the file it should write its torch profiler / Chrome
        trace to (`prof.export_chrome_trace(os.environ["SLEUTH_PROFILE_TRACE"])`)."""
        from orchestrator.evidence import capture

        path = trial_dir / "bench-trace.json"

        def run() -> dict:
            try:
                self.run_bench(base_url, trial_dir / "profile.log",
                               command=self.settings.profile or None,
                               extra_env={capture.TRACE_ENV: str(path)})
                return capture.capture_file(path, trial_dir)
            finally:
                path.unlink(missing_ok=True)

        return capture.guarded(run)

    def warm_up(self, base_url: str, n_requests: int) -> None:
        """One unmeasured run of the bench command (imports, caches, JIT, GPU clocks)."""
        self.run_bench(base_url, self._trial_dir / "warmup.log")

    def measure(self, base_url: str, requests: list[RequestSpec], log_path: Path) -> dict[str, float]:
        return self.run_bench(base_url, log_path)
