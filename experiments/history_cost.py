"""The end of a bisect's run: its posterior history from the run's own record against the
replay it replaced, in CPU seconds, on the first k trials of a recorded run.

    python -m experiments.history_cost RUN_DIR

RUN_DIR is a finished bisect run whose live record (`posterior-steps.jsonl`) is complete, e.g.
the 500-trial soak's (`pytest -m soak tests/test_soak.py` keeps it under pytest's temporary
directory; docs/reliability.md quotes one). Nothing in RUN_DIR is changed: each k works in a
temporary directory.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path


def main(run_dir: Path) -> None:
    from orchestrator.config.bisect import bisect_strategy  # noqa: F401 - imported before timing
    from orchestrator.ui.report import load_run, replay_cache, series

    data = load_run(run_dir)
    lines = (run_dir / replay_cache.STEPS).read_text().splitlines()
    recorded = replay_cache.recorded
    print("trials  record_cpu_s  replay_cpu_s")
    for k in (125, 250, 375, 500):
        rows = tuple(data.rows[:k])
        ids = {r.id for r in rows}
        tmp = Path(tempfile.mkdtemp())
        try:
            (tmp / replay_cache.STEPS).write_text("\n".join(
                ln for ln in lines if set(json.loads(ln)["trials"]) <= ids) + "\n")
            sub = dataclasses.replace(data, rows=rows, run_dir=tmp)
            replay_cache.recorded = recorded
            began = time.process_time()
            assert series.posterior_history(sub) is not None
            from_record = time.process_time() - began
            (tmp / replay_cache.FILENAME).unlink()
            replay_cache.recorded = lambda *a: None  # as before the record existed
            began = time.process_time()
            series.posterior_history(sub)
            replayed = time.process_time() - began
        finally:
            replay_cache.recorded = recorded
            shutil.rmtree(tmp)
        print(f"{k:6d}  {from_record:12.2f}  {replayed:12.2f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m experiments.history_cost RUN_DIR")
    main(Path(sys.argv[1]))
