"""`sleuth scenario`: write a scenario repo with planted causes and its truth.json.

The CLI wires arguments to `run`; bad input raises `ScenarioInputError` (a `ValueError` and a
`UserError`), which the CLI reports on one line with exit 2 before anything is written.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.targets.sim.scenario import DEFAULT_PRESET, generate_scenario


def run(out: Path, commits: int, seed: int, preset: str = DEFAULT_PRESET) -> Path:
    """Generate the scenario under `out` and return the path of its git repo (`out/repo`)."""
    return generate_scenario(Path(out), commits, seed, preset).repo
