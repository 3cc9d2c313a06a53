"""What a bisect says while it runs, apart from its progress line: what it will spend and
look for (before it spends anything), the change once it reproduces with the forecast, the
forecast moving beyond the budget (the bench cannot resolve the question: said with the numbers
and what would help), a verified step far smaller than the endpoints' change, and after a long
"not reproducible" how to make the next one short; and who says it (`Reporter`: the
terminal's lines, or the progress display's notes)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from orchestrator.answer.text import name_points
from orchestrator.config import params as experiment_params
from orchestrator.config.requests import BisectRequest
from orchestrator.strategies.base import Verdict
from orchestrator.ui import render
from orchestrator.ui.progress import expected_bisect_trials, verdict_best

if TYPE_CHECKING:
    from orchestrator.control.repetitions import RepetitionDesign
    from orchestrator.strategies.bisect import BisectStrategy
    from orchestrator.system.watch import SystemChange
    from orchestrator.ui.progress import Progress
    from orchestrator.workspace import CommitInfo


def reproduction_notice(verdict: Verdict, metric: str, budget: int | None,
                        design: RepetitionDesign | None = None) -> list[str]:
    """The lines to print once, when the endpoints' change has reproduced and the search starts.

    The size of the change against the restart noise decides what the whole run costs, so this
    is the moment to say it: a 50% change is localized in a dozen restarts, a 2% change in 5%
    noise can take hundreds, and a user with a budget should know before spending it.
    """
    change = f"{verdict.total_effect_pct:+.1f}%" if verdict.total_effect_pct is not None else "?"
    if verdict.total_effect_ci is not None:
        lo, hi = verdict.total_effect_ci
        change += f" [{lo:+.1f}%, {hi:+.1f}%]"
    line = f"the change reproduces: {metric} {change} between the endpoints " \
           f"after {verdict.n_trials} trials"
    left = verdict.expected_remaining
    if left is None:
        return [line]  # the noise is not measured yet
    cost = design.cost if design is not None else None
    minutes = (f", about {design.describe(cost.gpu_minutes(design.current, left))} at "
               f"{design.current} repetitions per restart" if cost is not None else "")
    lines = [line, f"forecast: about {left} more trials{minutes} to name the culprit "
                   "(a rough figure, often off by a factor of two)"]
    if budget is not None and verdict.n_trials + left > budget:
        lines.append(beyond_budget(verdict, budget))
    return lines


def beyond_budget(verdict: Verdict, budget: int) -> str:
    """The bench cannot resolve the question within the budget: said with the numbers (the
    restarts the forecast needs, the change against the restart noise) and what would help,
    as soon as the forecast shows it, not only when the run stops."""
    left = verdict.expected_remaining or 0
    noise = verdict.noise_pct
    size = ""
    if noise and verdict.total_effect_pct is not None:
        size = (f" (a {verdict.total_effect_pct:+.1f}% change in {noise:.1f}% restart noise,"
                f" {abs(verdict.total_effect_pct) / noise:.1f} noise widths)")
    return (f"at this noise the search needs about {left} more restarts{size}, beyond the"
            f" budget of {budget}: it will likely stop with its best guess and that guess's"
            " probability. More repetitions per restart (bench.repetitions=N) narrow the"
            " noise when the repetitions are what scatters, a quieter node narrows it when the"
            " restarts are, and max_trials=N raises the budget")


def running_notes(v: Verdict, metric: str, budget: int, said: set[str]) -> list[str]:
    """What a running bisect says once, when it shows: the forecast moving beyond the budget
    (after the reproduction notice, which says it for the first forecast), and a step being
    verified that reads far less than the endpoints' change (the rest lies elsewhere)."""
    out = []
    left = v.expected_remaining
    if (left is not None and "reproduced" in said and "beyond" not in said
            and v.status in ("searching", "verifying") and v.n_trials + left > budget):
        said.add("beyond")
        out.append(beyond_budget(v, budget))
    step, total = v.verifying, v.total_effect_pct
    if step and total and abs(step["pct"]) < 0.5 * abs(total):
        key = f"verifying {step['point']}"
        if key not in said:
            said.add(key)
            ci = step.get("ci")
            interval = f" [{ci[0]:+.1f}%, {ci[1]:+.1f}%]" if ci else ""
            out.append(f"the step being verified at point {step['point']} reads {metric}"
                       f" {step['pct']:+.1f}%{interval} while the endpoints differ by"
                       f" {total:+.1f}%: the rest of the change lies elsewhere (searched once"
                       " this step is named)")
    return out


def min_effect_hint(verdict: Verdict, params: experiment_params.ExperimentParams) -> str | None:
    """After a long "not reproducible", how to make the next such run short.

    Ruling out every change above the +-1% floor can take the whole reproduce budget (48
    restarts a side); ruling out the regression the user is actually chasing takes a few (in
    5% noise, about 5 restarts for 20%, 12 for 10%, measured on the benchmark's no-change
    cases)."""
    if (verdict.status != "not_reproducible" or params.min_effect_pct is not None
            or verdict.n_trials < 20):
        return None
    return (f"hint: ruling out any change took {verdict.n_trials} restarts. If the regression "
            "you are chasing is larger than some P%, experiment.params.min_effect_pct=P ends "
            "a range without such a change after a few.")


