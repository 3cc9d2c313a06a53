"""One trial: prepare -> launch -> ready -> warm-up -> k repetitions -> teardown -> verify clean.

The trial (one server lifetime) is the statistical unit, so each step that can fail maps to a
distinct `Outcome` (the checks and the classification are in `trial_checks.py`). A failure is
recorded with its evidence (exit code, last log lines) and the candidate counts as untestable
for that trial, never as slow. Teardown always runs: every resource's release is on one
ExitStack, so each runs even when one released before it raises.

Two things are not the candidate's fault and must never make it untestable: a full disk (a
write under the run or the worktree cache fails with ENOSPC, or a failed trial finds its disk
nearly full) ends the trial `interrupted` with a detail starting with `NO_SPACE`, which stops
the run (resumable); and a clock or power limit that changes during the trial without this
trial setting it (another tool, another run on the same GPUs) marks the trial suspect.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.bench.client import BenchError
from orchestrator.evidence import capture
from orchestrator.gpu.base import ClockPolicy, GpuControl
from orchestrator.packages import trial as packages
from orchestrator.packages.overlay import OverlaySet
from orchestrator.records import Candidate, Measurement, Outcome, TrialResult, TrialState
from orchestrator.runner import lifetime, visibility
from orchestrator.runner.exits import oom_kills
from orchestrator.runner.telemetry import TelemetrySampler
from orchestrator.runner.trial_checks import (
    LOW_SPACE_BYTES,
    NO_SPACE,
    TrialFailure,
    classify_bench_error,
    clock_changes,
    clock_problem,
    died,
    env_mismatches,
    free_bytes,
    is_no_space,
    log_tail,
    scrub_log,
    server_environ,
    wait_ready,
)
from orchestrator.system import fingerprint
from orchestrator.system.redact import redact_argv, scrub, secret_values
from orchestrator.targets.base import Target
from orchestrator.util import wallclock
from orchestrator.util.process import (
    ServerProcess,
    TeardownReport,
    free_port,
    group_members,
    launch,
)
from orchestrator.util.safe_text import printable
from orchestrator.workspace import Workspace

# `run_trial` without a node's GPUs to check against (a trial run outside a node actor).
NOT_CHECKED = object()


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


@dataclass
class _Trial:
    """What one trial's steps share: its spec and callbacks, what each step acquired or found,
    and the outcome so far. Each step reads and fills it; `_result` turns it into the record."""

    spec: TrialSpec
    target: Target
    node: str
    on_state: Callable[[TrialState], None] | None
    on_process: Callable[[ServerProcess | None], None] | None
    on_clock: Callable[[object], None] | None
    started: float = field(default_factory=wallclock.now)
    states: list[tuple[str, float]] = field(default_factory=list)
    outcome: Outcome = Outcome.OK
    detail: str = ""
    measurements: list[Measurement] = field(default_factory=list)
    ws: Workspace | None = None
    worktree: Path = Path()
    gpu: GpuControl | None = None
    gpu_snapshot: dict = field(default_factory=dict)
    clock_token: object = None
    overlays: OverlaySet | None = None
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    proc: ServerProcess | None = None
    oom_at_launch: int | None = None
    report: TeardownReport | None = None
    fp: dict = field(default_factory=dict)
    telemetry: dict = field(default_factory=dict)
    changed: list[str] = field(default_factory=list)
    no_space: bool = False
    node_gpus: object = NOT_CHECKED  # the node's CUDA_VISIBLE_DEVICES (None: unset)

    @property
    def trial_dir(self) -> Path:
        return Path(self.spec.trial_dir)

    @property
    def log_path(self) -> Path:
        return self.trial_dir / "server.log"

    @property
    def base_url(self) -> str:
        return self.proc.base_url if self.proc is not None else ""

    def enter(self, state: TrialState) -> None:
        self.states.append((state.value, wallclock.now()))
        if self.on_state:
            self.on_state(state)

    def fail(self, outcome: Outcome, detail: str) -> None:
        """The trial ends `outcome`: nothing it measured counts."""
        self.outcome, self.detail, self.measurements = outcome, detail, []


def run_trial(
    spec: TrialSpec,
    target: Target,
    *,
    node: str = "",
    on_state: Callable[[TrialState], None] | None = None,
    on_process: Callable[[ServerProcess | None], None] | None = None,
    on_clock: Callable[[object], None] | None = None,
    workspace: Callable[[TrialSpec], Workspace] | None = None,
    node_gpus: object = NOT_CHECKED,
) -> tuple[TrialResult, TeardownReport | None]:
    """Run one trial to completion. Never raises for server misbehaviour: it is the result.

    Each step pushes the release of what it acquires onto one ExitStack as soon as it holds
    it (the target's HTTP client, worktree lease, clock policy, package overlays, log scrub,
    server, telemetry), and the stack releases them last-acquired first at teardown. Every
    release runs even when one before it raises (that error then propagates, as before, after
    the last release): the clock policy is restored and the worktree lease given back
    whatever happened earlier.

    `workspace` gives the spec's Workspace; a node passes one it keeps across its trials, so a
    worktree it verified and nothing touched since is not verified by git again.

    `node_gpus`: the node's own `CUDA_VISIBLE_DEVICES` (None when unset: every GPU), which the
    server must see unless the run sets the variable itself (`runner/visibility.py`)."""
    t = _Trial(spec, target, node, on_state, on_process, on_clock, node_gpus=node_gpus)
    with ExitStack() as teardown:
        try:
            _prepare(t, teardown, workspace)
            _launch(t, teardown)
            _check_server(t)
            _benchmark(t)
        except TrialFailure as failure:
            t.fail(failure.outcome, failure.detail)
        except KeyboardInterrupt:
            t.fail(Outcome.INTERRUPTED, "interrupted")
        except Exception as exc:  # our bug: recorded as such, never as a measurement
            t.no_space = is_no_space(exc)
            t.fail(Outcome.ERROR, f"{type(exc).__name__}: {exc}")
        finally:
            t.enter(TrialState.TEARING_DOWN)
    t.enter(TrialState.DONE)
    return _result(t), t.report


def _prepare(t: _Trial, teardown: ExitStack, workspace: Callable[[TrialSpec], Workspace] | None,
             ) -> None:
    """Worktree, build, clock policy, package overlays. A failure here means the candidate
    cannot be tested (PREPARE_FAILED), unless the disk is full."""
    t.enter(TrialState.PREPARING)
    spec, cand, target = t.spec, t.spec.candidate, t.target
    teardown.callback(target.close)  # its HTTP client: last, after the server is gone
    try:
        t.trial_dir.mkdir(parents=True, exist_ok=True)
        t.ws = (workspace(spec) if workspace is not None else
                Workspace(spec.repo, spec.cache_dir, max_bytes=spec.cache_max_bytes))
        # Held until teardown: the cache's size cap leaves the worktree alone meanwhile.
        t.worktree = teardown.enter_context(t.ws.lease(cand.commit, cand.patches))
        target.prepare(t.worktree, t.trial_dir)
        t.gpu = target.gpu_control()
        teardown.callback(_restore_clock, t)
        policy = ClockPolicy.parse(cand.clock)
        if not policy.is_default:
            problem = clock_problem(policy, t.gpu.snapshot())
            if problem:
                raise ValueError(problem)
        t.clock_token = t.gpu.apply(policy)
        if t.on_clock and t.clock_token is not None:
            t.on_clock(t.clock_token)  # persisted, so a killed node still gets it restored
        t.gpu_snapshot = t.gpu.snapshot()
        t.overlays = packages.lease(spec.extra, cand.package_dict, target.python_executable())
        if t.overlays is not None:
            teardown.callback(t.overlays.release)
    except Exception as exc:  # checkout, patch, build, clocks, overlays: cannot be tested
        if is_no_space(exc):
            raise
        raise TrialFailure(Outcome.PREPARE_FAILED, f"{type(exc).__name__}: {exc}") from exc


def _restore_clock(t: _Trial) -> None:
    """Always, also after a crash or an interrupt; a failure is said in the trial's detail."""
    assert t.gpu is not None
    try:
        t.gpu.restore(t.clock_token)
        if t.on_clock and t.clock_token is not None:
            t.on_clock(None)
    except Exception as exc:
        t.detail = f"{t.detail}; clock policy NOT restored: {exc}".lstrip("; ")
        t.outcome = Outcome.ERROR if t.outcome is Outcome.OK else t.outcome


