"""The layers contract (pyproject.toml `[tool.importlinter]`, drawn in docs/design.md) holds:
every package imports only from the layers below it, lazy imports inside functions included.
`make lint` runs the same check; here it runs with the suite so a change that reaches up a
layer fails CI, not only a local lint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_layers_contract_is_kept():
    exe = Path(sys.executable).parent / "lint-imports"
    if not exe.exists():  # installed by the test extra; a venv without it is not the suite's
        exe = Path(shutil.which("lint-imports") or exe)
    done = subprocess.run([str(exe), "--no-cache"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "Contracts: 1 kept, 0 broken." in done.stdout


def test_design_md_draws_the_contract_s_order():
    """The order docs/design.md states is the order the contract checks."""
    import tomllib

    layers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"][
        "contracts"][0]["layers"]
    design = (ROOT / "docs" / "design.md").read_text()
    block = design[design.index("## Layers"):]
    block = block[:block.index("```", block.index("```") + 3)]
    drawn = [line.split()[0].strip("/") for line in block.splitlines()
             if line.startswith("  ") and line.strip()]
    assert [f"orchestrator.{name}" for name in drawn] == layers
