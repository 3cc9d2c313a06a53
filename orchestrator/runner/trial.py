"""One trial: prepare -> launch -> ready -> warm-up -> k repetitions -> teardown -> verify clean.

The trial (one server lifetime) is the statistical unit, so each step that can fail maps to a
distinct `Outcome`. A failure is recorded with its evidence (exit code, last log lines) and the
candidate counts as untestable for that trial, never as slow. Teardown always runs.

Two things are not the candidate's fault and must never make it untestable: a full disk (a
write under the run or the worktree cache fails with ENOSPC, or a failed trial finds its disk
nearly full) ends the trial `interrupted` with a detail starting with `NO_SPACE`, which stops
the run (resumable); and a clock or power limit that changes during the trial without this
trial setting it (another tool, another run on the same GPUs) marks the trial suspect.

Size: the one sequence of a server lifetime, step by step; each step's failure handling sits
beside the step it belongs to, so the ordering reads top to bottom.
"""

from __future__ import annotations

import errno
import json
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.bench.client import BenchError
from orchestrator.evidence import capture
from orchestrator.gpu.base import ClockPolicy, GpuControl
from orchestrator.packages import trial as packages
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult, TrialState
from orchestrator.runner.exits import killed_from_outside, oom_kills
from orchestrator.runner.process import (
    ServerProcess,
    TeardownReport,
    free_port,
    group_members,
    launch,
    read_environ,
)
from orchestrator.runner.telemetry import TelemetrySampler
from orchestrator.system import fingerprint, wallclock
from orchestrator.system.redact import redact_argv, scrub, secret_values
from orchestrator.targets.base import UNSET, Target
from orchestrator.ui.safe_text import printable
from orchestrator.workspace import Workspace

LOG_TAIL_BYTES = 16_384

# A trial that ran out of disk has a detail starting with this (and ends `interrupted`, unless
# it measured everything and only a last file could not be written); the controller stops the
# run (resumable) instead of retrying or counting the candidate untestable.
NO_SPACE = "no space left on device"
# A failed trial whose disk has less free space than this is taken to have failed for lack of
# it (a server that could not write its log dies in many ways).
LOW_SPACE_BYTES = 2 << 20


@dataclass(frozen=True)
class TrialSpec:
    """Everything a node needs to run one trial; plain values so it crosses Ray."""

    trial_id: int
    candidate: Candidate
    repo: str
    cache_dir: str
    trial_dir: str
    ready_timeout_s: float = 120.0
    grace_s: float = 10.0
    telemetry_interval_s: float = 0.5
    repetitions: int = 3
    warmup_requests: int = 2
    phase: str = ""
    extra: Mapping = field(default_factory=dict)
    cache_max_bytes: int | None = None


class TrialFailure(Exception):
    def __init__(self, outcome: Outcome, detail: str):
        super().__init__(detail)
        self.outcome = outcome
        self.detail = detail


def log_tail(path: Path, n_bytes: int = LOG_TAIL_BYTES) -> str:
    """The end of a server log, without terminal control sequences (it is shown to people)."""
    if not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        f.seek(max(0, size - n_bytes))
        return printable(f.read().decode(errors="replace"))


def last_lines(path: Path, n: int = 3) -> str:
    lines = [ln.strip() for ln in log_tail(path, 4096).splitlines() if ln.strip()]
    return " | ".join(lines[-n:])


def is_no_space(exc: BaseException) -> bool:
    """An error that means the disk (or quota) is full: ENOSPC/EDQUOT anywhere in its chain,
    or git's / SQLite's words for it (they report it in text, not as an errno)."""
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        text = str(seen)
        if ("No space left on device" in text or "Disk quota exceeded" in text
                or "database or disk is full" in text):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _free_bytes(path: Path) -> int | None:
    try:
        st = os.statvfs(path)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def clock_problem(policy: ClockPolicy, snapshot: Mapping) -> str:
    """Why a node's GPUs cannot take `policy` (one line), or "" when they can (or when the
    snapshot does not say: NVML fields it does not support are left out)."""
    for g in snapshot.get("gpus", []) or []:
        top = g.get("sm_clock_max_mhz")
        if policy.locked_mhz is not None and top and policy.locked_mhz > top:
            return (f"clock=locked:{policy.locked_mhz} is beyond GPU {g.get('index')}'s maximum"
                    f" SM clock of {top} MHz")
        power_max = g.get("power_limit_max_w")
        if policy.power_w is not None and power_max and policy.power_w > power_max:
            return (f"clock=power:{policy.power_w} is above GPU {g.get('index')}'s maximum power"
                    f" limit of {power_max:g} W")
    return ""