def _launch(t: _Trial, teardown: ExitStack) -> None:
    """The server's environment and command, the server itself (a target without one only
    writes its command down), telemetry sampling and the trial's fingerprint."""
    cand, target = t.spec.candidate, t.target
    t.env = target.environment(cand.env_dict)
    if t.overlays is not None:  # pinned packages first on PYTHONPATH / LD_LIBRARY_PATH
        t.env = target.environment({**cand.env_dict, **t.overlays.variables(t.env)})
    # Before a launch: an environment that already hides the node's GPUs would only fail it.
    _check_gpus(t, {**target.settings.env, **cand.env_dict})
    # Runs after the server is gone: its log loses the credentials it was handed.
    teardown.callback(scrub_log, t.log_path, t.argv, t.env)
    port = 0
    if target.has_server:
        t.enter(TrialState.LAUNCHING)
        port = free_port(target.host)
        t.oom_at_launch = oom_kills()
    t.argv[:] = target.command(t.worktree, port)
    (t.trial_dir / "command.txt").write_text(
        scrub(" ".join(redact_argv(t.argv)), secret_values(t.argv, t.env)) + "\n")
    if target.has_server:
        t.proc = launch(t.argv, cwd=t.worktree, env=t.env, log_path=t.log_path,
                        host=target.host, port=port)
        teardown.callback(_stop_server, t)
        if t.on_process:
            t.on_process(t.proc)
    server = t.proc
    sampler = TelemetrySampler(t.gpu, t.spec.telemetry_interval_s, lambda: [
        *(group_members(server.pgid) if server is not None else []), *target.own_pids()
    ]).start()
    teardown.callback(_stop_telemetry, t, sampler)
    assert t.ws is not None
    t.fp.update(fingerprint.collect(
        commit=cand.commit, patches=cand.patches, requested_env=cand.env_dict,
        server_env=t.env, node=t.node, gpu=t.gpu_snapshot, clock=cand.clock,
        dirty_diff=t.ws.worktree_diff_hash(t.worktree), packages=target.node_packages(),
    ))


