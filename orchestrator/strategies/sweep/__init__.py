"""The sweep: which setting of the server, the environment or the clocks wins back speed.

Public face, by module (the package imports none of them itself: `run/findings.py`, which
the bisect and isolate commands import too, needs only `noise.py` and should not load Optuna):

- `search.py`: :class:`SweepSearch`, the experiment (`propose(k)`, `record(work, value)`,
  `replay`, `result()`);
- `work.py`: :class:`SweepSettings`, a restart's `Work` and its phase names;
- `space.py`: :class:`SearchSpace`, the configurations and how one becomes a candidate;
- `study.py`: the Optuna study and sampler (`open_study`, `make_sampler`);
- `confirm.py`: the head-to-head confirmation and :class:`SweepResult`;
- `effects.py`, `importance.py`, `noise.py`: the additive model, parameter importances and
  the restart noise and pruning rule.

Why the sweep is not behind :class:`~orchestrator.strategies.base.Strategy`: that contract is
a function of the observations. `propose(observations, pending, k)` names points the strategy
can rebuild from the observations alone, and a resumed run hands every stored observation to a
fresh instance and must reach the same verdict (the conformance suite checks it). The sweep's
state is its Optuna study instead: a configuration exists only once the sampler asks for it,
each ask changes the study (its sampler's history, the grid's queue, pruned trials), and what
TPE asks next cannot be recomputed from the measured values; a resumed sweep reopens the study
(`optuna.db`) and replays its trials into it. Its answer is a configuration with a confirmed
effect and parameter importances, not culprits over points with a posterior. An adapter would
have to ignore the observations it is handed, which breaks the contract rather than meeting
it; the part of the contract the sweep does share (it ends within its budget, is pure apart
from the study, and is deterministic) is checked through its own loop in
`tests/conformance/test_strategies.py`.
"""

from __future__ import annotations

# The parameter-importance evaluators `importance.py` offers (the knob that picks one,
# `experiment.params.importance`, is checked in config/params.py against this).
EVALUATORS = ("additive", "fanova", "mdi", "ped_anova")
