"""The reference record of an old log: what `compare`, `isolate` and `investigate` take from
`reference=log:PATH` (the same shape as a reference run's, `commands/compare.load_reference`).

- **candidate**: the commit is not in the log. It is the `good=` an investigation names, else
  `commit=` (default HEAD), and the record says so;
- **values**: per server lifetime of the chosen configuration, the median of each metric's
  samples (a log of one server run is a reference of one restart);
- **config**: the logged server settings the target sets (`server_args.target_settings`),
  taken over the defaults as a reference run's `config.yaml` is;
- **fingerprint**: partial, marked `"source": "log"`: the NCCL release and the NCCL variables
  NCCL reported, the logged server settings, the NCCL host; everything else is unknown, and
  :mod:`orchestrator.reference.diff` says so instead of guessing;
- **log**: the summary (files, lifetimes, levels and their spread over time, what the log
  knows and what it does not), printed at the start of the run and kept in the findings.

The chosen configuration is the last lifetime's that logged `server_args=`; earlier
lifetimes with the same settings (and NCCL) are more restarts of it, others are left out and
named.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from orchestrator.errors import UserError
from orchestrator.live.proc import uptime_text
from orchestrator.records import Candidate
from orchestrator.reference.parsed import Lifetime, ParsedLog, parse_files, spread
from orchestrator.reference.server_args import comparable, target_settings
from orchestrator.system.redact import redact_config, redact_env

PREFIX = "log:"
STORED = "log_reference.json"  # a run made by `sleuth trial from_log=PATH`
# NCCL never echoes its debug settings: their absence from the INFO lines says nothing.
NCCL_SILENT = ("NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE")
NOT_IN_LOG = ("clocks and power limit", "GPU driver and CUDA", "GPU model and PCIe link",
              "package versions other than NCCL", "other GPU processes")


@dataclass(frozen=True)
class ReferenceQuery:
    """What the loader reads of a run's settings (`commands/parts.reference_query`): where
    runs and the repository are, this run's id (its own copy of a log), the commit a log is
    measured at (`good=`, else `commit=`), the log's line pattern and the target (which of
    the logged server settings it sets)."""

    repo: str | None
    runs_dir: Path
    run_id: str | None = None
    commit: str = "HEAD"
    good: str | None = None
    log_pattern: str = ""
    target: object = None


def is_log(spec: str | None) -> bool:
    return bool(spec) and str(spec).startswith(PREFIX)


def stored(q: ReferenceQuery, ref: str | None) -> Path | None:
    """The stored log reference of the run `ref` names, when `sleuth trial from_log` made it."""
    if not ref or is_log(ref):
        return None
    path = Path(str(ref)).expanduser()
    if not path.is_dir():
        path = q.runs_dir / str(ref)
    found = path / STORED
    return found if found.is_file() else None


def _own_copy(q: ReferenceQuery) -> Path | None:
    """The copy of the log's summary a run keeps (`keep`): a resumed run reads the log as it
    was read at its start, not as rotation has left it since."""
    if not q.run_id:
        return None
    path = q.runs_dir / q.run_id / STORED
    return path if path.is_file() else None


def keep(run_dir: Path, ref: Mapping) -> None:
    """Write the log reference's summary into the run, once (see `_own_copy`)."""
    path = run_dir / STORED
    if "log" not in ref or path.exists():
        return
    path.write_text(json.dumps({"summary": ref["log"], "repo": ref.get("repo"),
                                "commit": ref["candidate"].commit,
                                "files": ref["log"].get("files", []), "name": ref["name"]},
                               indent=1, sort_keys=True, default=str))


