"""`sleuth investigate live=PID|URL [live.restart=true] [was=LEVEL | reference=RUN|log:PATH]`.

The triage from where the user stands: the slow server is running now. Steps, one run:

1. **attach** (`orchestrator/live/attach.py`): its command line, environment, working
   directory, uptime, memory, what `/server_info` reports. Bad input (no such process, not an
   SGLang server, `live.restart=true` for a server this machine cannot restart) is one line,
   exit 2, before anything is written;
2. **measure it as it is**: the same bench as every trial, no restart (trial phase `live`);
3. with `live.restart=true`: **stop it, start the same command fresh** in the same working
   directory and environment, measure, tear down, up to `live.restarts` times (phase `fresh`;
   three first, more only while the verdict is undecided), and decide **server state**
   (`orchestrator/live/verdict.py`). Without it, state is not tested and the answer says so;
4. with a reference (`reference=RUN` or `reference=log:PATH`) and the server stopped: the
   whole investigation of `commands/investigate.py` from there (compare, isolate, bisect up to
   the commit the server runs: its working directory's checkout), the state verdict a clause of
   its answer. Without `live.restart=true` nothing can be launched (the running server holds
   the GPUs): the running server is compared with the reference's level, and the fingerprint
   differences are listed, untested;
5. **leave the node as it was found**: the original command relaunched, detached, and checked
   to answer again (or the answer says why not). This runs whatever happened before it: an
   error or Ctrl-C still relaunches the server.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from orchestrator.commands import common, investigate, parts
from orchestrator.commands.parts import create_run, pin_run
from orchestrator.config import params as experiment_params
from orchestrator.config.settings import RunSettings, as_dict, evolve
from orchestrator.errors import UserError
from orchestrator.live import proc as liveproc
from orchestrator.live import verdict as V
from orchestrator.live.attach import LiveServer, attach, describe
from orchestrator.live.measure import (
    PHASE_FRESH,
    PHASE_LIVE,
    Protocol,
    measure_fresh,
    measure_running,
)
from orchestrator.live.restart import relaunch, stop
from orchestrator.metrics import METRICS, check_metric
from orchestrator.records import Candidate
from orchestrator.reference.server_args import target_settings
from orchestrator.run import findings
from orchestrator.run.rundir import running
from orchestrator.targets.base import NodeContext
from orchestrator.targets.registry import make_target
from orchestrator.targets.sim.dialect import DEVICE_TIMER_ENV
from orchestrator.ui import render

FIRST_FRESH = 3  # fresh starts before the first verdict
GC_WARNING = "LONG GARBAGE COLLECTION DETECTED"


@dataclass
class LivePlan:
    server: LiveServer
    cfg: RunSettings  # the investigation's settings
    reference: dict | None  # the reference's record (`reference=`), for its level then
    live_cfg: RunSettings  # the settings the running server is measured with (its own)
    commit: str | None  # the commit its working directory has checked out, if in `repo`
    inner: tuple | None  # (settings, Plan, workspace) of the investigation that follows


def _git_head(path: str | None) -> tuple[str, str] | None:
    """(SHA, toplevel) of the checkout `path` is in, if it is one."""
    if not path:
        return None
    try:
        top = subprocess.run(["git", "-C", path, "rev-parse", "--show-toplevel", "HEAD"],
                             capture_output=True, text=True, timeout=30, check=True
                             ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return (top[1], top[0]) if len(top) == 2 else None


def _live_settings(cfg: RunSettings, server: LiveServer) -> RunSettings:
    """The settings the running server is measured with: what it reports it runs (its
    `ServerArgs`), and for the sim its own time scale and GPU state file."""
    from orchestrator.bench.server_measure import settings_of

    changes = {f"target.{k}": v for k, v in
               target_settings(settings_of(server.info) or {}, cfg.target).items() if k != "name"}
    if cfg.target.name == "sim" or getattr(cfg.target, "engine", None) == "sim":
        scale = server.flag("--sim-time-scale") or server.env.get("SLEUTH_SIM_TIME_SCALE")
        if scale:
            changes["target.time_scale"] = float(scale)
        state = server.flag("--sim-gpu-state") or server.env.get("SLEUTH_SIM_GPU_STATE")
        if state:
            changes["target.gpu_state"] = state
    return evolve(cfg, changes)


def plan(cfg: RunSettings) -> LivePlan:
    """Attach and check everything before a run directory exists."""
    if cfg.reference and cfg.was is not None:
        raise UserError(f"was={cfg.was:g} and reference={cfg.reference} both state the good"
                        " level: give one")
    server = attach(cfg.live.server)
    if cfg.live.restart and not server.restartable:
        raise UserError(f"live={cfg.live.server}: live.restart=true needs the server's process"
                        " on this machine, readable by this user (it is stopped, started"
                        " fresh with the same command and environment, and relaunched)")
    if cfg.live.restart:
        common.check_nodes_free(cfg)  # another run's trials on this node: not ours to stop
    head = _git_head(server.cwd)
    if not cfg.repo and head is not None:
        cfg = evolve(cfg, repo=head[1])
    commit = None
    if head is not None and cfg.repo:
        try:
            commit = common.workspace(cfg).resolve(head[0])
        except UserError:
            commit = None  # a checkout of another repository
    live_cfg = _live_settings(cfg, server)
    check_metric(cfg.metric, target=as_dict(live_cfg.target))
    _check_phase_metric(cfg.metric, server)
    inner = reference = None
    if cfg.reference:
        if not cfg.bad and commit is not None:
            cfg = evolve(cfg, bad=commit)
        if cfg.live.restart:  # the server stopped: sleuth's own trials can use the node
            inner = investigate.plan(evolve(cfg, {"live.server": ""}))
            reference = inner[1].reference
        else:  # its level only: nothing can be launched while the server holds the node
            from orchestrator.commands.compare import load_reference

            reference = load_reference(cfg, str(cfg.reference))
    return LivePlan(server, cfg, reference, live_cfg, commit, inner)


# Metrics read from SGLang's per-phase device timer (`/metrics`): a server started without it
# cannot report them, and the running server is measured as it was started.
PHASE_METRICS = ("verify_ms", "verify_ms_per_request", "draft_ms", "decode_ms",
                 "draft_graph_share", "prefill_ms_per_ktok")


def _check_phase_metric(metric: str, server: LiveServer) -> None:
    if metric not in PHASE_METRICS:
        return
    missing = []
    if not server.info.get("enable_metrics"):
        missing.append("--enable-metrics")
    timer = server.env.get(DEVICE_TIMER_ENV, "")
    if server.env and timer.strip().lower() not in ("1", "true", "yes"):
        missing.append(f"{DEVICE_TIMER_ENV}=1")
    if missing:
        raise UserError(f"live={server.spec}: the running server cannot report {metric}: it"
                        f" was started without {' and '.join(missing)} (SGLang's per-phase"
                        " device timer); measure a client metric (metric=tpot_ms_p50 or"
                        " output_throughput), or start it with them")


def run(cfg: RunSettings) -> int:
    lp = plan(cfg)
    cfg = pin_run(evolve(lp.inner[0], {"live.server": lp.cfg.live.server}) if lp.inner
                  else lp.cfg)
    run_dir, store = create_run(cfg)
    out = render.console()
    server = lp.server
    with running(store, run_dir, out) as state:
        for line in describe(server):
            out.print(line)
        relaunched = None
        stopped: list[bool] = []  # set once the running server is stopped
        served = _served(server)  # before sleuth's own requests add to it
        try:
            verdict, rows = _measure(cfg, lp, run_dir, store, out, stopped)
            doc = _answer(cfg, lp, run_dir, store, verdict, rows, out, served)
        finally:
            if stopped:  # whatever happened since, the original command runs again
                relaunched = _leave_as_found(cfg, server, run_dir, out)
        if relaunched is not None and not relaunched.ready:
            doc["answer"]["node"] = f"the original command could not be left running: " \
                                    f"{relaunched.detail}"
            findings.write(run_dir, doc, "investigate")
        code = investigate.finish(cfg, run_dir, store, doc, out)
        state.status = "done" if code == 0 else "inconclusive"
        return code


def _protocol(cfg: RunSettings) -> Protocol:
    return Protocol(repetitions=int(cfg.bench.repetitions),
                    warmup_requests=int(cfg.bench.warmup_requests),
                    ready_timeout_s=float(cfg.trial.ready_timeout_s),
                    grace_s=float(cfg.live.grace_s),
                    telemetry_interval_s=float(cfg.trial.telemetry_interval_s))


def _record(store, cand: Candidate, phase: str, result) -> int:
    trial_id = store.begin_trial(store.candidate_id(cand), node=result.node or "live",
                                 phase=phase)
    store.finish_trial(trial_id, result)
    return trial_id


def _measure(cfg: RunSettings, lp: LivePlan, run_dir: Path, store, out, stopped: list[bool]):
    """The running server, then (with live.restart=true) fresh starts until the verdict."""
    server = lp.server
    node = NodeContext("local-0", cfg.runs_root / ".nodes" / "local-0")
    target = make_target(lp.live_cfg.target, lp.live_cfg.bench, node)
    protocol = _protocol(cfg)
    sha = lp.commit or ""
    label = f"pid {server.pid}" if server.pid else server.url
    live_cand = Candidate.make(sha, server={"live": f"running ({label})"})
    fresh_cand = Candidate.make(sha, server={"live": f"fresh start of {label}'s command"})
    min_effect = experiment_params.of(cfg).min_effect_pct or 4.0
    metric = cfg.metric
    then = _level_then(cfg, lp, metric)
    out.print("\n== the running server, measured as it is (no restart) ==")
    tid = store.begin_trial(store.candidate_id(live_cand), node="live", phase=PHASE_LIVE)
    result = measure_running(target, server, run_dir / "trials" / str(tid), protocol, sha)
    store.finish_trial(tid, result)
    target.close()
    live_value = result.value(metric)
    out.print(f"running server: {metric} {_show(live_value)} ({result.outcome.value})")
    chase = math.log(live_value / then) if live_value and then else None
    verdict = V.decide(live_value, [], min_effect, chase)
    if not cfg.live.restart or live_value is None:
        return verdict, store.trials()
    out.print("\n== a fresh start of the same command on the same node ==")
    stopped.append(True)
    ended = stop(server, protocol.grace_s)
    out.print(f"stopped pid {server.pid} ({ended.signal_used}"
              f"{'' if ended.clean else ', ' + ended.detail})")
    fresh: list[float] = []
    attempts = 0
    while attempts < int(cfg.live.restarts) + 2 and len(fresh) < int(cfg.live.restarts):
        attempts += 1
        tid = store.begin_trial(store.candidate_id(fresh_cand), node="live", phase=PHASE_FRESH)
        result, _ = measure_fresh(target, server, run_dir / "trials" / str(tid), protocol, sha)
        store.finish_trial(tid, result)
        target.close()
        value = result.value(metric) if result.outcome.measured else None
        out.print(f"fresh start {attempts}: {metric} {_show(value)} ({result.outcome.value}"
                  f"{': ' + result.detail if result.detail else ''})")
        if value is not None:
            fresh.append(value)
        if len(fresh) >= FIRST_FRESH:
            verdict = V.decide(live_value, fresh, min_effect, chase)
            if V.settled(verdict, cfg.was, min_effect):
                break
        if attempts >= 2 and not fresh:
            break  # its command does not start fresh: said in the answer
    return V.decide(live_value, fresh, min_effect, chase), store.trials()


def _level_then(cfg: RunSettings, lp: LivePlan, metric: str) -> float | None:
    """The level then, when one is known: `was=`, or the reference's own (its geometric
    mean): the change the live server's state is weighed against."""
    if cfg.was is not None:
        return float(cfg.was)
    values = [v for v in (lp.reference or {}).get("values", {}).get(metric, [])
              if v and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def _show(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4g}"


def _gc_warnings(path: str | Path | None, max_bytes: int = 32 << 20) -> int | None:
    """Long-GC warnings in (the last `max_bytes` of) a server log; None without a log."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode(errors="replace").count(GC_WARNING)
    except OSError:
        return None


def _served(server: LiveServer) -> float | None:
    """Requests the server finished before sleuth measured it (`num_requests_total`, when it
    exports Prometheus metrics)."""
    import httpx

    try:
        text = httpx.get(f"{server.url}/metrics", timeout=5.0).text
    except httpx.HTTPError:
        return None
    values = [float(m.group(1)) for m in re.finditer(
        r"^sglang:num_requests_total(?:\{[^}]*\})? ([0-9.e+]+)$", text, re.M)]
    return sum(values) if values else None


def _answer(cfg: RunSettings, lp: LivePlan, run_dir: Path, store, verdict: V.StateVerdict,
            rows, out, served: float | None = None) -> dict:
    metric, server = cfg.metric, lp.server
    unit = METRICS[metric].unit if metric in METRICS else ""
    uptime = liveproc.uptime_text(server.uptime_s)
    live_rows = [r for r in rows if r.phase == PHASE_LIVE and r.result is not None]
    fresh_rows = [r for r in rows if r.phase == PHASE_FRESH and r.result is not None]
    observations = []
    if live_rows and cfg.live.restart:
        observations = V.observations_of(
            live_rows[0].result.fingerprint,
            [r.result.fingerprint for r in fresh_rows if r.result.fingerprint],
            _gc_warnings(server.log_path),
            [n for r in fresh_rows if (n := _gc_warnings(r.log_path)) is not None], served)
    live_doc = {"run": store.run_id, "experiment": "live", "metric": metric,
                "verdict": verdict.status, "server": _facts(server, lp.commit),
                "trials": [r.id for r in live_rows + fresh_rows], "findings": []}
    if verdict.status == V.STATE and verdict.change is not None:
        live_doc["findings"] = [{"rank": 1, "kind": "state", "id": "server state",
                                 "summary": V.clause(verdict, metric, unit, uptime),
                                 "probability": None,
                                 "effect": {metric: verdict.change.to_json()},
                                 "evidence": live_doc["trials"]}]
    if lp.inner is not None:
        doc = _inner(cfg, lp, run_dir, store, out)
        doc["answer"]["sentence"] += "; " + V.clause(verdict, metric, unit, uptime)
        if lp.commit is None and not lp.cfg.bad:
            doc["answer"]["sentence"] += (f"; the running server's working directory"
                                          f" ({server.cwd}) is not a checkout of repo=, so the"
                                          " code it runs was not compared: bad=REF names it")
        doc["answer"]["server_state"] = {"status": verdict.status, "live": verdict.live,
                                         "fresh": list(verdict.fresh)}
    else:
        then = _level_then(cfg, lp, metric)
        label = "" if cfg.was is not None or lp.reference is None else \
            f"the reference {lp.reference['name']}"
        answer = V.answer(verdict, metric, unit, uptime=uptime, restarted=cfg.live.restart,
                          was=then, min_effect_pct=experiment_params.of(cfg).min_effect_pct,
                          observations=observations, was_label=label)
        if cfg.reference and not cfg.live.restart:
            answer["sentence"] += ("; the reference's configuration was not tested: sleuth's"
                                   " trials need the GPUs the running server holds"
                                   " (live.restart=true)")
        doc = {"run": store.run_id, "experiment": "investigate", "metric": metric,
               "verdict": answer["status"], "message": answer["sentence"], "findings": [],
               "steps": ["live"], "n_trials": len(rows), "answer": answer}
    live_doc["answer"] = {"sentence": V.sentence(verdict, metric, unit, uptime,
                                                 cfg.live.restart, observations)}
    findings.write(run_dir, live_doc, "live")
    findings.write(run_dir, doc, "investigate")
    return doc


def _inner(cfg: RunSettings, lp: LivePlan, run_dir: Path, store, out) -> dict:
    """The investigation from the reference, on the node the stopped server left free."""
    from orchestrator.control.controller import Controller
    from orchestrator.ui.progress import Progress

    _, p, ws = lp.inner
    out.print("\n== from the reference: the system and the code, with sleuth's own trials ==")
    with Progress(out, done=store.trials()) as progress, \
            Controller(parts.control(cfg, space=p.sweep and p.sweep.space),
                       store, run_dir, on_event=progress.on_event) as ctl:
        doc, _ = investigate.execute(cfg, ctl, run_dir, p, ws, out, progress=progress)
    return doc


def _facts(server: LiveServer, commit: str | None) -> dict:
    from orchestrator.system.redact import redact_argv, redact_env

    return {"pid": server.pid, "url": server.url, "uptime_s": server.uptime_s,
            "rss_bytes": server.rss_bytes, "cwd": server.cwd, "log": server.log_path,
            "command": redact_argv(list(server.argv)), "commit": commit,
            "environment": redact_env(dict(server.env)), "version": server.info.get("version")}


def _leave_as_found(cfg: RunSettings, server: LiveServer, run_dir: Path, out):
    """Relaunch the original command, detached; record where it runs."""
    out.print("\n== leaving the node as it was found: the original command relaunched ==")
    result = relaunch(server, float(cfg.trial.ready_timeout_s))
    note = {"pid": result.pid, "ready": result.ready, "detail": result.detail,
            "url": server.url}
    (run_dir / "relaunched.json").write_text(json.dumps(note, indent=1) + "\n")
    if result.ready:
        out.print(f"the original command runs again: pid {result.pid} at {server.url}")
    else:
        out.print(f"the original command is NOT running again: {result.detail}")
    return result
