"""`sleuth scenario out=DIR commits=N seed=S preset=P`: a scenario repo with planted causes.

Writes `DIR/repo` (a git repo shaped like an inference engine) and `DIR/truth.json` (what was
planted where), plus patches and system-state files for the presets that have them. Bad input
raises `ScenarioInputError` (a `UserError`): one line, exit 2, nothing written.

`sleuth scenario out=DIR apply=reference|now [runs_dir=R] [nodes=K]` puts the simulated nodes
of `runs_dir` into one of the scenario's recorded system states (GPU state, the login
environment, packages): the node as it was when it was fast, or as it is now. With it the
two-command story (a reference while fast, `investigate` when slow) is rehearsed on the
simulated node, one command at a time, as `sleuth demo` does in one.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.config.requests import ScenarioRequest
from orchestrator.config.settings import RunSettings
from orchestrator.errors import UserError
from orchestrator.run.rundir import runs_root
from orchestrator.sim_scenarios.generate import DEFAULT_PRESET, generate_scenario

STATE_FILES = ("gpu_state", "env", "packages", "launcher")


def generate(out: Path, commits: int, seed: int, preset: str = DEFAULT_PRESET) -> Path:
    """Generate the scenario under `out` and return the path of its git repo (`out/repo`)."""
    return generate_scenario(Path(out), commits, seed, preset).repo


def run(cfg: RunSettings) -> int:
    req = ScenarioRequest.of(cfg)
    if req.apply:
        return apply(cfg, req.out, req.apply)
    scenario = generate_scenario(req.out, req.commits, req.seed, req.preset)
    truth = scenario.truth
    print(f"repo: {scenario.repo}")
    print(f"truth: {scenario.out / 'truth.json'}")
    print(f"preset {truth['preset']}: {truth['commits']} commits, good {truth['good'][:12]}"
          f" bad {truth['bad'][:12]}, {len(truth['culprits'])} planted culprit(s)")
    if _state_files(scenario.out, "reference"):
        print(f"node states: {scenario.out}/reference_*.json (when it was fast),"
              f" {scenario.out}/now_*.json (now); sleuth scenario out={scenario.out}"
              " apply=reference|now puts the simulated nodes in one")
        print(f"next: sleuth scenario out={scenario.out} apply=reference"
              f" runs_dir={runs_root(cfg)}")
        return 0
    print(f"next: sleuth bisect target=sim repo={scenario.repo} good={truth['good'][:12]}"
          f" bad={truth['bad'][:12]}")
    return 0


def _state_files(out: Path, when: str) -> dict[str, Path]:
    found = {what: out / f"{when}_{what}.json" for what in STATE_FILES}
    return {what: path for what, path in found.items() if path.is_file()}


def apply(cfg: RunSettings, out: Path, when: str) -> int:
    """Copy the scenario's `when` state into each simulated node's state directory."""
    from orchestrator.commands.common import check_nodes_free
    from orchestrator.runner.holder import held_message, holder_of
    from orchestrator.targets.simnode import set_node_state

    files = _state_files(out, when)
    if "gpu_state" not in files:
        raise UserError(f"{out} holds no recorded node state ({when}_gpu_state.json): generate"
                        " a scenario whose preset changes the system, e.g. sleuth scenario"
                        f" out={out} preset=system_change")
    check_nodes_free(cfg)  # every node held: refused, naming the holder
    root = runs_root(cfg) / ".nodes"
    names = [f"local-{i}" for i in range(cfg.nodes)]
    for name in names:  # one held by a live run: its run's state is not ours to change
        holder = holder_of(root / name)
        if holder is not None:
            raise UserError(f"{held_message(name, holder)}: wait for that run to finish")
    for name in names:
        set_node_state(root / name, gpu_state_file=files["gpu_state"],
                       env_file=files.get("env"), packages_file=files.get("packages"),
                       launcher_file=files.get("launcher"))
    truth = _truth(out)
    print(f"node state '{when}' of {out} applied to {len(names)} simulated node(s) in {root}")
    if truth:
        good, bad = truth["good"][:12], truth["bad"][:12]
        repo = out / "repo"
        where = f"target=sim repo={repo} runs_dir={runs_root(cfg)}" + (
            f" nodes={len(names)}" if len(names) > 1 else "")
        if when == "reference":
            print(f"next: sleuth trial {where} commit={good} restarts=3 run_id=reference")
        else:
            print(f"next: sleuth investigate {where} reference=reference bad={bad}")
    return 0


def _truth(out: Path) -> dict | None:
    import json

    try:
        doc = json.loads((out / "truth.json").read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and "good" in doc and "bad" in doc else None
