"""The reference a compare (isolate, investigate, bisect's level) re-measures: loaded from a
run, a fingerprint file or an old log, and adopted: its target and bench settings replace the
defaults, and a command-line setting that would change its configuration is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

from orchestrator.answer import phases
from orchestrator.commands import common, parts
from orchestrator.config.compose import defaults
from orchestrator.config.settings import RunSettings, as_dict, evolve, saved_values
from orchestrator.control import packages
from orchestrator.errors import UserError
from orchestrator.metrics import EFFECT_METRICS
from orchestrator.records import Candidate
from orchestrator.reference import record as log_record
from orchestrator.store import RunStore
from orchestrator.system.redact import is_redacted, redact_config
from orchestrator.util.pins import pin_list

# Settings that say where a trial runs rather than what it measures: the compare's own apply.
WHERE = {"target": ("host", "gpu_state", "python")}


def load_reference(cfg: RunSettings, ref: str) -> dict:
    """The reference: its candidate, trial-level values per metric, fingerprint, repo. An old
    server log (`log:PATH`, or a run `sleuth trial from_log=PATH` made) gives a partial one
    (:mod:`orchestrator.reference.record`)."""
    query = parts.reference_query(cfg)
    if log_record.is_log(ref) or log_record.stored(query, ref) is not None:
        return log_record.load_any(query, ref)
    path = Path(ref).expanduser()
    if path.is_file():
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"reference {ref}: not a readable fingerprint JSON ({exc})") from exc
        if "fingerprint" not in doc or "candidate" not in doc:
            raise UserError(f"reference {ref}: a fingerprint file needs 'candidate' and 'fingerprint'")
        return {"candidate": Candidate.from_json(doc["candidate"]), "values": doc.get("values", {}),
                "fingerprint": doc["fingerprint"], "repo": doc.get("repo"), "name": path.name,
                "config": doc.get("config"),
                "telemetry": [doc["fingerprint"].get("telemetry")],
                "fingerprints": [doc["fingerprint"]]}
    run_dir = parts.find_run(cfg, ref)
    store = RunStore.open(run_dir / "trials.db")
    try:
        rows = [r for r in store.trials() if r.outcome and r.outcome.measured and not r.suspect]
        if not rows:
            raise UserError(f"reference run {run_dir.name} has no measured trial")
        by_key: dict[str, list] = {}
        for r in rows:
            by_key.setdefault(r.candidate.key, []).append(r)
        chosen = max(by_key.values(), key=len)  # the candidate the reference measured most
        ref_cfg = saved_values(store.config_yaml())
    finally:
        store.close()
    # Every metric the reference measured, not only SGLang's: a `target=command` bench's
    # `value` or any key of its JSON line is as comparable as verify_ms.
    names = dict.fromkeys((*EFFECT_METRICS, *phases.SIDE_METRICS))
    for r in chosen:
        names.update(dict.fromkeys(r.result.metric_names()))
    values = {m: [v for r in chosen if (v := r.result.value(m)) is not None] for m in names}
    fps = [r.result.fingerprint for r in chosen]
    return {"candidate": chosen[0].candidate, "values": {m: v for m, v in values.items() if v},
            "fingerprint": chosen[-1].result.fingerprint, "repo": ref_cfg.get("repo"),
            "name": run_dir.name, "trials": [r.id for r in chosen],
            "config": {part: ref_cfg[part] for part in ("target", "bench") if part in ref_cfg},
            "telemetry": [fp.get("telemetry") for fp in fps], "fingerprints": fps}


def adopt_reference_config(cfg: RunSettings, ref: dict,
                           resolve=None) -> tuple[RunSettings, list[str]]:
    """`cfg` made to measure what the reference measured: its target and bench settings
    replace the defaults, and a setting the user gave that would change the reference's
    configuration is refused (one line, exit 2). Returns the settings to run with and the
    settings taken from the reference."""
    default = defaults(cfg.command, cfg.target.name)
    conflicts = _candidate_conflicts(cfg, ref["candidate"], default, resolve)
    config = ref.get("config") or {}
    adopted: list[str] = []
    taken: dict[str, object] = {}
    for part in ("target", "bench"):
        theirs_part = config.get(part)
        if not theirs_part:
            continue
        mine_part = as_dict(getattr(cfg, part))
        default_part = as_dict(getattr(default, part))
        if part == "target" and theirs_part.get("name") != mine_part.get("name"):
            raise UserError(f"the reference ran target={theirs_part.get('name')} and this compare"
                            f" target={mine_part.get('name')}: add target="
                            f"{theirs_part.get('name')} to re-measure the reference")
        same_group = default_part.get("name") == mine_part.get("name")
        for key in sorted(set(theirs_part) | set(mine_part)):
            if key in WHERE.get(part, ()) or key not in mine_part or key not in theirs_part:
                continue  # where it runs, or a setting one of the two versions does not have
            theirs, mine = theirs_part.get(key), mine_part.get(key)
            if theirs == mine:
                continue
            recorded = bool(_redacted(theirs))
            if recorded and redact_config(mine, key) == theirs:
                continue  # the command line gives the secret the record left out
            user_set = not same_group or mine != default_part.get(key)
            if recorded:
                raise UserError(f"the reference's {part}.{key} held a secret that was not"
                                f" recorded: give {part}.{key} again on the command line")
            if user_set:
                conflicts.append(f"{part}.{key}={mine!r} (the reference ran {theirs!r})")
                continue
            taken[f"{part}.{key}"] = theirs
            adopted.append(f"{part}.{key}={theirs!r}")
    if conflicts:
        raise UserError("compare re-measures the reference's own configuration, and the command"
                        " line changes it: " + "; ".join(conflicts) + ". Leave these out (to test"
                        " a change, use isolate good.*=... bad.*=...)")
    cfg = evolve(cfg, taken)
    common.require_bench(cfg)
    return cfg, adopted


def _candidate_conflicts(cfg: RunSettings, cand: Candidate, default: RunSettings,
                         resolve) -> list[str]:
    """What the command line sets of the candidate (commit, clock, env, patches, pins) that
    the reference ran otherwise."""
    conflicts = []
    for key, mine, theirs in (("commit", str(cfg.commit), cand.commit),
                              ("clock", cfg.clock, cand.clock)):
        if key == "commit" and resolve is not None and mine != str(getattr(default, key)):
            mine = resolve(mine)
        if mine != str(getattr(default, key)) and mine != theirs:
            conflicts.append(f"{key}={mine[:12]} (the reference ran {theirs[:12]})")
    env = {str(k): str(v) for k, v in cfg.env.items()}
    if env and env != cand.env_dict:
        conflicts.append(f"env {env} (the reference ran {cand.env_dict or 'none'})")
    if list(cfg.patches):
        conflicts.append("patches= (the reference's own patches are re-applied)")
    pins = packages.fixed_pins(cfg.packages)
    if pins and pins != cand.package_dict:
        ran = ", ".join(cand.packages) or "the node's own packages"
        conflicts.append(f"packages=[{', '.join(pin_list(pins))}] (the reference ran {ran})")
    return conflicts


def _redacted(value: object) -> bool:
    if isinstance(value, dict):
        return any(_redacted(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(_redacted(v) for v in value)
    return is_redacted(value)


# A change is called only at this level (the check runs after every batch), and only once the
# pooled restart noise rests on this many degrees of freedom: a reference is often one restart,
# and two or three restarts now can show almost no spread by chance, which once made a 3% luck
# of the reference's single restart read as "system level: +3.5% [+2.9, +4.0]".
