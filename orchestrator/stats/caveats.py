"""When an effect interval is not evidence, and the sentence that says why.

Two ways an honest-looking interval on a secondary metric is noise:

* **too few restarts**: with one restart on a side, that side's restart-to-restart spread is
  not measured at all; the pooled interval then rests on the other side's spread being the
  same. For the experiment's own metric that assumption is stated and kept (a reference is
  often one number from an earlier session); for the others it is not evidence;
* **client-side timings that follow the host**: throughput, TTFT and TPOT are measured by a
  client on the node's CPUs. When they move *against* the server's own phase times (verify
  got slower, yet tokens/s went up), or the host's load differed between the two sides, they
  measured the host, not the server.

Each effect keeps its numbers; `caveat` says what is wrong with it and `evidence` whether a
finding may rest on it.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence

from orchestrator.metrics import METRICS

SERVER_PHASES = ("verify_ms", "draft_ms", "decode_ms")
LOAD_RATIO = 1.5  # host load averages this far apart (and busy) make client timings suspect


def _excludes_zero(effect: Mapping) -> bool:
    lo, hi = effect.get("ci", (0.0, 0.0))
    return lo > 0 or hi < 0


def _worse_sign(metric: str, pct: float) -> float:
    """+ when the change is a slowdown for this metric, - when it is a speed-up."""
    info = METRICS.get(metric)
    return -pct if info is not None and info.higher_is_better else pct


def mean_load(fingerprints: Sequence[Mapping | None]) -> float | None:
    loads = [fp["host"]["loadavg"][0] for fp in fingerprints
             if fp and isinstance((fp.get("host") or {}).get("loadavg"), list | tuple)]
    return statistics.fmean(loads) if loads else None


def qualify(effects: Mapping[str, Mapping], *, headline: str,
            loads: tuple[float | None, float | None] = (None, None),
            cpus: int | None = None) -> dict[str, dict]:
    """`effects` with `evidence` (bool) and, where it applies, `caveat` added to each."""
    server = [(_worse_sign(m, float(effects[m]["pct"])), m) for m in SERVER_PHASES
              if m in effects and _excludes_zero(effects[m])]
    slower = [m for sign, m in server if sign > 0]
    faster = [m for sign, m in server if sign < 0]
    before, after = loads
    busy = before is not None and after is not None and max(before, after) >= 0.5 * (cpus or 1) \
        and max(before, after) > LOAD_RATIO * max(min(before, after), 0.05)
    out = {}
    for metric, raw in effects.items():
        e = dict(raw)
        notes = []
        n = e.get("n") or []
        if n and min(n) < 2 and metric != headline:
            notes.append(f"{min(n)} restart on one side: its spread is not measured")
        elif n and min(n) < 2:
            e["assumption"] = (f"{min(n)} restart on one side: the interval assumes its"
                               " restart noise is the other side's")
        info = METRICS.get(metric)
        if info is not None and info.phase == "client" and metric != headline:
            sign = _worse_sign(metric, float(e["pct"]))
            if _excludes_zero(e) and ((sign < 0 and slower) or (sign > 0 and faster)):
                phases = ", ".join(slower if sign < 0 else faster)
                notes.append(f"client-side timing moves against the server's own phase times"
                             f" ({phases}): it follows the host's load")
            elif busy:
                notes.append(f"client-side timing on a host whose load average differed"
                             f" ({before:.1f} vs {after:.1f} on {cpus or '?'} CPUs)")
        e["evidence"] = not notes
        if notes:
            e["caveat"] = "; ".join(notes)
        out[metric] = e
    return out


def evidence_only(effects: Mapping[str, Mapping]) -> dict[str, dict]:
    """The `{"pct", "ci"}` of the effects a finding may rest on."""
    return {m: {"pct": e["pct"], "ci": e["ci"]} for m, e in effects.items()
            if e.get("evidence", True)}


def not_evidence(effects: Mapping[str, Mapping]) -> dict[str, str]:
    return {m: e["caveat"] for m, e in effects.items() if not e.get("evidence", True)}
