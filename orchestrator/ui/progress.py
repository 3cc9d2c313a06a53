"""Live progress of a long run: trials done and running per node, the current best hypothesis,
trial durations and an ETA computed from the durations measured so far.

On a terminal it is a rich `Live` panel that redraws in place, with the controller's event lines
scrolling above it; anywhere else (a pipe, a CI log, a file) it prints plain lines, one per
event and one progress line per verdict, so a log stays readable and greppable.

Commands feed it through three calls and never format progress themselves:

    labels = [c.sha[:10] for c in commits]
    with Progress(console, total_hint=expected_bisect_trials(len(commits))) as progress:
        with Controller(parts.control(cfg), store, run_dir, on_event=progress.on_event) as ctl:
            drive(..., on_verdict=lambda v, n: progress.on_verdict(v.status,
                                                                   *verdict_best(v, labels)))

`on_event` understands the controller's "trial N started on NODE: ..." and "trial N on NODE
<outcome> in S s" lines; `on_trial(row)` does the same from a stored row, for loops that do not
go through the controller's events. Both may be used together: trials are keyed by id.
"""

from __future__ import annotations

import math
import re
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from orchestrator.store import TrialRow
from orchestrator.strategies.base import Verdict, probability_relation

_STARTED = re.compile(r"^trial (\d+) started on (\S+): (.*?)(?: \(([^()]*)\))?$")
_FINISHED = re.compile(r"^trial (\d+) on (\S+) (\S+) in ([0-9.]+)s")


def expected_bisect_trials(n_commits: int) -> int:
    """A rough trial count for an ETA: reproduce both endpoints (about 2 each), one search trial
    per halving plus a few for noise, and about 2 per side to verify the culprit."""
    return 4 + math.ceil(math.log2(max(n_commits, 2))) + 2 + 4


def verdict_best(verdict: Verdict, labels: Sequence[str]) -> tuple[str | None, float | None]:
    """A strategy verdict's best hypothesis as `(label, probability)` for :meth:`on_verdict`:
    its top culprit, else the posterior's mode, else nothing yet (still reproducing)."""
    top = verdict.top
    if top is not None:
        return labels[top.point], float(top.probability)
    if verdict.posterior and max(verdict.posterior) > 0:
        best = max(range(len(verdict.posterior)), key=verdict.posterior.__getitem__)
        return labels[best], float(verdict.posterior[best])
    return None, None


