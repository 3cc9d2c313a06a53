"""An investigation's plan in the user's unit, and its budget.

On a large model a restart is minutes of the node doing nothing else, so the question a user
asks before starting is "how long, and how many GPU-hours". Before its first restart an
investigation states, per step, the restarts it expects and what they cost, from:

- the node's measured cost of a restart and of a repetition (the reference run and other
  earlier runs of the same server and benchmark in `runs_dir`: :mod:`orchestrator.run.noise_prior`;
  on the simulated node, modeled time), and the GPUs one server holds;
- the noise prior (the restart-to-restart sd the same runs measured) for the bisect: the
  forecast of :mod:`orchestrator.strategies.bisect.forecast` at the change it can resolve
  cheaply (four restart sds, at least the min effect), over log2 of the range;
- what the compare and the isolate cost on the stories measured in docs/cost.md (the
  compare decides in its first batch of 3 when the system changed by more than the min
  effect; the isolate grows with the number of differences it tests, known after the compare).

The run keeps the estimate current: after each step it states what is left. `budget=`
bounds the whole run in restarts (`budget=40`) or in node time (`budget=6h`, `90m`); the
check comes before each restart, with the restart's expected cost, and a run that reaches the
budget ends with its answer so far, marked provisional, and what finishing would still cost
(:class:`BudgetSpent`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from orchestrator.errors import RunInterrupted, UserError
from orchestrator.run.cost import describe_cost, model_of, trial_cost
from orchestrator.stats.repetition_plan import CostModel
from orchestrator.store import TrialRow

_TIME = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(h|hr|hrs|hours?|m|min|mins|minutes?|d|days?)\s*$")
_COUNT = re.compile(r"^\s*(\d+)\s*(?:restarts?)?\s*$")
STEPS = ("compare", "isolate", "bisect", "final")
# Restarts of the isolate per tested difference count, measured on the system stories
# (docs/cost.md: a restart per side, and with the clock differences within one lifetime).
ISOLATE_BASE, ISOLATE_PER_BIT = 4, 5


@dataclass(frozen=True)
class Budget:
    """`budget=`: restarts (a count) or node time (seconds), or neither."""

    restarts: int | None = None
    seconds: float | None = None
    text: str = ""

    @property
    def set(self) -> bool:
        return self.restarts is not None or self.seconds is not None

    def describe(self, gpus: int = 1) -> str:
        if self.restarts is not None:
            return f"{self.restarts} restarts"
        if self.seconds is not None:
            hours = self.seconds / 3600.0
            return (f"{_hours(hours)} of node time"
                    + (f" ({hours * gpus:.1f} GPU-h on {gpus} GPUs)" if gpus > 1 else ""))
        return "none"


def parse_budget(text: object) -> Budget:
    """`6h`, `90m`, `1.5h`, `2d` (node time) or `40` (restarts); one line and exit 2 else."""
    if text is None or str(text).strip() in ("", "None", "none"):
        return Budget()
    raw = str(text)
    m = _TIME.match(raw.lower())
    if m:
        value, unit = float(m.group(1)), m.group(2)
        scale = 3600.0 if unit.startswith("h") else 86400.0 if unit.startswith("d") else 60.0
        if value <= 0:
            raise UserError(f"budget={raw}: give a positive time (budget=6h) or restarts")
        return Budget(seconds=value * scale, text=raw)
    m = _COUNT.match(raw.lower())
    if m and int(m.group(1)) >= 4:
        return Budget(restarts=int(m.group(1)), text=raw)
    raise UserError(f"budget={raw}: give node time (budget=6h, budget=90m) or restarts"
                    " (budget=40, at least 4)")


def _hours(h: float) -> str:
    return f"{h:.1f} h" if h >= 1 else f"{h * 60:.0f} min"


def restarts_of(rows: Sequence[TrialRow]) -> list[TrialRow]:
    """The rows that are restarts: a lifetime's block rows are not (its lifetime row is)."""
    from orchestrator.run.blocks import lifetime_of

    return [r for r in rows if not (r.result is not None
                                    and lifetime_of(r.result.fingerprint) is not None)]


def node_seconds(rows: Sequence[TrialRow], target: Mapping) -> float:
    """Node time these trials held (modeled on the simulated node)."""
    return math.fsum(c.total for r in rows if r.result is not None
                     for c in [trial_cost(r.result, target)] if c is not None)


@dataclass
class Plan:
    """Expected restarts per step and the cost of one restart; kept current as steps end."""

    cost: CostModel | None
    repetitions: int
    expected: dict[str, int] = field(default_factory=dict)
    why: dict[str, str] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)

    def restart_seconds(self, live_levels: int = 1) -> float | None:
        if self.cost is None:
            return None
        return self.cost.restart_s + self.repetitions * live_levels * self.cost.repetition_s

    @property
    def gpus(self) -> int:
        return self.cost.gpus if self.cost is not None else 1

    def lines(self, modeled: bool, *, spent: Mapping[str, int] | None = None,
              title: str = "plan") -> list[str]:
        """One line per step still to come, and the total."""
        spent = spent or {}
        each = self.restart_seconds()
        parts, total = [], 0
        for step in STEPS:
            if step not in self.expected or step in self.done:
                continue
            left = max(self.expected[step] - spent.get(step, 0), 0)
            total += left
            cost = ("" if each is None else
                    ", " + describe_cost(left * each * self.gpus / 60.0, modeled))
            parts.append(f"{step} ~{left}{cost}" + (f" ({self.why[step]})" if step in self.why
                                                   else ""))
        if not parts:
            return []
        head = f"{title}: about {total} restarts"
        if each is not None:
            head += (f", {_hours(total * each / 3600.0)} of node time,"
                     f" {describe_cost(total * each * self.gpus / 60.0, modeled)}"
                     f" (a restart {each / 60.0:.1f} min of the node with its"
                     f" {self.repetitions} repetitions, {self.gpus} GPU(s))")
        else:
            head += " (no restart of this server measured on this node yet: costs follow the first)"
        return [head, *(f"  {p}" for p in parts)]

    def remaining(self, spent: Mapping[str, int]) -> int:
        return sum(max(n - spent.get(s, 0), 1 if s not in self.done and n else 0)
                   for s, n in self.expected.items() if s not in self.done)


