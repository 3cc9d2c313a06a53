"""`sleuth scenario out=DIR commits=N seed=S preset=P`: a scenario repo with planted causes.

Writes `DIR/repo` (a git repo shaped like an inference engine) and `DIR/truth.json` (what was
planted where), plus patches and system-state files for the presets that have them. Bad input
raises `ScenarioInputError` (a `UserError`): one line, exit 2, nothing written.
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from orchestrator.errors import UserError
from orchestrator.targets.sim.scenario import DEFAULT_PRESET, PRESETS, generate_scenario


def generate(out: Path, commits: int, seed: int, preset: str = DEFAULT_PRESET) -> Path:
    """Generate the scenario under `out` and return the path of its git repo (`out/repo`)."""
    return generate_scenario(Path(out), commits, seed, preset).repo


def run(cfg: DictConfig) -> int:
    if not cfg.out:
        raise UserError(f"where to? usage: sleuth scenario out=DIR [commits=N] [seed=S]"
                        f" [preset={'|'.join(PRESETS)}]")
    scenario = generate_scenario(Path(str(cfg.out)).expanduser().resolve(), int(cfg.commits),
                                 int(cfg.seed), str(cfg.preset))
    truth = scenario.truth
    print(f"repo: {scenario.repo}")
    print(f"truth: {scenario.out / 'truth.json'}")
    print(f"preset {truth['preset']}: {truth['commits']} commits, good {truth['good'][:12]}"
          f" bad {truth['bad'][:12]}, {len(truth['culprits'])} planted culprit(s)")
    print(f"next: sleuth bisect target=sim repo={scenario.repo} good={truth['good'][:12]}"
          f" bad={truth['bad'][:12]}")
    return 0