def format_duration(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    minutes, secs = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


@dataclass(frozen=True)
class Running:
    trial_id: int
    node: str
    label: str
    phase: str
    since: float


@dataclass(frozen=True)
class Snapshot:
    """Progress at one moment; what both the live panel and the plain line show."""

    done: int
    ok: int
    failed: int
    running: tuple[Running, ...]
    nodes: tuple[str, ...]
    done_per_node: dict[str, int]
    mean_duration: float | None
    last_duration: float | None
    total_hint: int | None
    eta_s: float | None
    status: str
    best_label: str | None
    probability: float | None


class Progress:
    """Collects trial events and shows them (rich Live on a terminal, plain lines otherwise)."""

    def __init__(self, console: Console, total_hint: int | None = None, *,
                 live: bool | None = None, clock: Callable[[], float] = time.monotonic,
                 done: Iterable[TrialRow] = ()) -> None:
        """`done`: the run's stored trials, so a resumed run counts on from what it had
        finished (and its node names are the store's) instead of starting again at 0."""
        self.console = console
        self.total_hint = total_hint
        self.live_mode = console.is_terminal if live is None else live
        self._clock = clock
        self._running: dict[int, Running] = {}
        self._finished: dict[int, tuple[str, str, float | None]] = {}  # id -> node, outcome, s
        self._nodes: dict[str, None] = {}
        self._status, self._best, self._probability = "starting", None, None
        self._live: Live | None = None
        self._cost = ""
        self._ended = False  # the run is over: nothing is left to estimate
        for row in done:
            if row.outcome is not None:
                took = (row.ended_at - row.started_at) if row.started_at and row.ended_at \
                    else None
                self._finish(row.id, row.node, row.outcome.value, took)

    # -- lifecycle ---------------------------------------------------------------------------
    def __enter__(self) -> Progress:
        if self.live_mode:
            self._live = Live(self.render(), console=self.console, refresh_per_second=4,
                              transient=False, get_renderable=self.render)
            self._live.start()
        return self

    def __exit__(self, *exc) -> None:
        # The live view's last frame stays on the screen: it must not promise "ETA ~5s" for
        # a run that has ended.
        self._ended = True
        if self._live is not None:
            self._live.update(self.render(), refresh=True)
            self._live.stop()
            self._live = None

    def set_total(self, total_hint: int | None) -> None:
        self.total_hint = total_hint

    def set_cost(self, text: str) -> None:
        """What the trials so far cost (``12.3 GPU-min spent, 3 repetitions per restart``)."""
        self._cost = text

    def set_remaining(self, remaining: int) -> None:
        """A strategy's forecast of the trials still needed, running ones included."""
        self.total_hint = len(self._finished) + max(remaining, 0)

    # -- inputs ------------------------------------------------------------------------------
    def on_event(self, message: str) -> None:
        """A controller event line: recorded when it is a trial start or end, always shown."""
        started = _STARTED.match(message)
        finished = _FINISHED.match(message)
        if started:
            tid, node = int(started[1]), started[2]
            self._nodes.setdefault(node)
            self._running[tid] = Running(tid, node, started[3], started[4] or "", self._clock())
        elif finished:
            self._finish(int(finished[1]), finished[2], finished[3], float(finished[4]))
        self._print(message)
        if finished and not self.live_mode:
            self._print(self.line())

    def note(self, text: str) -> None:
        """A line from the command itself (printed above the live view when there is one)."""
        self._print(text)

    def on_trial(self, row: TrialRow) -> None:
        """A finished trial from the store (same effect as its 'finished' event)."""
        if row.outcome is None:
            return
        took = (row.ended_at - row.started_at) if row.started_at and row.ended_at else None
        known = row.id in self._finished
        self._finish(row.id, row.node, row.outcome.value, took)
        if not known and not self.live_mode:
            self._print(f"trial {row.id} on {row.node} {row.outcome.value}"
                        + (f" in {took:.1f}s" if took is not None else ""))
            self._print(self.line())

    def on_verdict(self, status: str, best_label: str | None, probability: float | None) -> None:
        # Off a terminal a line is worth printing when the phase or the leading candidate
        # changes; a new probability shows on the next trial's line (one line per verdict
        # doubled every trial's line).
        changed = (status, best_label) != (self._status, self._best)
        self._status, self._best, self._probability = status, best_label, probability
        if changed and not self.live_mode:
            self._print(self.line())
        elif self._live is not None:
            self._live.refresh()

    def _finish(self, tid: int, node: str, outcome: str, took: float | None) -> None:
        if node:
            self._nodes.setdefault(node)
        self._running.pop(tid, None)
        self._finished[tid] = (node, outcome, took)

    def _print(self, text: str) -> None:
        self.console.print(Text(text))

    # -- outputs -----------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        durations = [d for _, _, d in self._finished.values() if d is not None]
        mean = statistics.fmean(durations) if durations else None
        last = next((d for _, _, d in reversed(self._finished.values()) if d is not None), None)
        done = len(self._finished)
        ok = sum(1 for _, outcome, _ in self._finished.values() if outcome == "ok")
        per_node = {n: 0 for n in self._nodes}
        for node, _, _ in self._finished.values():
            per_node[node] = per_node.get(node, 0) + 1
        # An estimate the run has outgrown says nothing about what is left: drop it (and the
        # ETA built on it) rather than print "120/~95".
        hint = self.total_hint if self.total_hint is not None and done < self.total_hint else None
        return Snapshot(
            done=done, ok=ok, failed=done - ok, running=tuple(self._running.values()),
            nodes=tuple(self._nodes), done_per_node=per_node, mean_duration=mean,
            last_duration=last, total_hint=hint, eta_s=self._eta(mean, done, hint),
            status=self._status, best_label=self._best, probability=self._probability,
        )

    def _eta(self, mean: float | None, done: int, total: int | None) -> float | None:
        """Remaining work / nodes: unstarted trials cost a mean trial, running ones what is left
        of it (at least nothing); None until a duration was measured or without a total."""
        if mean is None or total is None or self._ended:
            return None
        now = self._clock()
        not_started = max(total - done - len(self._running), 0)
        left = sum(max(mean - (now - r.since), 0.0) for r in self._running.values())
        return (not_started * mean + left) / max(len(self._nodes), 1)

    def line(self) -> str:
        s = self.snapshot()
        total = f"/~{s.total_hint}" if s.total_hint else ""
        parts = [f"progress: {s.done}{total} trials done ({s.ok} ok, {s.failed} failed)"]
        if s.running:
            parts.append("running " + ", ".join(f"{r.node} #{r.trial_id}" for r in s.running))
        if s.mean_duration is not None:
            parts.append(f"trial {s.mean_duration:.1f}s avg")
        if s.best_label:
            prob = "" if s.probability is None else f" p{probability_relation(s.probability, '')}"
            parts.append(f"best {s.best_label}{prob}")
        parts.append(f"[{s.status}]")
        if self._cost:
            parts.append(self._cost)
        if s.eta_s is not None:
            parts.append(f"ETA ~{format_duration(s.eta_s)}")
        return " · ".join(parts)

    def render(self) -> Group:
        s = self.snapshot()
        now = self._clock()
        table = Table(title=Text("trials per node"), title_justify="left")
        for col in ("node", "done", "running", "for", "candidate"):
            table.add_column(col)
        running = {r.node: r for r in s.running}
        for node in s.nodes:
            r = running.get(node)
            table.add_row(Text(node), Text(str(s.done_per_node.get(node, 0))),
                          Text(f"#{r.trial_id} {r.phase}" if r else "idle"),
                          Text(format_duration(now - r.since) if r else ""),
                          Text(r.label if r else ""))
        best = "none yet" if not s.best_label else (
            s.best_label + ("" if s.probability is None else
                            f"  P {probability_relation(s.probability)}"))
        total = f" of ~{s.total_hint}" if s.total_hint else ""
        summary = Text(
            f"{s.done}{total} trials done ({s.failed} failed) · status {s.status} · best: {best}\n"
            f"trial duration: last {format_duration(s.last_duration)},"
            f" mean {format_duration(s.mean_duration)} · "
            + ("ended" if self._ended else f"ETA ~{format_duration(s.eta_s)}")
            + (f"\ncost: {self._cost}" if self._cost else ""))
        return Group(table, summary)