def opening_lines(req: BisectRequest, strategy: BisectStrategy,
                  reference: tuple[float, str] | None) -> list[str]:
    """What the run will spend and what it is looking for, said before it spends anything."""
    budget = strategy.budget
    if req.max_trials is None:
        spend = f"budget: {budget} restarts (the default; max_trials=N sets another)"
    else:
        spend = f"budget: {budget} restarts (max_trials)"
    metric = req.metric
    if strategy.min_effect_pct is not None:
        chase = (f"looking for a change of {metric} of at least {strategy.min_effect_pct:g}% "
                 "(experiment.params.min_effect_pct); smaller ones do not count")
    elif reference is not None and reference[1] == "was":
        chase = (f"looking for the change since {reference[2]}: a range whose change is"
                 " confidently under half of it does not hold the regression")
    elif reference is not None:
        since = reference[2] if len(reference) > 2 else f"reference run {reference[1]}"
        chase = (f"looking for the change since {since} ({metric} {reference[0]:.4g} there): a"
                 " range whose change is confidently under half of it does not hold the"
                 " regression")
    else:
        chase = (f"looking for any change of {metric} above {strategy.settings.negligible_pct:g}%"
                 ": its size is measured first (state it with experiment.params.min_effect_pct=P"
                 ", was=VALUE or reference=RUN to rule a range out sooner)")
    return [spend, chase]


class Reporter:
    """What a running bisect says, once each: the reproduction notice, the running notes, a
    withdrawn reproduction or an early stop, a change of the node's system; and its latest
    verdict (the answer so far when it is interrupted). `say` is where a line goes: the
    terminal (`Terminal`) or the progress display's notes (`Display`)."""

    def __init__(self, metric: str, budget: int, design: RepetitionDesign,
                 commits: list[CommitInfo], release: bool):
        self.metric, self.budget, self.design = metric, budget, design
        self.shas = [c.sha for c in commits]
        self.subjects = None if release else [c.subject for c in commits]
        self.commits = commits
        self.said: set[str] = set()
        self.latest: Verdict | None = None

    def say(self, text: str) -> None:
        raise NotImplementedError

    def system_changed(self, change: SystemChange) -> None:
        self.say(change.warning)

    def on_verdict(self, v: Verdict, n: int) -> None:
        self.latest = v
        self.announce(v)

    def finish(self) -> None:
        """The bisect's part is over (its cost is not the next step's)."""

    def announce(self, v: Verdict) -> None:
        if "reproduced" not in self.said and v.status in ("searching", "verifying"):
            self.said.add("reproduced")
            lines = reproduction_notice(v, self.metric, self.budget, self.design)
            if len(lines) > 2:
                self.said.add("beyond")
            for line in lines:
                self.say(line)
        for line in running_notes(v, self.metric, self.budget, self.said):
            self.say(name_points(line, self.shas, self.subjects))
        for note in v.notes:  # a withdrawn reproduction, an early stop: said when it happens
            if note.startswith(("retracted", "stopped early")) and note not in self.said:
                self.said.add(note)
                self.say(name_points(note, self.shas, self.subjects))


class Terminal(Reporter):
    """Plain lines: each verdict as a progress line with the cost so far."""

    def __init__(self, out, *args):
        super().__init__(*args)
        self.out = out

    def say(self, text: str) -> None:
        self.out.print(text)

    def on_verdict(self, v: Verdict, n: int) -> None:
        super().on_verdict(v, n)
        self.out.print(f"  {progress_line(v, self.commits, n, ', ' + self.design.spent_line())}")


class Display(Reporter):
    """The progress display: its bar, ETA and cost, the notes above it."""

    def __init__(self, progress: Progress, done: int, *args):
        super().__init__(*args)
        self.progress = progress
        self.labels = [c.sha[:10] for c in self.commits]
        progress.set_total(expected_bisect_trials(len(self.commits)) + done)

    def say(self, text: str) -> None:
        self.progress.note(text)

    def on_verdict(self, v: Verdict, n: int) -> None:
        if v.expected_remaining is not None:  # measured change and noise: a better ETA
            self.progress.set_remaining(v.expected_remaining)
        elif v.status in ("searching", "verifying"):
            self.progress.set_total(None)  # no forecast: no ETA rather than the first guess
        super().on_verdict(v, n)
        self.progress.set_cost(self.design.spent_line())
        self.progress.on_verdict(v.status, *verdict_best(v, self.labels))

    def finish(self) -> None:
        self.progress.set_cost("")


def progress_line(verdict: Verdict, commits: list[CommitInfo], n_obs: int,
                  cost: str = "") -> str:
    top = verdict.top
    if top:
        best = f"best {commits[top.point].sha[:10]} p={render.probability(top.probability)}"
    elif verdict.posterior:
        i = max(range(len(verdict.posterior)), key=verdict.posterior.__getitem__)
        best = f"best {commits[i].sha[:10]} p={render.probability(verdict.posterior[i])}"
    else:
        best = "endpoints first"
    return f"[{verdict.status}] {n_obs} trials{cost}; {best}"