# Per-GPU readings that only change when someone sets them.
_CLOCK_SETTINGS = ("sm_clock_locked_mhz", "applications_clock_sm_mhz", "power_limit_w")


def clock_changes(before: Mapping, after: Mapping) -> list[str]:
    """Clock/power settings that differ between two snapshots of the same trial."""
    was = {g.get("index"): g for g in before.get("gpus", []) or []}
    out = []
    for g in after.get("gpus", []) or []:
        old = was.get(g.get("index"))
        if old is None:
            continue
        for key in _CLOCK_SETTINGS:
            if key in g and key in old and g[key] != old[key]:
                out.append(f"GPU {g.get('index')} {key} {old[key]} -> {g[key]}")
    return out


def _env_mismatches(proc: ServerProcess, wanted: Mapping[str, str]) -> list[str]:
    """Requested variables that are missing or different in any process of the server group."""
    problems = []
    for pid in [proc.pid, *[p for p in group_members(proc.pgid) if p != proc.pid]]:
        try:
            env = read_environ(pid)
        except OSError:
            continue  # exited meanwhile; the next step notices if it mattered
        for key, value in wanted.items():
            got = env.get(key)
            if value == UNSET:
                if got is not None:
                    problems.append(f"{key} requested unset but {got!r} in pid {pid}")
            elif got != value:
                shown = "missing" if got is None else f"{got!r}"
                problems.append(f"{key}={value!r} requested but {shown} in pid {pid}")
    return problems


def _scrub_log(log_path: Path, argv: list[str], env: dict[str, str]) -> None:
    """The server is gone: take out of its log the credentials it was handed (a server prints
    its arguments, `api_key='...'`), before the log's tail is kept in the store."""
    secrets = secret_values(argv, env)
    if not secrets or not log_path.exists():
        return
    try:
        text = log_path.read_text(errors="replace")
        clean = scrub(text, secrets)
        if clean != text:
            log_path.write_text(clean)
    except OSError:
        pass


def _server_environ(proc: ServerProcess) -> dict[str, str] | None:
    """The server's own environment, read once it is ready (a launcher that execs it has
    done so by then); None when it cannot be read (another user's process)."""
    try:
        return read_environ(proc.pid)
    except OSError:
        return None


# Readiness is polled every READY_POLL_S for the first READY_FAST_S (a fast server, the sim, a
# small model: each poll's latency is added to every trial), then less and less often, up to
# once a second (a large model loading for minutes does not need 20 probes a second).
READY_POLL_S = 0.05
READY_FAST_S = 10.0
READY_MAX_POLL_S = 1.0


def ready_delay(waited_s: float) -> float:
    """Seconds until the next readiness probe, `waited_s` after the launch."""
    if waited_s < READY_FAST_S:
        return READY_POLL_S
    return min(READY_MAX_POLL_S, READY_POLL_S * 1.5 ** ((waited_s - READY_FAST_S) / 2.0 + 1))


def _died(proc: ServerProcess, oom_at_launch: int | None, outcome: Outcome, when: str,
          evidence: str = "") -> TrialFailure:
    """The candidate's failure (`outcome`), unless the server was killed from outside (see
    `exits.py`): then the trial is `interrupted` and runs again."""
    code = proc.poll()
    sig = killed_from_outside(code, oom_at_launch, oom_kills())
    if sig is not None:
        return TrialFailure(Outcome.INTERRUPTED, f"the server was killed from outside ({sig})"
                            f" {when}; not the candidate's doing, it runs again")
    return TrialFailure(outcome, f"server exited with code {code} {when}"
                        + (f": {evidence}" if evidence else ""))


def _wait_ready(target: Target, proc: ServerProcess, timeout_s: float,
                oom_at_launch: int | None = None) -> None:
    started = time.monotonic()
    deadline = started + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise _died(proc, oom_at_launch, Outcome.LAUNCH_FAILED, "before it was ready",
                        last_lines(proc.log_path))
        if target.is_ready(proc.base_url):
            return
        if time.monotonic() > deadline:
            raise TrialFailure(
                Outcome.NOT_READY, f"server alive but not ready after {timeout_s:g}s"
            )
        time.sleep(ready_delay(time.monotonic() - started))


def _classify_bench_error(exc: BenchError, proc: ServerProcess | None, what: str,
                          oom_at_launch: int | None = None) -> TrialFailure:
    if proc is None:  # a benchmark command without a server: nothing else can have died
        if exc.kind == "hung":
            return TrialFailure(Outcome.HUNG, f"benchmark stalled during {what}: {exc}")
        return TrialFailure(Outcome.BENCH_FAILED, f"{what} failed: {exc}")
    # Give a dying server a moment to be reaped, so a crash is not misread as a hang.
    for _ in range(20):
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    code = proc.poll()
    if code is not None:
        return _died(proc, oom_at_launch, Outcome.CRASHED, f"during {what}",
                     last_lines(proc.log_path))
    if exc.kind == "hung":
        return TrialFailure(Outcome.HUNG, f"server alive but stalled during {what}: {exc}")
    return TrialFailure(Outcome.BENCH_FAILED, f"{what} failed with the server alive: {exc}")


