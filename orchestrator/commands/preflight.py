"""The checks of `bisect`, `investigate` and `trial` that need no trial, run before the
command's own module is imported.

Why a separate step: a command's module brings the controller (Ray) and the statistics (SciPy)
with it, which is most of the two seconds a refusal used to take; a typo in a ref or a metric
should be refused in the time it takes to read the repository. These are the command's own
checks, called the same way (the command runs them again, at no cost worth counting); anything
this step cannot judge alone (a reference run, candidate specs, a resumed run) is left to the
command, which refuses it before Ray starts as before.
"""

from __future__ import annotations

from orchestrator.commands import common
from orchestrator.config.settings import RunSettings, as_dict
from orchestrator.metrics import check_metric

RANGE_COMMANDS = ("bisect", "investigate")


def check(command: str, cfg: RunSettings) -> None:
    """Raise the command's own UserError for a bad target, metric, repository, ref or range."""
    if command not in (*RANGE_COMMANDS, "trial"):
        return
    if cfg.run_id and (cfg.runs_root / str(cfg.run_id)).exists():
        return  # continuing a run: its stored configuration is what counts
    if (command == "trial" and cfg.from_log) or (command == "investigate" and cfg.live.server):
        return  # a log read, a live server attached: their own checks, nothing launched yet
    cfg = common.check_common(cfg)
    if command == "trial":
        common.workspace(cfg).resolve(str(cfg.commit))
        return
    check_metric(cfg.metric, custom=cfg.target.name == "command", target=as_dict(cfg.target))
    if command == "investigate" and cfg.reference:
        return  # the reference names the repository and the good state
    if command == "bisect" and cfg.package.name.strip():
        # `package=NAME`: good and bad are two releases of it, searched at the run's commit
        common.workspace(cfg).resolve(str(cfg.commit))
        return
    good, bad = cfg.good, cfg.bad
    if not isinstance(good, str) or not isinstance(bad, str) or not good or not bad:
        return  # the command says what is missing or misplaced
    ws = common.workspace(cfg)
    # the same commit: the bisect's word is the workspace's; investigate has its own
    if command == "bisect" or ws.resolve(good) != ws.resolve(bad):
        ws.commits_between(good, bad, first_parent=cfg.first_parent)
