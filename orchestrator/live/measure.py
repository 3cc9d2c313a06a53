"""The bench against the running server, and against a fresh start of its command.

Both use the same protocol as every trial (`runner/trial.py`): warm-up requests, then the
measured repetitions through the target's `measure` (client metrics and the server's phase
metrics bracketing each repetition), GPU telemetry sampled meanwhile, and a fingerprint of what
the server runs with. The running server was not started by sleuth: its row records no launch
and no teardown, and it stays up. A fresh start runs the server's own command line in its own
working directory and environment, as a process group that dies with sleuth, and is torn down
and verified gone (processes, port) before the next one.

A repetition against a live server that other clients are using counts their requests too
(SGLang's phase counters are the server's): measure it while it is drained of other traffic.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from orchestrator.bench.client import BenchError
from orchestrator.live.attach import LiveServer
from orchestrator.live.proc import rss_bytes
from orchestrator.records import Measurement, Outcome, TrialResult, TrialState
from orchestrator.runner.telemetry import TelemetrySampler
from orchestrator.runner.trial_checks import TrialFailure, log_tail, server_environ, wait_ready
from orchestrator.system import fingerprint
from orchestrator.targets.base import Target
from orchestrator.util import wallclock
from orchestrator.util.process import ServerProcess, group_members, launch

PHASE_LIVE = "live"
PHASE_FRESH = "fresh"


@dataclass(frozen=True)
class Protocol:
    """How each side is measured: the trials' own settings."""

    repetitions: int
    warmup_requests: int
    ready_timeout_s: float
    grace_s: float
    telemetry_interval_s: float


@dataclass
class _Side:
    states: list[tuple[str, float]]
    measurements: list[Measurement]
    telemetry: dict


def _bench(target: Target, url: str, log_path: Path, protocol: Protocol, gpu,
           pids: Callable[[], Sequence[int]], states: list[tuple[str, float]]) -> _Side:
    """Warm-up and the measured repetitions, with telemetry; BenchError propagates."""
    sampler = TelemetrySampler(gpu, protocol.telemetry_interval_s, pids).start()
    measurements: list[Measurement] = []
    try:
        states.append((TrialState.WARMING_UP.value, wallclock.now()))
        if protocol.warmup_requests > 0:
            target.warm_up(url, protocol.warmup_requests)
        states.append((TrialState.BENCHMARKING.value, wallclock.now()))
        requests = target.requests()
        for rep in range(protocol.repetitions):
            began = time.monotonic()
            metrics = target.measure(url, requests, log_path)
            measurements.append(Measurement(rep, metrics, time.monotonic() - began))
    finally:
        telemetry = sampler.stop()
    return _Side(states, measurements, telemetry)


def _fingerprint(target: Target, server: LiveServer, env, gpu_snapshot: dict, commit: str,
                 url: str, pids: Sequence[int], telemetry: dict, node: str) -> dict:
    fp = fingerprint.collect(commit=commit, patches=[], requested_env={}, server_env=env,
                             node=node, gpu=gpu_snapshot, clock="default",
                             packages=_packages(target, url, pids, env, server.cwd))
    fingerprint.record_server_env(fp, env, env)
    settings = target.server_settings(url)
    if settings:
        fp["server_args"] = settings
    fp["telemetry"] = {k: v for k, v in telemetry.items() if k != "samples"}
    return fp


class _Proc:
    """What a package probe needs of a server it did not launch."""

    def __init__(self, pids: Sequence[int]):
        from orchestrator.live.proc import process_group

        self.pid = pids[0]
        self.pgid = process_group(self.pid) or self.pid


def _packages(target: Target, url: str, pids: Sequence[int], env, cwd: str | None
              ) -> dict[str, str] | None:
    """The versions the server imported (the sim reports its own; a real server is probed
    under its own interpreter and environment), else the node's listing."""
    from orchestrator.system.fingerprint import PACKAGES

    if not pids:
        return target.node_packages()
    try:
        report = target.imported_packages(_Proc(pids), url, env, Path(cwd or "/"),
                                          list(PACKAGES), ["libnccl.so.2"])
    except (RuntimeError, OSError):
        return target.node_packages()
    found = {name: info["version"] for name, info in (report.get("packages") or {}).items()
             if isinstance(info, dict) and info.get("version")}
    return found or target.node_packages()