def initial(*, prior_costs: Sequence, repetitions: int, has_reference: bool,
            range_commits: int, sigma: float | None, min_effect_pct: float,
            final_trials: int, batch: int = 3) -> Plan:
    """The plan before the first restart (see the module docstring for where each number
    comes from)."""
    from orchestrator.strategies.bisect.forecast import remaining_trials

    plan = Plan(model_of(list(prior_costs)), repetitions)
    if has_reference:
        plan.expected["compare"] = batch
        plan.why["compare"] = "the reference re-measured now, one batch"
        plan.expected["isolate"] = ISOLATE_BASE + ISOLATE_PER_BIT * 2
        plan.why["isolate"] = ("if the system changed; ~3 differences assumed, known after"
                               " the compare")
    if range_commits > 0:
        s = sigma if sigma and math.isfinite(sigma) and sigma > 0 else 0.03
        change = max(math.log1p(min_effect_pct / 100.0), 4.0 * s)
        search = remaining_trials(math.log2(range_commits + 1), math.log2(range_commits + 1),
                                  change / s, 0) or 0
        plan.expected["bisect"] = 2 + search
        plan.why["bisect"] = (f"{range_commits} commits; restart sd "
                              + (f"{100 * sigma:.1f}%" if sigma else "unknown, 3% assumed"))
    if final_trials:
        plan.expected["final"] = min(final_trials, 4) if has_reference else min(final_trials, 4)
        plan.why["final"] = f"until the answer decides, at most {final_trials}"
    return plan


def isolate_expected(n_differences: int, n_live: int) -> int:
    """Restarts an isolate of these differences is expected to take: the chain's bits, and
    the clock differences compared within lifetimes costing none of their own."""
    restart_level = max(n_differences - n_live, 0)
    if restart_level == 0:
        return 3
    return ISOLATE_BASE + ISOLATE_PER_BIT * math.ceil(math.log2(restart_level + 1)) + 2 * n_live


class BudgetSpent(RunInterrupted):
    """The run reached its `budget=`: it ends with its answer so far (provisional) and what
    finishing would still cost."""

    def __init__(self, why: str):
        super().__init__(why)
        self.why = why


@dataclass
class BudgetCheck:
    """Called before every restart: raises :class:`BudgetSpent` when the next restart (at its
    expected cost) would pass the budget."""

    budget: Budget
    plan: Plan
    target: Mapping
    spent_s: float = 0.0
    spent_restarts: int = 0
    said: str = ""

    def update(self, rows: Sequence[TrialRow]) -> None:
        restarts = restarts_of(rows)
        self.spent_restarts = len(restarts)
        self.spent_s = node_seconds(restarts, self.target)

    def __call__(self, rows: Sequence[TrialRow], live_levels: int = 1) -> None:
        self.update(rows)
        b = self.budget
        if b.restarts is not None and self.spent_restarts + 1 > b.restarts:
            self._stop(f"the budget of {b.restarts} restarts was spent")
        if b.seconds is not None:
            # The next restart's cost: measured on this run once it has some, else the plan's.
            done = [c for r in restarts_of(rows) if r.result is not None
                    and r.outcome is not None and r.outcome.measured
                    for c in [trial_cost(r.result, self.target)] if c is not None]
            model = model_of(done) or self.plan.cost
            if model is not None:
                self.plan.cost = model
            nxt = self.plan.restart_seconds(live_levels) or 0.0
            if self.spent_s + nxt > b.seconds:
                self._stop(f"the budget of {_hours(b.seconds / 3600.0)} of node time was"
                           f" spent ({_hours(self.spent_s / 3600.0)} after"
                           f" {self.spent_restarts} restarts; the next would pass it)")

    def _stop(self, why: str) -> None:
        self.said = why
        raise BudgetSpent(why)

    def to_finish(self, spent: Mapping[str, int], modeled: bool) -> dict:
        """What finishing would still cost: restarts, node time and GPU time, per the plan."""
        left = self.plan.remaining(spent)
        each = self.plan.restart_seconds()
        out: dict = {"restarts": left}
        if each is not None:
            out["node_hours"] = round(left * each / 3600.0, 2)
            out["gpu_minutes"] = round(left * each * self.plan.gpus / 60.0, 1)
            out["text"] = (f"about {left} more restarts, {_hours(left * each / 3600.0)} of node"
                           f" time ({describe_cost(out['gpu_minutes'], modeled)})")
        else:
            out["text"] = f"about {left} more restarts"
        return out
