"""`sleuth kernels then=DIR|FILES now=DIR|FILES [mode=...]`: the kernel diff of profiler traces
the user already has (the fast run's and the slow run's), with the same reader, statistics,
table and figure as an investigation's kernel evidence (orchestrator/evidence).

    sleuth kernels then=traces/fast now=traces/slow
    sleuth kernels then=[fast-1.json.gz,fast-2.json.gz] now=slow.json.gz mode=target_verify

Each side is a directory (its `*.json` / `*.json.gz` files), a file, a glob or a list of those.
One trace file is one restart, except SGLang's names: `{id}-TP-{rank}[-DP-..][-{STAGE}]` files
of one profile id are one restart (rank 0 kept: ranks run the same kernels in lockstep; the
`-EXTEND` / `-DECODE` stage files merged). Traces from several ranks of torch's
`distributedInfo` on one side keep the lowest rank's. Several restarts a side give intervals
across restarts; one a side gives the table as measured, stated as such.

Everything is read and checked before anything is written: a missing path, a directory without
traces, a file that is not a trace or an empty profile, or a mode the traces do not have is one
line on stderr, exit 2. Then the run directory (`runs/<id>/`: config.yaml, trials.db without
trials, findings.json, report.md, report.html, plots/kernels.png) is written and printed.
Exit 0 when the diff is judged (movers or none), 3 when it cannot be (no device time on a side,
or one trace a side).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.requests import KernelsRequest
from orchestrator.config.settings import RunSettings
from orchestrator.errors import UserError
from orchestrator.evidence import kernels as K
from orchestrator.evidence.trace import (
    OTHER_MODE,
    WHOLE_MODE,
    PassProfile,
    TraceError,
    decode_trace,
    merge_profiles,
    pass_profile,
)
from orchestrator.ui import render

SGLANG_NAME = re.compile(r"^(?P<id>.+)-TP-(?P<rank>\d+)(?P<par>(?:-(?:DP|PP|EP)-\d+)*)"
                         r"(?:-(?P<stage>[A-Z][A-Z_]*))?\.trace\.json(?:\.gz)?$")
EXIT_INCONCLUSIVE = 3


@dataclass(frozen=True)
class Side:
    profiles: list[PassProfile]
    files: list[str]  # the files read, as restarts use them
    note: str = ""  # what grouping or choice of rank was made


def _read(side: str, path: Path) -> dict:
    try:
        return decode_trace(path.read_bytes())
    except OSError as exc:
        raise UserError(f"{side}={path}: cannot read it: {exc.strerror}") from exc
    except TraceError as exc:
        raise UserError(f"{side}={path}: {exc}") from exc


def _rank(doc: dict) -> int | None:
    info = doc.get("distributedInfo")
    rank = info.get("rank") if isinstance(info, dict) else None
    return rank if isinstance(rank, int) else None


def load_side(side: str, files: tuple[Path, ...]) -> Side:
    """The side's restarts: files grouped (SGLang's per-rank and per-stage files), one rank
    kept, each restart read into one profile. Refuses what is not a trace."""
    groups: dict[str, list[Path]] = defaultdict(list)
    notes = []
    sglang_ranks: dict[str, set[int]] = defaultdict(set)
    for f in files:
        m = SGLANG_NAME.match(f.name)
        key = f"{f.parent}/{m.group('id')}" if m else str(f)
        if m:
            sglang_ranks[key].add(int(m.group("rank")) * 1000 + len(m.group("par")))
        groups[key].append(f)
    for key, ranks in sglang_ranks.items():  # rank 0 (its first DP/PP/EP part) of each id
        keep = min(ranks)
        chosen = [f for f in groups[key] if (m := SGLANG_NAME.match(f.name))
                  and int(m.group("rank")) * 1000 + len(m.group("par")) == keep]
        if len(chosen) < len(groups[key]):
            notes.append("SGLang rank files: rank 0 kept")
        groups[key] = chosen
    docs = {key: [(f, _read(side, f)) for f in fs] for key, fs in groups.items()}
    ranks = {_rank(doc) for parts in docs.values() for _, doc in parts} - {None}
    if len(ranks) > 1:
        low = min(ranks)
        docs = {k: v for k, v in docs.items() if all(_rank(d) in (low, None) for _, d in v)}
        notes.append(f"traces of ranks {sorted(ranks)}: rank {low}'s kept (one restart is one"
                     " rank's trace)")
    profiles, used = [], []
    for parts in docs.values():
        try:
            read = [pass_profile(doc, source=f.name) for f, doc in parts]
        except TraceError as exc:
            raise UserError(f"{side}={parts[0][0]}: {exc}") from exc
        profiles.append(read[0] if len(read) == 1 else merge_profiles(read, read[0].source))
        used += [str(f) for f, _ in parts]
    if len(profiles) < len(groups) or any(len(v) > 1 for v in groups.values()):
        notes.append(f"{len(used)} file(s) as {len(profiles)} restart(s)")
    return Side(profiles, used, "; ".join(dict.fromkeys(notes)))


def _whole(p: PassProfile) -> PassProfile:
    """Every device event of the trace as one pass (`mode=all`)."""
    ms: dict[tuple[str, str], float] = defaultdict(float)
    att: dict[tuple[str, str], float] = defaultdict(float)
    calls: dict[tuple[str, str], int] = defaultdict(int)
    for (_, k), v in p.kernel_ms.items():
        ms[(WHOLE_MODE, k)] += v
    for (_, k), v in p.attention_ms.items():
        att[(WHOLE_MODE, k)] += v
    for (_, k), n in p.calls.items():
        calls[(WHOLE_MODE, k)] += n
    return PassProfile({WHOLE_MODE: 1}, dict(ms), p.source, dict(calls), dict(att),
                       p.host_events)


def select_modes(before: list[PassProfile], after: list[PassProfile], modes: tuple[str, ...]
                 ) -> tuple[list[PassProfile], list[PassProfile]]:
    """The profiles with only `modes` kept (`all`: each trace as one pass); a mode that is not
    in every trace is refused, naming the modes the traces have."""
    if modes == (WHOLE_MODE,):
        return [_whole(p) for p in before], [_whole(p) for p in after]
    if not modes:
        return before, after
    both = [*before, *after]
    for m in modes:
        if m == OTHER_MODE:
            if not all(sum(p.passes.values()) for p in both):
                raise UserError("mode=other: device time outside the steps needs step spans in"
                                " every trace")
            continue
        if not all(p.passes.get(m, 0) for p in both if p.device_ms > 0):
            have = sorted({x for p in both for x in p.passes})
            raise UserError(f"mode={m}: not in every trace (the traces have:"
                            f" {', '.join(have) or 'no step spans'})")

    def keep(p: PassProfile) -> PassProfile:
        return PassProfile(p.passes, {k: v for k, v in p.kernel_ms.items() if k[0] in modes},
                           p.source, {k: v for k, v in p.calls.items() if k[0] in modes},
                           {k: v for k, v in p.attention_ms.items() if k[0] in modes},
                           p.host_events)

    return [keep(p) for p in before], [keep(p) for p in after]


def _verdict(d: K.KernelDiff) -> str:
    if d.no_device:
        return "no_device_time"
    if not d.intervals:
        return "not_judged"
    return "moved" if d.movers else "no_mover"


def run(cfg: RunSettings) -> int:
    from orchestrator.commands.parts import create_run, pin_run
    from orchestrator.ui.report import kernels_page

    req = KernelsRequest.of(cfg)
    then, now = load_side("then", req.then), load_side("now", req.now)
    before, after = select_modes(then.profiles, now.profiles, req.modes)
    d = K.diff(before, after)
    cfg = pin_run(cfg)
    run_dir, store = create_run(cfg)
    try:
        entry = {"cause": "then -> now", "kind": "traces", "id": "kernels",
                 "before": "then", "after": "now", **K.to_json(d), "table": K.table(d)}
        doc = {"run": store.run_id, "experiment": "kernels", "metric": "device ms per pass",
               "verdict": _verdict(d), "message": entry["line"], "findings": [],
               "modes": list(req.modes),
               "sides": {name: {"files": s.files, "restarts": len(s.profiles), "note": s.note}
                         for name, s in (("then", then), ("now", now))},
               "answer": {"sentence": entry["line"], "evidence": [entry]}}
        (run_dir / kernels_page.FINDINGS).write_text(json.dumps(doc, indent=2) + "\n")
        md, page, png = kernels_page.write(run_dir, doc)
        code = 0 if doc["verdict"] in ("moved", "no_mover") else EXIT_INCONCLUSIVE
        store.set_status("done" if code == 0 else "inconclusive")
    finally:
        store.close()
    out = render.console()
    out.print(f"run directory: {run_dir}")
    for name, s in (("then", then), ("now", now)):
        out.print(f"{name}: {len(s.profiles)} restart(s)" + (f" ({s.note})" if s.note else ""))
    out.print(entry["line"])
    out.print("\n".join(entry["table"]))
    out.print(f"report: {md}\nreport: {page}" + (f"\nplot: {png}" if png else ""))
    return code
