"""Worlds with a known answer for the simulated node, and the oracles that know it.

The simulated server (`orchestrator/targets/sim/`) only serves; what it is asked to play lives
here, so the server's package stays the server and imports nothing of this one:

- the scenario generator (`sleuth scenario`, `sleuth demo`, the end-to-end tests):
  `generate.py` (:func:`generate_scenario`, :class:`Scenario`: plans an SGLang-like history
  with planted causes and records `truth.json`), `git_repo.py` (writes the history),
  `presets.py` (the material: presets, culprits, files, commit text), `side_files.py` (patches,
  system files and wheels beside the repo) and `system_stories.py` (how a node's system
  changed between the reference and now);
- the noise-free oracle the demo's truth check and the sweep benchmark score against, the
  sim's own model behind a virtual trial: `sweep_oracle.py` (:class:`SimOracle`: a candidate's
  value, and every configuration's truth). The benchmarks' own oracles (the system stories'
  virtual node) live with them in `experiments/`.

The package re-exports the generator's face; import the oracle from its module.
"""

from __future__ import annotations

from orchestrator.sim_scenarios.generate import (
    DEFAULT_PRESET,
    PRESETS,
    Scenario,
    ScenarioInputError,
    generate_scenario,
)

__all__ = ["DEFAULT_PRESET", "PRESETS", "Scenario", "ScenarioInputError", "generate_scenario"]