def _stop_server(t: _Trial) -> None:
    assert t.proc is not None
    t.report = report = t.proc.teardown(grace_s=t.spec.grace_s)
    if t.on_process:
        t.on_process(None)
    if not report.clean and t.outcome is Outcome.OK:
        t.outcome = Outcome.TEARDOWN_FAILED
        t.detail = (f"after {report.signal_used}: leftover pids {list(report.leftover_pids)},"
                    f" port {'free' if report.port_free else 'still in use'}")
    t.fp["teardown"] = {"signal": report.signal_used, "exit_code": report.exit_code,
                        "clean": report.clean}


def _stop_telemetry(t: _Trial, sampler: TelemetrySampler) -> None:
    t.telemetry = sampler.stop()
    t.fp["telemetry"] = {k: v for k, v in t.telemetry.items() if k != "samples"}
    try:
        (t.trial_dir / "telemetry.json").write_text(json.dumps(t.telemetry, indent=1))
    except OSError as exc:
        t.no_space = t.no_space or is_no_space(exc)


def _check_server(t: _Trial) -> None:
    """Ready, with the environment asked for, and importing the pinned packages."""
    proc, cand, target = t.proc, t.spec.candidate, t.target
    wanted = {**target.settings.env, **cand.env_dict}
    if proc is not None:
        t.enter(TrialState.WAITING_READY)
        wait_ready(target, proc, t.spec.ready_timeout_s, t.oom_at_launch)
        seen = server_environ(proc)
        fingerprint.record_server_env(t.fp, t.env, seen)
        settings = target.server_settings(proc.base_url)
        if settings:  # what the server resolved, against a reference that logged its own
            t.fp["server_args"] = settings
        problems = env_mismatches(proc, wanted)
        if problems:
            raise TrialFailure(Outcome.ENV_MISMATCH, "; ".join(problems[:5]))
        if seen is not None:
            _check_gpus(t, wanted, seen)
    if t.overlays is not None:  # what the server really imported, before any measurement
        problems = packages.verify(target, t.overlays, proc, t.base_url, t.env, t.worktree, t.fp)
        if problems:
            raise TrialFailure(Outcome.ENV_MISMATCH, "; ".join(problems[:5]))