def measure_running(target: Target, server: LiveServer, trial_dir: Path, protocol: Protocol,
                    commit: str, node: str = "live") -> TrialResult:
    """The running server as it is: no launch, no teardown (it stays up)."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    gpu = target.gpu_control()
    states = [(TrialState.BENCHMARKING.value, wallclock.now())]
    started = wallclock.now()
    snapshot = gpu.snapshot()
    pids = list(server.pids)
    # Never the live server's own log: sleuth writes beside the log it is given.
    log_path = trial_dir / "server.log"
    try:
        side = _bench(target, server.url, log_path, protocol, gpu, lambda: pids, states)
    except BenchError as exc:
        return TrialResult(Outcome.BENCH_FAILED, f"the running server failed the bench: {exc}",
                           states=tuple(states), started_at=started, ended_at=wallclock.now(),
                           node=node)
    fp = _fingerprint(target, server, dict(server.env), snapshot, commit, server.url, pids,
                      side.telemetry, node)
    fp["live"] = live_facts(server, rss_after=rss_bytes(pids))
    states.append((TrialState.DONE.value, wallclock.now()))
    return _result(Outcome.OK, "", side, started, node, fp, "")


def live_facts(server: LiveServer, rss_after: int | None = None) -> dict:
    """What sleuth saw of the running server's state (its row's fingerprint keeps it)."""
    return {"pid": server.pid, "url": server.url, "uptime_s": server.uptime_s,
            "rss_bytes": server.rss_bytes, "rss_bytes_after": rss_after,
            "log": server.log_path}


def measure_fresh(target: Target, server: LiveServer, trial_dir: Path, protocol: Protocol,
                  commit: str, node: str = "live") -> tuple[TrialResult, int | None]:
    """A fresh start of the server's own command, measured and torn down; returns its result
    and its resident memory after the bench (what the running server's is compared with)."""
    trial_dir.mkdir(parents=True, exist_ok=True)
    gpu = target.gpu_control()
    started = wallclock.now()
    states = [(TrialState.LAUNCHING.value, started)]
    log_path = trial_dir / "server.log"
    parsed = urlparse(server.url)
    (trial_dir / "command.txt").write_text(_command_text(server))
    proc: ServerProcess | None = None
    rss = None
    fp: dict = {}
    side = _Side(states, [], {})
    outcome, detail = Outcome.OK, ""
    try:
        proc = launch(list(server.argv), cwd=Path(str(server.cwd)), env=dict(server.env),
                      log_path=log_path, host=parsed.hostname or "127.0.0.1",
                      port=int(parsed.port or 80))
        states.append((TrialState.WAITING_READY.value, wallclock.now()))
        wait_ready(target, proc, protocol.ready_timeout_s)
        snapshot = gpu.snapshot()
        group = proc.pgid
        side = _bench(target, proc.base_url, log_path, protocol, gpu,
                      lambda: group_members(group), states)
        members = group_members(group) or [proc.pid]
        rss = rss_bytes(members)
        fp = _fingerprint(target, server, server_environ(proc) or dict(server.env), snapshot,
                          commit, proc.base_url, members, side.telemetry, node)
    except TrialFailure as failure:
        outcome, detail = failure.outcome, failure.detail
    except BenchError as exc:
        outcome, detail = Outcome.BENCH_FAILED, f"a fresh start failed the bench: {exc}"
    finally:
        states.append((TrialState.TEARING_DOWN.value, wallclock.now()))
        if proc is not None:
            report = proc.teardown(grace_s=protocol.grace_s)
            fp["teardown"] = {"signal": report.signal_used, "exit_code": report.exit_code,
                              "clean": report.clean}
            if not report.clean and outcome is Outcome.OK:
                outcome = Outcome.TEARDOWN_FAILED
                detail = (f"after {report.signal_used}: leftover pids"
                          f" {list(report.leftover_pids)}, port"
                          f" {'free' if report.port_free else 'still in use'}")
    states.append((TrialState.DONE.value, wallclock.now()))
    if fp:
        fp["live"] = {"fresh_start_of": server.pid, "rss_bytes_after": rss}
    return _result(outcome, detail, side, started, node, fp, log_tail(log_path)), rss


def _command_text(server: LiveServer) -> str:
    from orchestrator.system.redact import redact_argv

    return " ".join(redact_argv(list(server.argv))) + "\n"


def _result(outcome: Outcome, detail: str, side: _Side, started: float, node: str, fp: dict,
            tail: str) -> TrialResult:
    telemetry = side.telemetry or {}
    suspect = bool(telemetry.get("suspect"))
    return TrialResult(
        outcome=outcome, detail=detail,
        measurements=tuple(side.measurements) if outcome is Outcome.OK else (),
        states=tuple(side.states), started_at=started, ended_at=wallclock.now(), node=node,
        fingerprint=fp, log_tail=tail, suspect=suspect and outcome is Outcome.OK,
        suspect_reason=str(telemetry.get("suspect_reason", "")) if suspect else "")

