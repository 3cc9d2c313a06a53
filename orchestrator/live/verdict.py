"""Server state: is the running server slower than a fresh start of the same command?

The running server is one lifetime (one "restart" sleuth did not make); the fresh starts are
restarts of its exact command on the same node. On the log scale, the running server's level
against theirs has a t-interval whose variance is the restart noise the fresh starts show
(pooled: the running server is taken to scatter as they do, plus whatever its state adds).

- **state**: the running server differs from a fresh start beyond the run's min effect, at the
  99% level a change needs everywhere in sleuth; with fewer than four degrees of freedom (under
  five fresh starts) the 99% interval itself must clear the min effect, since a few starts can
  show too little spread by chance;
- **no state**: the 95% interval lies within +-the min effect: a fresh start measures as the
  running server does, so the slowdown is not state inside it. With a level then (a reference
  or `was=`), the change being chased is known, and as the bisect rules a range out once its
  change is confidently under half of the change it hunts, state is ruled out as the cause
  once its 95% interval lies within +-half of that change: the running server is a single
  lifetime, and its own restart noise keeps a tighter bound out of reach (at 2% noise the
  interval stays wider than +-4% however many fresh starts are made);
- **undecided** otherwise, with its interval.

A stated level (`was=19`) is taken as the level then, exactly, as `bisect was=` takes it: the
total is the running server against it, and what state leaves (a fresh start against it) has
the fresh starts' own interval, which more fresh starts narrow. Pure functions: the command
measures, this decides and words it.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from orchestrator.answer.combine import LogChange, min_effect
from orchestrator.answer.compose import assemble, carried, left_text
from orchestrator.answer.headline import refresh
from orchestrator.answer.phases import log_change
from orchestrator.answer.text import change_text, interval_text, pct_text

STATE_CONFIDENCE = 0.99  # as a compare's "not reproduced"
MIN_DF = 4
STATE, NO_STATE, UNDECIDED, UNTESTED = "state", "no_state", "undecided", "untested"


@dataclass(frozen=True)
class StateVerdict:
    status: str  # state | no_state | undecided | untested
    change: LogChange | None  # the running server against a fresh start (log scale)
    live: float | None
    fresh: tuple[float, ...]

    @property
    def fresh_level(self) -> float | None:
        return math.exp(statistics.fmean(math.log(v) for v in self.fresh)) if self.fresh else None


def decide(live: float | None, fresh: Sequence[float], min_effect_pct: float,
           chase: float | None = None) -> StateVerdict:
    """The verdict on server state from the running server's level and the fresh starts';
    `chase` is the change being explained (the running server against the level then, log
    scale), when one is known."""
    fresh = tuple(v for v in fresh if v > 0 and math.isfinite(v))
    if live is None or live <= 0:
        return StateVerdict(UNDECIDED, None, live, fresh)
    if not fresh:
        return StateVerdict(UNTESTED, None, live, fresh)
    change = log_change(fresh, [live]) if len(fresh) >= 2 else None
    if change is None or change.df < 1:
        return StateVerdict(UNDECIDED, change, live, fresh)
    bound = math.log1p(min_effect_pct / 100.0)
    lo99, hi99 = change.log_interval(STATE_CONFIDENCE)
    lo95, hi95 = change.log_interval(0.95)
    shown = (lo99 > 0 or hi99 < 0) and abs(change.diff) >= bound
    if shown and (change.df >= MIN_DF or min(abs(lo99), abs(hi99)) >= bound):
        return StateVerdict(STATE, change, live, fresh)
    if -bound < lo95 and hi95 < bound:
        return StateVerdict(NO_STATE, change, live, fresh)
    if chase is not None and abs(chase) >= bound and not shown:
        half = abs(chase) / 2.0
        if -half < lo95 and hi95 < half:
            return StateVerdict(NO_STATE, change, live, fresh)
    return StateVerdict(UNDECIDED, change, live, fresh)


def _ms(value: float | None, unit: str) -> str:
    if value is None:
        return "?"
    return f"{value:.4g}{' ' + unit if unit else ''}"


def state_cause(v: StateVerdict, metric: str) -> dict:
    """The verdict as an answer's cause (kind `state`)."""
    assert v.change is not None
    return {"kind": "state", "id": "server state", "label": "server state", "experiment": "live",
            "probability": None, **v.change.to_json(), "before": v.fresh_level, "after": v.live,
            "phase": None}


