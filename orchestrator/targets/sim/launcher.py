"""Launching the sim server: a node's launcher wrapper, and a test helper that runs a server.

**The wrapper** (`python -m orchestrator.targets.sim.launcher --strip A,B -- ARGV...`) models
what sits between a tool and the server on a real node: a container entrypoint, a systemd unit,
`sudo` with `env_reset`, a site wrapper script. Like `docker run -e NAME` or `sudo
--preserve-env=NAMES`, it forwards the variables the launching tool names explicitly
(`SLEUTH_SIM_LAUNCHER_PASS`, set by the sim target from what the trial requested) and drops the
listed ones it inherited from the node, then execs the server in its place (same pid, so
`/proc/<pid>/environ` is the server's). A node's wrapper is part of its state
(`<node state>/launcher.json`: `{"strip": ["NCCL_ALGO"]}`), not of sleuth's configuration:
it is the "NCCL variables never reached the server" the seed suspected. `--drop` (`"drop"` in
`launcher.json`) removes variables even when they were passed explicitly, as `sudo` and the
dynamic linker do with `LD_LIBRARY_PATH` for a privileged program: a package overlay whose
libraries never reach the server.

**The helper** (`run_sim`) runs a server in its own session (process group) for tests and tools
(a scenario's old log) and kills the whole group with SIGKILL on exit from the context,
whatever happened inside it, so no test leaves a server behind. A test's HTTP calls on it are
the tests' own (`tests/sim_client.py`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PASS_VAR = "SLEUTH_SIM_LAUNCHER_PASS"


def wrapped_environment(env: dict[str, str], strip: list[str],
                        drop: list[str] | tuple[str, ...] = ()) -> dict[str, str]:
    """What the wrapper hands the server: `env` without the stripped variables, except those
    the tool asked for explicitly (named in :data:`PASS_VAR`), without the dropped ones in
    any case, and without its own marker."""
    env = dict(env)
    passed = {v for v in env.pop(PASS_VAR, "").split(",") if v}
    for var in strip:
        if var not in passed:
            env.pop(var, None)
    for var in drop:
        env.pop(var, None)
    return env


def main(argv: Sequence[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orchestrator.targets.sim.launcher",
                                     description="a node launcher that drops inherited variables")
    parser.add_argument("--strip", default="", help="comma-separated variables to drop unless"
                        " passed explicitly")
    parser.add_argument("--drop", default="", help="comma-separated variables to drop always")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ARGV of the server")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command to run after --")
    env = wrapped_environment(dict(os.environ), [v for v in args.strip.split(",") if v],
                              [v for v in args.drop.split(",") if v])
    os.execvpe(command[0], command, env)


@dataclass
class SimProcess:
    process: subprocess.Popen
    port: int
    log_path: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def status(self, path: str, timeout: float = 2.0) -> int | None:
        """HTTP status of GET `path`, or None if nothing answers."""
        try:
            with urllib.request.urlopen(self.base_url + path, timeout=timeout) as resp:
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)
        except (urllib.error.URLError, OSError):
            return None

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until /health is 200; raises RuntimeError (with the log) if it exits or times out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"sim exited {self.process.returncode} before ready:\n{self.log()}"
                )
            if self.status("/health", timeout=1.0) == 200:
                return
            time.sleep(0.02)
        raise RuntimeError(f"sim not ready after {timeout}s:\n{self.log()}")

    def kill(self) -> None:
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=10)


@contextlib.contextmanager
def run_sim(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str],
    log_path: str | os.PathLike[str],
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    wait_ready: bool = True,
    ready_timeout: float = 30.0,
) -> Iterator[SimProcess]:
    """`python -m orchestrator.targets.sim --port P *args` in `cwd`; killed on exit."""
    from orchestrator.util.process import free_port  # not for the wrapper, which execs at once

    port = port or free_port()
    argv = [sys.executable, "-m", "orchestrator.targets.sim", "--port", str(port), *args]
    if "--model-path" not in args:
        argv += ["--model-path", "sim/kimi-k2.5"]
    full_env = dict(os.environ if env is None else env)
    # The server imports sleuth from wherever this process does, even with cwd = another repo.
    root = str(Path(__file__).resolve().parents[3])
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, full_env.get("PYTHONPATH")) if p)
    log_file = open(log_path, "wb")  # noqa: SIM115 - closed in finally
    try:
        proc = subprocess.Popen(
            argv, cwd=cwd, env=full_env, stdout=log_file, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        sim = SimProcess(proc, port, Path(log_path))
        try:
            if wait_ready:
                sim.wait_ready(ready_timeout)
            yield sim
        finally:
            sim.kill()
    finally:
        log_file.close()


if __name__ == "__main__":
    main()
