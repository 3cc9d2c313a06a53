"""`sleuth scenario out=DIR commits=N seed=S preset=P`: a scenario repo with planted causes.

Writes `DIR/repo` (a git repo shaped like an inference engine) and `DIR/truth.json` (what was
planted where), plus patches and system-state files for the presets that have them. Bad input
raises `ScenarioInputError` (a `UserError`): one line, exit 2, nothing written.

`sleuth scenario out=DIR apply=reference|now [runs_dir=R] [nodes=K]` puts the simulated nodes
of `runs_dir` into one of the scenario's recorded system states (GPU state, the login
environment, packages): the node as it was when it was fast, or as it is now. With it the
two-command story (a reference while fast, `investigate` when slow) is rehearsed on the
simulated node, one command at a time, as `sleuth demo` does in one.

`apply=live` (the `server_state` preset) puts the first node in the "now" state and starts the
scenario's long-running server on it, detached, then serves it the traffic that wears it down:
the slow server running now, for `sleuth investigate live=PID live.restart=true`.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.config.requests import ScenarioRequest
from orchestrator.config.settings import RunSettings, evolve
from orchestrator.errors import UserError
from orchestrator.sim_scenarios.generate import DEFAULT_PRESET, PRESETS, generate_scenario

STATE_FILES = ("gpu_state", "env", "packages", "launcher")


def generate(out: Path, commits: int, seed: int, preset: str = DEFAULT_PRESET) -> Path:
    """Generate the scenario under `out` and return the path of its git repo (`out/repo`)."""
    return generate_scenario(Path(out), commits, seed, preset).repo


def run(cfg: RunSettings) -> int:
    if not cfg.out:
        raise UserError(f"where to? usage: sleuth scenario out=DIR [commits=N] [seed=S]"
                        f" [preset={'|'.join(PRESETS)}], or out=DIR apply=reference|now|live")
    req = ScenarioRequest.of(cfg)
    if req.apply:
        return apply(cfg, req.out, req.apply)
    scenario = generate_scenario(req.out, req.commits, req.seed, req.preset)
    truth = scenario.truth
    print(f"repo: {scenario.repo}")
    print(f"truth: {scenario.out / 'truth.json'}")
    print(f"preset {truth['preset']}: {truth['commits']} commits, good {truth['good'][:12]}"
          f" bad {truth['bad'][:12]}, {len(truth['culprits'])} planted culprit(s)")
    if "old_log" in truth:
        print(f"old log: {scenario.out / truth['old_log']['dir']} (the server's log from when it"
              " was fast: all there is of then)")
        print(f"next: sleuth scenario out={scenario.out} apply=now runs_dir={cfg.runs_root}")
        return 0
    if "live" in truth:
        print(f"next: sleuth scenario out={scenario.out} apply=live runs_dir={cfg.runs_root}"
              " (starts the long-running server and wears it down)")
        return 0
    if _state_files(scenario.out, "reference"):
        print(f"node states: {scenario.out}/reference_*.json (when it was fast),"
              f" {scenario.out}/now_*.json (now); sleuth scenario out={scenario.out}"
              " apply=reference|now puts the simulated nodes in one")
        print(f"next: sleuth scenario out={scenario.out} apply=reference"
              f" runs_dir={cfg.runs_root}")
        return 0
    print(f"next: sleuth bisect target=sim repo={scenario.repo} good={truth['good'][:12]}"
          f" bad={truth['bad'][:12]}")
    return 0


def _state_files(out: Path, when: str) -> dict[str, Path]:
    found = {what: out / f"{when}_{what}.json" for what in STATE_FILES}
    return {what: path for what, path in found.items() if path.is_file()}


def apply(cfg: RunSettings, out: Path, when: str) -> int:
    """Copy the scenario's `when` state into each simulated node's state directory (`live`:
    the "now" state, then start and age the scenario's long-running server)."""
    if when == "live":
        return start_live(cfg, out)
    root, names = _set_state(cfg, out, when)
    truth = _truth(out)
    print(f"node state '{when}' of {out} applied to {len(names)} simulated node(s) in {root}")
    if truth:
        good, bad = truth["good"][:12], truth["bad"][:12]
        repo = out / "repo"
        where = f"target=sim repo={repo} runs_dir={cfg.runs_root}" + (
            f" nodes={len(names)}" if len(names) > 1 else "")
        if when == "reference":
            print(f"next: sleuth trial {where} commit={good} restarts=3 run_id=reference")
        elif "old_log" in truth:
            print(f"next: sleuth investigate {where} reference=log:{out / truth['old_log']['dir']}")
        else:
            print(f"next: sleuth investigate {where} reference=reference bad={bad}")
    return 0


def _set_state(cfg: RunSettings, out: Path, when: str) -> tuple[Path, list[str]]:
    """Copy the scenario's `when` state files into the nodes' state directories."""
    from orchestrator.commands.common import check_nodes_free
    from orchestrator.runner.holder import held_message, holder_of
    from orchestrator.targets.simnode import set_node_state

    files = _state_files(out, when)
    if "gpu_state" not in files:
        raise UserError(f"{out} holds no recorded node state ({when}_gpu_state.json): generate"
                        " a scenario whose preset changes the system, e.g. sleuth scenario"
                        f" out={out} preset=system_change")
    check_nodes_free(cfg)  # every node held: refused, naming the holder
    root = cfg.runs_root / ".nodes"
    names = [f"local-{i}" for i in range(cfg.nodes)]
    for name in names:  # one held by a live run: its run's state is not ours to change
        holder = holder_of(root / name)
        if holder is not None:
            raise UserError(f"{held_message(name, holder)}: wait for that run to finish")
    for name in names:
        set_node_state(root / name, gpu_state_file=files["gpu_state"],
                       env_file=files.get("env"), packages_file=files.get("packages"),
                       launcher_file=files.get("launcher"))
    return root, names


def _truth(out: Path) -> dict | None:
    try:
        doc = json.loads((out / "truth.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "good" in doc and "bad" in doc else None


def start_live(cfg: RunSettings, out: Path) -> int:
    """Start the `server_state` scenario's server on the first node and age it."""
    from orchestrator.sim_scenarios import live
    from orchestrator.util.process import free_port

    plan = out / "live_server.json"
    if not plan.is_file():
        raise UserError(f"{out} holds no long-running server to start (live_server.json):"
                        f" generate one with sleuth scenario out={out} preset=server_state")
    truth = json.loads((out / "truth.json").read_text())["live"]
    root, _ = _set_state(evolve(cfg, nodes=1), out, "now")
    node_dir = root / "local-0"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = live.start(out, node_dir, port)
    try:
        live.wait_ready(url, proc)
        print(f"live server: pid {proc.pid} at {url}, serving {truth['age_requests']} requests"
              " (the traffic that wears it down) ...")
        live.age(url, int(truth["age_requests"]))
    except BaseException:
        proc.kill()
        raise
    (out / live.DIR / "pid").write_text(f"{proc.pid}\n")
    print(f"live server: pid {proc.pid} at {url}, log {out / live.DIR / 'server.log'}; planted:"
          f" verify +{truth['state_pct']:g}% once aged (a fresh restart:"
          f" {truth['fresh_verify_ms']:.2f} ms)")
    print(f"next: sleuth investigate target=sim runs_dir={cfg.runs_root} live={proc.pid}"
          f" live.restart=true was={truth['fresh_verify_ms']:.1f}")
    return 0