def sentence(v: StateVerdict, metric: str, unit: str, uptime: str, restarted: bool,
             observations: Sequence[str] = ()) -> str:
    """What the answer opens with: the running server, a fresh start, and what it means."""
    head = f"the running server (up {uptime}) measures {metric} {_ms(v.live, unit)}"
    if not restarted or v.status == UNTESTED:
        return (head + "; server state was not tested (live.restart=true stops it, starts the"
                " same command fresh and measures that, then relaunches the original)")
    n = len(v.fresh)
    fresh = (f"a fresh restart of the same command on the same node measures"
             f" {_ms(v.fresh_level, unit)} ({n} restart{'s' if n != 1 else ''})")
    effect = change_text(v.change.to_json(), metric) if v.change is not None else "?"
    seen = f"; what sleuth sees of the state: {'; '.join(observations)}" if observations else ""
    if v.status == STATE:
        way = "slowdown" if v.change is not None and v.change.diff > 0 else "difference"
        return (f"{head}; {fresh}: the {way} is state inside the long-running server"
                f" ({effect}){seen}")
    if v.status == NO_STATE:
        return f"{head}; {fresh}: server state is ruled out ({effect}){seen}"
    return f"{head}; {fresh}: undecided whether state inside the server matters ({effect}){seen}"


def rest_after_state(fresh: Sequence[float], was: float) -> LogChange | None:
    """A fresh start against the stated level (exact): what is left once state is gone."""
    logs = [math.log(v) for v in fresh if v > 0]
    if len(logs) < 2:
        return None
    mean = statistics.fmean(logs)
    sd = statistics.stdev(logs)
    return LogChange(mean - math.log(was), sd / math.sqrt(len(logs)), len(logs) - 1)


def rest_decision(rest: LogChange | None, min_effect_pct: float) -> str:
    """explained (within the min effect) | remainder (beyond it) | undecided."""
    if rest is None:
        return UNDECIDED
    bound = math.log1p(min_effect_pct / 100.0)
    lo, hi = rest.log_interval()
    if -bound < lo and hi < bound:
        return "explained"
    if lo > bound or hi < -bound:
        return "remainder"
    return UNDECIDED


def settled(v: StateVerdict, was: float | None, min_effect_pct: float) -> bool:
    """Whether more fresh starts would change nothing the answer decides: the state verdict,
    and with a stated level and state shown, whether state explains all of the change."""
    if v.status == UNDECIDED:
        return False
    if was is None or v.status != STATE:
        return True
    return rest_decision(rest_after_state(v.fresh, was), min_effect_pct) != UNDECIDED


def answer(v: StateVerdict, metric: str, unit: str, *, uptime: str, restarted: bool,
           was: float | None, min_effect_pct: float | None,
           observations: Sequence[str] = (), was_label: str = "") -> dict:
    """The answer of a live investigation without a reference configuration: the total is the
    running server against the stated level (`was=`; `was_label` names another source of the
    level then, a reference's), else against a fresh start; server state is its one testable
    cause, and with a level then a fresh start against it is what it leaves."""
    then = was_label or (f"was={was:g}" if was is not None else "")
    shown = v.status == STATE and v.change is not None
    causes = [state_cause(v, metric)] if shown else []
    bound_pct = min_effect_pct
    if was is not None and v.live is not None:
        ss, df = _pooled(v.fresh)
        whole = (LogChange(math.log(v.live / was), math.sqrt(ss / df), df) if df else
                 LogChange(math.log(v.live / was), math.inf, 0.0))
        lead = f"from {_ms(was, unit)} ({then}) to the running server now"
    else:
        whole = v.change
        lead = "from a fresh restart of the same command to the running server"
    if bound_pct is None:
        bound_pct = 100.0 * math.expm1(min_effect(whole))
    status = None if restarted and v.status != UNTESTED else "untested"
    if v.status == UNDECIDED and restarted:
        status = "undecided"
    doc = assemble(metric, whole, causes, lead=lead, min_effect_pct=bound_pct, status=status)
    doc["breakdown"] = doc["sentence"]
    doc["sentence"] = sentence(v, metric, unit, uptime, restarted, observations)
    if was is not None and whole is not None and restarted:
        rest = rest_after_state(v.fresh, was)
        decision = rest_decision(rest, bound_pct)
        if rest is not None:  # the fresh starts against the stated level, directly
            doc["unexplained"] = {**rest.to_json(), "decision": decision,
                                  "share": None}
        said = (f"a fresh restart against {then}:"
                f" {pct_text(rest.pct) if rest else '?'}"
                f" {interval_text(rest.to_json()['ci'], rest.pct) if rest else ''}".rstrip())
        # Undecided against the min effect, state may still demonstrably carry the change:
        # the rest's interval cannot hold half of it (the rule every answer shares,
        # `answer.compose.carried`); then how much may be left is said with the interval.
        up_to = (carried(whole, rest) if shown and rest is not None and decision == UNDECIDED
                 else None)
        if up_to is not None:
            left = left_text(up_to, whole, rest, math.log1p(bound_pct / 100.0))
            doc["unexplained"].update(up_to=up_to, left=left)
            decision = "carried"
        if shown:
            doc["explains"] = decision in ("explained", "carried")
            doc["status"] = {"explained": "explained", "carried": "explained",
                             "remainder": "partly_explained"}.get(decision, "undecided")
            if decision == "explained":
                doc["sentence"] += f"; {said}: state explains the change"
            elif decision == "carried":
                doc["sentence"] += f"; {said}: state carries the change, {left}"
            elif decision == "remainder":
                doc["sentence"] += (f"; {said}: more than state, and without a reference"
                                    " configuration nothing else can be tested"
                                    " (reference=RUN or reference=log:PATH)")
            else:
                doc["sentence"] += (f"; {said}: undecided whether state explains all of it"
                                    f" (within {bound_pct:.1f}%)")
        elif v.status == NO_STATE:
            doc["sentence"] += (f"; the change from {then},"
                                f" {change_text(doc['total'], metric)}, is elsewhere: give"
                                " reference=RUN or reference=log:PATH to test the system and"
                                " the code")
    elif v.status in (STATE, NO_STATE) and restarted:
        doc["explains"] = True  # the question (is it state?) is answered, either way
        doc["status"] = "explained" if v.status == STATE else "no_change"
    doc["server_state"] = {"status": v.status, "live": v.live, "fresh": list(v.fresh),
                           **({"change": v.change.to_json()} if v.change else {}),
                           "observations": list(observations)}
    # The first line and the labelled lines again: `assemble` wrote them from its own rest
    # (the total less state, both read against one running server: far wider), and the
    # answer's rest is now the fresh starts against the stated level.
    return refresh(doc)