def _check_gpus(t: _Trial, wanted: Mapping[str, str],
                server: Mapping[str, str] | None = None) -> None:
    """The node's GPUs reach the server (unless the run sets CUDA_VISIBLE_DEVICES itself,
    which `env_mismatches` checks). Before the launch (`server` None): this node actor's own
    value, which every server inherits, must be its node's (Ray's hiding shows here, should
    the actor's correction not hold). After it: what the running server has is recorded; a
    launcher on the way may set it on purpose (a node's wrapper choosing its GPUs, the
    simulated node's login environment), but one that leaves the server no GPU of a node that
    has some is `env_mismatch`."""
    if t.node_gpus is NOT_CHECKED or visibility.VAR in wanted:
        return
    meant = t.node_gpus if isinstance(t.node_gpus, str) else None
    record = t.fp.setdefault("gpu_visibility", {"node": meant})
    if server is None:
        record["handed"] = t.env.get(visibility.VAR)
        own = os.environ.get(visibility.VAR)
        problem = visibility.problem(t.node, meant, own, "this node actor's")
    else:
        seen = record["server"] = server.get(visibility.VAR)
        problem = visibility.problem(t.node, meant, seen) if seen == "" != meant else ""
    if problem:
        raise TrialFailure(Outcome.ENV_MISMATCH, problem)


def _benchmark(t: _Trial) -> None:
    """Warm-up, the measured repetitions, then (outside them) a profile if one is wanted."""
    spec, proc, target, base_url = t.spec, t.proc, t.target, t.base_url
    t.enter(TrialState.WARMING_UP)
    if spec.warmup_requests > 0:
        try:
            target.warm_up(base_url, spec.warmup_requests)
        except BenchError as exc:
            raise classify_bench_error(exc, proc, "warm-up", t.oom_at_launch) from exc
    t.enter(TrialState.BENCHMARKING)
    requests = target.requests()
    live = (spec.extra or {}).get("live")
    if live and t.gpu is not None:  # several settings within this one lifetime
        t.measurements, t.fp["live"] = lifetime.measure_levels(
            list(live), spec.repetitions, t.gpu,
            lambda: target.measure(base_url, requests, t.log_path),
            lambda: target.warm_up(base_url, lifetime.SETTLE_REQUESTS),
            lambda exc, where: classify_bench_error(exc, proc, where, t.oom_at_launch),
            # one restore token is persisted per node: the launch policy's, when it has one
            t.on_clock if t.clock_token is None else None)
    for rep in range(0 if live and t.gpu is not None else spec.repetitions):
        began = time.monotonic()
        try:
            metrics = target.measure(base_url, requests, t.log_path)
        except BenchError as exc:
            raise classify_bench_error(exc, proc, f"repetition {rep + 1}",
                                        t.oom_at_launch) from exc
        t.measurements.append(Measurement(rep, metrics, time.monotonic() - began))
    if proc is not None and proc.poll() is not None:
        raise died(proc, t.oom_at_launch, Outcome.CRASHED, "right after the benchmark")
    if t.gpu is not None:
        t.changed = clock_changes(t.gpu_snapshot, t.gpu.snapshot())
    profile = capture.wanted(spec.extra)
    if profile is not None:  # after the measured repetitions: it never touches the metric
        t.fp["profile"] = target.profile(base_url, t.trial_dir, profile)


def _result(t: _Trial) -> TrialResult:
    """The record: a full disk makes a failed trial `interrupted` (the run stops, resumable);
    a clock changed from outside makes it suspect."""
    outcome, detail, measurements, no_space = t.outcome, t.detail, t.measurements, t.no_space
    trial_dir = t.trial_dir
    if outcome is not Outcome.OK and outcome is not Outcome.INTERRUPTED and not no_space:
        free = free_bytes(trial_dir if trial_dir.exists() else trial_dir.parent)
        no_space = free is not None and free < LOW_SPACE_BYTES
    if no_space:  # the disk, not the candidate: the run stops (resumable)
        if outcome is not Outcome.OK:  # and this trial runs again on resume
            outcome, measurements = Outcome.INTERRUPTED, []
        detail = (f"{NO_SPACE} on node {t.node} (under {trial_dir.parent})"
                  + (f": {detail}" if detail else ""))
    suspect = [str(t.telemetry.get("suspect_reason", ""))] if t.telemetry.get("suspect") else []
    if t.changed:
        suspect.append("clock/power changed during the trial, not by this run: "
                       + "; ".join(t.changed[:4]))
    return TrialResult(
        outcome=outcome,
        # A server's own words (its last log lines, an error it answered with) may echo the
        # credentials it was handed: the same scrub as its log and command.txt.
        detail=printable(scrub(detail, secret_values(t.argv, t.env))) if detail else "",
        measurements=tuple(measurements),
        states=tuple(t.states),
        started_at=t.started,
        ended_at=wallclock.now(),
        node=t.node,
        fingerprint=t.fp,
        log_tail=log_tail(t.log_path),
        suspect=bool(suspect),
        suspect_reason="; ".join(suspect),
    )