def load_any(q: ReferenceQuery, ref: str) -> dict:
    """The record of `log:PATH` or of a stored log reference run; the commit it is measured
    at is resolved in `repo` (the log does not say which code ran)."""
    from orchestrator.workspace import Workspace

    doc = None
    own = _own_copy(q) if is_log(ref) else None
    if own is not None or not is_log(ref):
        path = own or stored(q, ref)
        assert path is not None
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise UserError(f"{ref}: the stored log reference cannot be read ({exc})") from exc
        changes = {}
        if not q.repo and doc.get("repo"):
            changes["repo"] = doc["repo"]
        if doc.get("commit") and q.commit == "HEAD" and not q.good:
            changes["commit"] = doc["commit"]  # the commit named when the log was stored
        q = dataclasses.replace(q, **changes)
    if not q.repo:
        raise UserError(f"reference={ref}: add repo=PATH (a log does not say which code ran;"
                        " the reference is measured at commit=, HEAD by default)")
    repo = Path(q.repo).expanduser().resolve()
    resolve = Workspace(repo, q.runs_dir / ".cache" / "worktrees").resolve
    if doc is None:
        return load(q, ref[len(PREFIX):], resolve)
    name = doc.get("name", ref) if own is not None else Path(str(path.parent)).name
    record = from_summary(q, doc["summary"], name, resolve)
    record["repo"] = str(repo)
    record["stored"] = True
    return record


def _config_key(lt: Lifetime) -> str:
    args = {k: v for k, v in (lt.server_args or {}).items() if comparable(k)}
    return json.dumps([args, lt.nccl_env, lt.nccl_version], sort_keys=True, default=str)


def choose(lifetimes: Sequence[Lifetime]) -> tuple[list[Lifetime], list[Lifetime]]:
    """(the lifetimes of the reference's configuration, the others). The configuration is the
    last one the log printed; without any `server_args=` every lifetime counts, its
    configuration unknown."""
    started = [lt for lt in lifetimes if lt.server_args is not None]
    if not started:
        return list(lifetimes), []
    key = _config_key(started[-1])
    chosen = [lt for lt in started if _config_key(lt) == key]
    return chosen, [lt for lt in lifetimes if lt not in chosen]


def _duration(lt: Lifetime) -> float | None:
    if lt.first is None or lt.last is None:
        return None
    return max(0.0, lt.last - lt.first)