def _pooled(fresh: Sequence[float]) -> tuple[float, int]:
    """The fresh starts' sum of squares on the log scale and its degrees of freedom: the
    restart noise a stated level and the running server are both taken to have."""
    logs = [math.log(v) for v in fresh if v > 0]
    if len(logs) < 2:
        return 0.0, 0
    mean = statistics.fmean(logs)
    return math.fsum((x - mean) ** 2 for x in logs), len(logs) - 1


def clause(v: StateVerdict, metric: str, unit: str, uptime: str) -> str:
    """One clause for an investigation that went on from the live server to a reference."""
    if v.status == UNTESTED or v.change is None:
        return "server state was not tested (live.restart=true)"
    what = {STATE: "server state on top of it", NO_STATE: "server state ruled out",
            UNDECIDED: "server state undecided"}[v.status]
    return (f"{what}: the running server (up {uptime}) measures {_ms(v.live, unit)}, a fresh"
            f" restart of its command {_ms(v.fresh_level, unit)}"
            f" ({change_text(v.change.to_json(), metric)})")


def observations_of(live_fp: Mapping, fresh_fps: Sequence[Mapping], gc_live: int | None,
                    gc_fresh: Sequence[int], served: float | None) -> list[str]:
    """What sleuth sees of the state: memory, GPU memory, GC pauses, requests served."""
    out = []
    live = live_fp.get("live") or {}
    rss_live = live.get("rss_bytes_after") or live.get("rss_bytes")
    rss_fresh = [(fp.get("live") or {}).get("rss_bytes_after") for fp in fresh_fps]
    rss_fresh = [r for r in rss_fresh if r]
    if rss_live and rss_fresh:
        out.append(f"resident memory {rss_live / 2**20:.0f} MiB against"
                   f" {statistics.fmean(rss_fresh) / 2**20:.0f} MiB after the same bench fresh")
    gpu_live = _gpu_memory(live_fp, live.get("pid"))
    gpu_fresh = [m for fp in fresh_fps if (m := _gpu_memory(fp, None)) is not None]
    if gpu_live is not None and gpu_fresh:
        out.append(f"GPU memory {gpu_live:.0f} MiB against {statistics.fmean(gpu_fresh):.0f} MiB"
                   " fresh")
    elif gpu_live is None:
        out.append("GPU memory per process: not available (no NVML process list)")
    if gc_live is not None:
        fresh_gc = max(gc_fresh, default=0)
        out.append(f"{gc_live} long garbage-collection warning(s) in its log"
                   f" ({fresh_gc} in a fresh start's)")
    if served is not None:
        out.append(f"{served:.0f} requests served before sleuth measured it")
    return out


def _gpu_memory(fp: Mapping, pid: int | None) -> float | None:
    gpus = (fp.get("gpu") or {}).get("gpus") or []
    used = [p.get("used_memory_mib") for g in gpus for p in g.get("processes", [])
            if (pid is None or p.get("pid") == pid) and p.get("used_memory_mib") is not None]
    return float(sum(used)) if used else None
