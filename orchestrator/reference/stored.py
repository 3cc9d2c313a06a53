"""`sleuth trial from_log=PATH run_id=NAME`: an old log kept as a run, a reference for later.

The run holds the parsed summary (`log_reference.json`: what the log tells and what it cannot,
the levels, the repository and commit named, if any) and one trial row per server lifetime in
the log, phase `log`, its samples as repetitions and its partial fingerprint, so `sleuth report`
and the trial listings show it like any other run. `reference=NAME` reads the summary back
(:func:`orchestrator.reference.record.load_any`): the same record as `reference=log:PATH`, without
the log files.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.records import Candidate, Measurement, Outcome, TrialResult
from orchestrator.reference.parsed import ParsedLog
from orchestrator.reference.record import STORED
from orchestrator.store import RunStore

PHASE = "log"


def store_log(run_dir: Path, store: RunStore, log: ParsedLog, summary: dict, *,
              repo: str | None, sha: str | None) -> list[int]:
    """Write the summary and one trial row per lifetime; returns the trial ids."""
    (run_dir / STORED).write_text(json.dumps(
        {"summary": summary, "repo": repo, "commit": sha, "files": list(log.files)},
        indent=1, sort_keys=True, default=str))
    cand = Candidate.make(sha or "")
    cand_id = store.candidate_id(cand)
    ids = []
    by_index = {lt["index"]: lt for lt in summary["lifetimes"]}
    for lt in log.lifetimes:
        trial_id = store.begin_trial(cand_id, node="log", phase=PHASE)
        brief = by_index.get(lt.index, {})
        fp = {"source": "log", "log": {"where": lt.where, "chosen": brief.get("chosen", False),
                                       "first": brief.get("first"), "last": brief.get("last")},
              "env": {"server": brief.get("nccl_env", {}), "source": "log",
                      "nccl_known": lt.nccl_info},
              "gpu": {"nccl_version": lt.nccl_version} if lt.nccl_version else {},
              "server_args": brief.get("server_args")}
        measurements = tuple(Measurement(i, dict(s.metrics)) for i, s in enumerate(lt.samples))
        detail = (f"read from the log ({lt.where}): {len(lt.samples)} samples"
                  + ("" if brief.get("chosen") else "; another configuration, not the reference"))
        # No start and end times: the lifetime is not a restart sleuth ran, and a trial's
        # times are what its cost is counted from (its times are in the fingerprint).
        store.finish_trial(trial_id, TrialResult(
            outcome=Outcome.OK, detail=detail, measurements=measurements, node="log",
            fingerprint=fp))
        ids.append(trial_id)
    return ids
