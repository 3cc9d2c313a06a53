"""The Optuna study of a sweep: storage, sampler, direction.

Optuna is the search only (ask/tell); sleuth's controller runs the trials. The study lives in
`runs/<id>/optuna.db` (SQLite through Optuna's RDB storage), beside sleuth's own `trials.db`:
trials.db is the truth about measurements, optuna.db about which configurations were asked and
what the sampler was told. Samplers keep no state outside the study, so reopening the database
and building the sampler again resumes the search; `optuna-dashboard sqlite:///runs/<id>/optuna.db`
shows it live.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import optuna

from orchestrator.errors import UserError
from orchestrator.strategies.sweep.space import SearchSpace

SAMPLERS = ("tpe", "random", "grid")
OPTUNA_DB = "optuna.db"


def storage_url(run_dir: Path) -> str:
    return f"sqlite:///{(run_dir / OPTUNA_DB).resolve()}"


def quiet_optuna() -> None:
    """Optuna logs every trial and warns about experimental options; sleuth prints its own."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)


STARTUP_SHARE = 0.4


def tpe_startup_trials(budget: int, share: float = STARTUP_SHARE) -> int:
    """Random configurations before TPE models the results: 40% of the search budget.

    With restart noise as large as the differences between good configurations, TPE's split
    into "good" and "bad" trials is itself noisy; it pays to let a balanced random design
    inform the additive model (`effects.py`) and the importance first (docs/benchmarks.md,
    "Sweep": measured against Optuna's default of 10 with `python -m experiments.bench_sweep`)."""
    return max(4, int(round(budget * share)))


def make_sampler(name: str, space: SearchSpace, *, seed: int, budget: int,
                 startup: float = STARTUP_SHARE) -> optuna.samplers.BaseSampler:
    """TPE (default), random, or a grid (`search.py` walks the grid itself: see there)."""
    quiet_optuna()
    if name == "tpe":
        return optuna.samplers.TPESampler(
            seed=seed,
            n_startup_trials=tpe_startup_trials(budget, startup),
            multivariate=True,  # joint densities: interactions between NCCL knobs exist
            group=True,  # conditional parameters get their own sub-spaces
            constant_liar=True,  # K trials in flight do not all get the same proposal
        )
    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "grid":
        # Every distinct configuration is enqueued once by the search itself, in a seeded
        # order: Optuna's GridSampler walks the product of all levels, which repeats a
        # configuration once per level of each inactive conditional parameter.
        if space.grid() is None:
            raise UserError("sampler=grid needs a finite space: give every range a step")
        return optuna.samplers.RandomSampler(seed=seed)
    raise UserError(f"sampler must be one of {', '.join(SAMPLERS)} (got {name!r})")


def open_study(*, name: str, storage: str | None, sampler: optuna.samplers.BaseSampler,
               maximize: bool) -> optuna.Study:
    """Create the run's study, or load it when the run is resumed. `storage=None`: in memory."""
    quiet_optuna()
    return optuna.create_study(
        study_name=name,
        storage=storage,
        sampler=sampler,
        direction="maximize" if maximize else "minimize",
        load_if_exists=True,
    )