def _stamp_text(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    from datetime import UTC, datetime

    return datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _trend(lt: Lifetime, metric: str) -> dict[str, float] | None:
    """The level in the first and the last quarter of the lifetime's samples (by time): a
    level that drifted within one server run shows here."""
    vals = [(s.stamp or 0.0, s.metrics[metric]) for s in lt.samples if metric in s.metrics]
    if len(vals) < 8:
        return None
    vals.sort()
    q = len(vals) // 4
    first = sorted(v for _, v in vals[:q])
    last = sorted(v for _, v in vals[-q:])
    return {"first_quarter": first[len(first) // 2], "last_quarter": last[len(last) // 2]}


def summarize(log: ParsedLog) -> dict:
    """A JSON-able summary of the log: every lifetime, the chosen ones, the levels."""
    chosen, others = choose(log.lifetimes)
    lifetimes = []
    for lt in log.lifetimes:
        levels = {}
        for m in lt.metrics:
            s = spread(lt.values(m))
            if s is not None:
                trend = _trend(lt, m)
                levels[m] = {**s, **({"trend": trend} if trend else {})}
        running = sorted(lt.running_req)
        lifetimes.append({
            "index": lt.index, "where": lt.where, "chosen": lt in chosen,
            "started": _stamp_text(lt.started), "first": _stamp_text(lt.first),
            "last": _stamp_text(lt.last), "seconds": _duration(lt),
            "server_args": redact_config(lt.server_args) if lt.server_args is not None else None,
            "args_form": lt.args_form, "nccl_info": lt.nccl_info,
            "nccl_version": lt.nccl_version, "nccl_env": redact_env(lt.nccl_env),
            "nccl_conflicts": list(lt.nccl_conflicts), "hosts": list(lt.hosts),
            "levels": levels,
            "running_req": ({"min": running[0], "median": running[len(running) // 2],
                             "max": running[-1]} if running else None),
            "gc_pauses": len(lt.gc_pauses),
            "prefill": {"lines": lt.prefill[0], "new_tokens": lt.prefill[1],
                        "cached_tokens": lt.prefill[2]}})
    return {"files": list(log.files), "lines": log.lines, "problems": list(log.problems),
            "pattern": log.pattern, "lifetimes": lifetimes,
            "chosen": [lt.index for lt in chosen], "left_out": [lt.index for lt in others]}


def load(q: ReferenceQuery, spec: str, resolve) -> dict:
    """The reference record of `log:PATH` (`spec` without the prefix); `resolve` turns a ref
    into a SHA. Bad input (no file, nothing readable) is a UserError."""
    log = parse_files(spec, q.log_pattern)
    summary = summarize(log)
    names = [Path(f).name for f in log.files]
    name = PREFIX + names[0] + (f" (+{len(names) - 1} more)" if len(names) > 1 else "")
    return from_summary(q, summary, name, resolve)


def reference_commit(q: ReferenceQuery, resolve) -> tuple[str, str]:
    """(SHA, how it was chosen): the log does not say which code ran."""
    ref = q.good if q.good is not None else (q.commit or "HEAD")
    sha = resolve(ref)
    if q.good is not None or q.commit not in ("", "HEAD"):
        return sha, f"measured at {ref} ({sha[:12]}), as named"
    return sha, (f"measured at HEAD ({sha[:12]}), the default: good=REF or commit=REF names"
                 " the commit it ran")


def from_summary(q: ReferenceQuery, summary: Mapping, name: str, resolve) -> dict:
    """The reference record from a log's summary (a fresh parse, or a stored run's)."""
    chosen = [lt for lt in summary["lifetimes"] if lt["chosen"]]
    if not chosen:
        raise UserError(f"{name}: no server run in the log to take as the reference")
    sha, how = reference_commit(q, resolve)
    last = chosen[-1]
    args = last.get("server_args") or None
    values = levels(chosen)
    nccl_info = any(lt.get("nccl_info") for lt in chosen)
    env_then = dict(last.get("nccl_env") or {})
    if nccl_info:
        env_then.setdefault("NCCL_DEBUG", "INFO")  # its own lines say it was INFO (or more)
    fp: dict[str, Any] = {
        "source": "log", "git": {}, "packages": {}, "telemetry": None,
        "env": {"server": env_then, "source": "log", "nccl_known": nccl_info},
        "gpu": ({"nccl_version": last["nccl_version"]} if last.get("nccl_version") else {}),
        "host": {"hostname": last["hosts"][0]} if last.get("hosts") else {},
        "server_args": args, "log": {"files": summary["files"], "chosen": summary["chosen"]},
    }
    config = {"target": target_settings(args, q.target)} if args else {}
    knows, unknown = statements(summary, chosen, values, how)
    return {"candidate": Candidate.make(sha), "values": values, "fingerprint": fp,
            "fingerprints": [fp], "repo": None, "name": name, "config": config,
            "telemetry": [None], "trials": [], "run": True,
            "log": {**dict(summary), "knows": knows, "unknown": unknown,
                    "commit": how}}


def levels(chosen: Sequence[Mapping]) -> dict[str, list[float]]:
    """Each metric's level per chosen lifetime (the median of its samples)."""
    values: dict[str, list[float]] = {}
    for lt in chosen:
        for metric, s in (lt.get("levels") or {}).items():
            if s and math.isfinite(float(s["median"])):
                values.setdefault(metric, []).append(float(s["median"]))
    return values


def preview(summary: Mapping, how: str) -> list[str]:
    """What a log tells and cannot tell, as `sleuth trial from_log` prints it."""
    chosen = [lt for lt in summary["lifetimes"] if lt["chosen"]]
    if not chosen:
        return ["no server run in the log to take as a reference"]
    knows, unknown = statements(summary, chosen, levels(chosen), how)
    return ([f"the log tells: {k}" for k in knows]
            + ["not in the log: " + "; ".join(unknown)])


def statements(summary: Mapping, chosen: Sequence[Mapping], values: Mapping[str, list[float]],
               how: str) -> tuple[list[str], list[str]]:
    """What the log tells (one line each) and what it cannot tell."""
    knows, unknown = [], []
    last = chosen[-1]
    runs = len(chosen)
    where = last.get("where", "")
    if last.get("server_args") is not None:
        knows.append(f"server settings: server_args= at {where} ({len(last['server_args'])}"
                     f" fields, {'a dict' if last.get('args_form') == 'dict' else 'a ServerArgs repr'})")
    else:
        unknown.append("server settings (the server's start is not in the log)")
    if any(lt.get("nccl_info") for lt in chosen):
        env = last.get("nccl_env") or {}
        shown = ", ".join(f"{k}={v}" for k, v in sorted(env.items())) or "none set"
        knows.append(f"NCCL {last.get('nccl_version') or '(version line missing)'}; its"
                     f" variables from the environment: {shown} (NCCL_DEBUG=INFO)")
    else:
        unknown.append("the NCCL release and NCCL variables (no NCCL INFO lines:"
                       " NCCL_DEBUG was not INFO)")
    for metric in sorted(values):
        per = [lt["levels"][metric] for lt in chosen if metric in (lt.get("levels") or {})]
        n = sum(int(s["n"]) for s in per)
        s = per[-1]
        trend = s.get("trend")
        drift = (f"; first quarter {trend['first_quarter']:.4g}, last quarter"
                 f" {trend['last_quarter']:.4g}" if trend else "")
        seconds = sum(float(lt.get("seconds") or 0.0) for lt in chosen)
        knows.append(f"{metric} {_level(values[metric])} (median of {n} lines over"
                     f" {uptime_text(seconds)} in {runs} server run{'s' if runs != 1 else ''};"
                     f" 10-90%: {s['p10']:.4g}-{s['p90']:.4g}{drift})")
    left = summary.get("left_out") or []
    if left:
        knows.append(f"left out: {len(left)} earlier server run(s) with another configuration"
                     " or an unknown start")
    unknown += list(NOT_IN_LOG)
    unknown.append("environment variables other than NCCL_*")
    unknown.append(f"the commit it ran ({how})")
    running, prefill = last.get("running_req"), last.get("prefill") or {}
    seen = []
    if running:
        seen.append(f"#running-req {running['min']}-{running['max']}, median"
                    f" {running['median']}")
    if prefill.get("lines"):
        new, cached = prefill["new_tokens"], prefill["cached_tokens"]
        seen.append(f"{prefill['lines']} prefill batches, {new / prefill['lines']:.0f} new"
                    f" tokens each, {100 * cached / max(new + cached, 1):.0f}% from the prefix"
                    " cache")
    unknown.append("the workload (sleuth's bench is not the traffic then"
                   + (f"; the log shows {'; '.join(seen)})" if seen else ")"))
    return knows, unknown


def _level(vals: Sequence[float]) -> str:
    if len(vals) == 1:
        return f"{vals[0]:.4g}"
    return f"{sum(vals) / len(vals):.4g} (runs: {', '.join(f'{v:.4g}' for v in vals)})"


def describe(ref: Mapping) -> list[str]:
    """The lines a command prints about a log reference before it measures."""
    log = ref.get("log") or {}
    if not log:
        return []
    out = [f"reference {ref['name']}: {len(log.get('files', []))} file(s), {log.get('lines')}"
           " lines"]
    out += [f"  the log tells: {k}" for k in log.get("knows", [])]
    out.append("  not in the log: " + "; ".join(log.get("unknown", [])))
    for p in log.get("problems", [])[:3]:
        out.append(f"  could not read: {p}")
    return out


def no_level(ref: Mapping, metric: str) -> str | None:
    """Why a log reference has no level of `metric` (None when it has one, or for a run)."""
    if "log" not in ref or ref.get("values", {}).get(metric):
        return None
    have = ", ".join(sorted(ref.get("values", {}))) or "none"
    return (f"the log holds no {metric} (its metrics: {have}; a line that prints it is read"
            f" with log.pattern='... (?P<{metric}>[0-9.]+) ...')")
