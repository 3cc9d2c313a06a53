"""What each run of a story cost: its restarts by phase and its (modeled) GPU-minutes.

    python -m experiments.story_costs RUN_DIR [RUN_DIR ...]

For each run directory: the command, the trials by phase (a `live` row is the running server,
measured without a restart; `fresh` rows are fresh starts of its command; `log` rows are an old
log kept as a run: neither costs a restart), the restarts (trials that launched a server), and
the GPU-minutes the trials held the node (`orchestrator/run/cost.py`; modeled on the simulated
node, where no GPU was used). `docs/system-level.md` lists them for the stories of
`tests/test_live_log_stories.py`:

    .venv/bin/python -m pytest tests/test_live_log_stories.py --basetemp=/tmp/stories
    .venv/bin/python -m experiments.story_costs /tmp/stories/*/runs/*/
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from orchestrator.config.settings import saved_values
from orchestrator.run.cost import describe_cost, gpu_minutes, simulated
from orchestrator.store import RunStore

NO_RESTART = ("live", "log")


def summary(run_dir: Path) -> str:
    store = RunStore.open(run_dir / "trials.db", readonly=True)
    try:
        rows = store.trials()
        command, config = store.command, saved_values(store.config_yaml())
    finally:
        store.close()
    target = config.get("target") or {}
    phases = Counter(r.phase or "trial" for r in rows)
    restarts = sum(n for phase, n in phases.items() if phase not in NO_RESTART)
    minutes = gpu_minutes(rows, target)
    shown = ", ".join(f"{phase} {n}" for phase, n in sorted(phases.items()))
    return (f"{run_dir.name}: {command}; trials {len(rows)} ({shown}); restarts {restarts};"
            f" {describe_cost(minutes, simulated(target))}")


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for arg in argv:
        path = Path(arg)
        if (path / "trials.db").is_file():
            print(summary(path))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