def run_trial(
    spec: TrialSpec,
    target: Target,
    *,
    node: str = "",
    on_state: Callable[[TrialState], None] | None = None,
    on_process: Callable[[ServerProcess | None], None] | None = None,
    on_clock: Callable[[object], None] | None = None,
    workspace: Callable[[TrialSpec], Workspace] | None = None,
) -> tuple[TrialResult, TeardownReport | None]:
    """Run one trial to completion. Never raises for server misbehaviour: it is the result.

    `workspace` gives the spec's Workspace; a node passes one it keeps across its trials, so a
    worktree it verified and nothing touched since is not verified by git again."""
    trial_dir = Path(spec.trial_dir)
    log_path = trial_dir / "server.log"
    states: list[tuple[str, float]] = []
    started = wallclock.now()

    def enter(state: TrialState) -> None:
        states.append((state.value, wallclock.now()))
        if on_state:
            on_state(state)

    outcome, detail = Outcome.OK, ""
    measurements: list[Measurement] = []
    proc: ServerProcess | None = None
    report: TeardownReport | None = None
    fp: dict = {}
    argv: list[str] = []
    env: dict[str, str] = {}
    cand = spec.candidate
    gpu: GpuControl | None = None
    gpu_snapshot: dict = {}
    clock_token = None
    sampler: TelemetrySampler | None = None
    telemetry: dict = {}
    lease = None
    overlays = None
    oom_at_launch: int | None = None
    changed: list[str] = []
    no_space = False
    try:
        enter(TrialState.PREPARING)
        try:
            trial_dir.mkdir(parents=True, exist_ok=True)
            ws = (workspace(spec) if workspace is not None else
                  Workspace(spec.repo, spec.cache_dir, max_bytes=spec.cache_max_bytes))
            held = ws.lease(cand.commit, cand.patches)
            worktree = held.__enter__()  # held until teardown: the cache cap leaves it alone
            lease = held
            target.prepare(worktree, trial_dir)
            gpu = target.gpu_control()
            policy = ClockPolicy.parse(cand.clock)
            if not policy.is_default:
                problem = clock_problem(policy, gpu.snapshot())
                if problem:
                    raise ValueError(problem)
            clock_token = gpu.apply(policy)
            if on_clock and clock_token is not None:
                on_clock(clock_token)  # persisted, so a killed node still gets it restored
            gpu_snapshot = gpu.snapshot()
            overlays = packages.lease(spec.extra, cand.package_dict, target.python_executable())
        except Exception as exc:  # checkout, patch, build, clocks, overlays: cannot be tested
            if is_no_space(exc):
                raise
            raise TrialFailure(Outcome.PREPARE_FAILED, f"{type(exc).__name__}: {exc}") from exc

        env = target.environment(cand.env_dict)
        if overlays is not None:  # pinned packages first on PYTHONPATH / LD_LIBRARY_PATH
            env = target.environment({**cand.env_dict, **overlays.variables(env)})
        if target.has_server:
            enter(TrialState.LAUNCHING)
            port = free_port(target.host)
            oom_at_launch = oom_kills()
            argv = target.command(worktree, port)
            (trial_dir / "command.txt").write_text(" ".join(redact_argv(argv)) + "\n")
            proc = launch(argv, cwd=worktree, env=env, log_path=log_path, host=target.host,
                          port=port)
            if on_process:
                on_process(proc)
        else:  # only a benchmark command: no process to launch, probe or tear down
            argv = target.command(worktree, 0)
            (trial_dir / "command.txt").write_text(" ".join(redact_argv(argv)) + "\n")
        server = proc
        sampler = TelemetrySampler(gpu, spec.telemetry_interval_s, lambda: [
            *(group_members(server.pgid) if server is not None else []), *target.own_pids()
        ]).start()
        fp = fingerprint.collect(
            commit=cand.commit, patches=cand.patches, requested_env=cand.env_dict,
            server_env=env, node=node, gpu=gpu_snapshot, clock=cand.clock,
            dirty_diff=ws.worktree_diff_hash(worktree), packages=target.node_packages(),
        )

        if proc is not None:
            enter(TrialState.WAITING_READY)
            _wait_ready(target, proc, spec.ready_timeout_s, oom_at_launch)
            fingerprint.record_server_env(fp, env, _server_environ(proc))
            wanted = {**{str(k): str(v) for k, v in target.conf.get("env", {}).items()},
                      **cand.env_dict}
            problems = _env_mismatches(proc, wanted)
            if problems:
                raise TrialFailure(Outcome.ENV_MISMATCH, "; ".join(problems[:5]))
        base_url = proc.base_url if proc is not None else ""
        if overlays is not None:  # what the server really imported, before any measurement
            problems = packages.verify(target, overlays, proc, base_url, env, worktree, fp)
            if problems:
                raise TrialFailure(Outcome.ENV_MISMATCH, "; ".join(problems[:5]))

        enter(TrialState.WARMING_UP)
        if spec.warmup_requests > 0:
            try:
                target.warm_up(base_url, spec.warmup_requests)
            except BenchError as exc:
                raise _classify_bench_error(exc, proc, "warm-up", oom_at_launch) from exc

        enter(TrialState.BENCHMARKING)
        requests = target.requests()
        for rep in range(spec.repetitions):
            began = time.monotonic()
            try:
                metrics = target.measure(base_url, requests, log_path)
            except BenchError as exc:
                raise _classify_bench_error(exc, proc, f"repetition {rep + 1}",
                                            oom_at_launch) from exc
            measurements.append(Measurement(rep, metrics, time.monotonic() - began))
        if proc is not None and proc.poll() is not None:
            raise _died(proc, oom_at_launch, Outcome.CRASHED, "right after the benchmark")
        if gpu is not None:
            changed = clock_changes(gpu_snapshot, gpu.snapshot())
        profile = capture.wanted(spec.extra)
        if profile is not None:  # after the measured repetitions: it never touches the metric
            fp["profile"] = target.profile(base_url, trial_dir, profile)
    except TrialFailure as failure:
        outcome, detail = failure.outcome, failure.detail
        measurements = []
    except KeyboardInterrupt:
        outcome, detail, measurements = Outcome.INTERRUPTED, "interrupted", []
    except Exception as exc:  # our bug: recorded as such, never as a measurement
        no_space = is_no_space(exc)
        outcome, detail, measurements = Outcome.ERROR, f"{type(exc).__name__}: {exc}", []
    finally:
        enter(TrialState.TEARING_DOWN)
        if sampler is not None:
            telemetry = sampler.stop()
            fp["telemetry"] = {k: v for k, v in telemetry.items() if k != "samples"}
            try:
                (trial_dir / "telemetry.json").write_text(json.dumps(telemetry, indent=1))
            except OSError as exc:
                no_space = no_space or is_no_space(exc)
        if proc is not None:
            report = proc.teardown(grace_s=spec.grace_s)
            if on_process:
                on_process(None)
            if not report.clean and outcome is Outcome.OK:
                outcome = Outcome.TEARDOWN_FAILED
                detail = (f"after {report.signal_used}: leftover pids {list(report.leftover_pids)},"
                          f" port {'free' if report.port_free else 'still in use'}")
            fp["teardown"] = {"signal": report.signal_used, "exit_code": report.exit_code,
                              "clean": report.clean}
        _scrub_log(log_path, argv, env)
        if gpu is not None:
            try:
                gpu.restore(clock_token)  # always, also after a crash or an interrupt
                if on_clock and clock_token is not None:
                    on_clock(None)
            except Exception as exc:
                detail = f"{detail}; clock policy NOT restored: {exc}".lstrip("; ")
                outcome = Outcome.ERROR if outcome is Outcome.OK else outcome
        if lease is not None:
            lease.__exit__(None, None, None)
        if overlays is not None:
            overlays.release()
        enter(TrialState.DONE)
    if outcome is not Outcome.OK and outcome is not Outcome.INTERRUPTED and not no_space:
        free = _free_bytes(trial_dir if trial_dir.exists() else trial_dir.parent)
        no_space = free is not None and free < LOW_SPACE_BYTES
    if no_space:  # the disk, not the candidate: the run stops (resumable)
        if outcome is not Outcome.OK:  # and this trial runs again on resume
            outcome, measurements = Outcome.INTERRUPTED, []
        detail = (f"{NO_SPACE} on node {node} (under {trial_dir.parent})"
                  + (f": {detail}" if detail else ""))
    suspect = [str(telemetry.get("suspect_reason", ""))] if telemetry.get("suspect") else []
    if changed:
        suspect.append("clock/power changed during the trial, not by this run: "
                       + "; ".join(changed[:4]))
    return TrialResult(
        outcome=outcome,
        detail=printable(detail),
        measurements=tuple(measurements),
        states=tuple(states),
        started_at=started,
        ended_at=wallclock.now(),
        node=node,
        fingerprint=fp,
        log_tail=log_tail(log_path),
        suspect=bool(suspect),
        suspect_reason="; ".join(suspect),
    ), report
