"""The investigation's plan in GPU-hours, its budget, and its ledger lines.

`investigate.execute` calls :func:`start` once the nodes are up and before the first restart:
it prints the plan (:mod:`orchestrator.run.plan`: expected restarts and GPU time per step,
from the node's measured restart cost and noise), installs the budget check on the controller
(before every restart), and returns the state that :func:`after_step` keeps current (what is
left, once a step is done or the compare has named the differences) and :func:`at_budget`
turns into the answer so far with what finishing would cost.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.answer.provisional import so_far
from orchestrator.config import params as experiment_params
from orchestrator.config.settings import RunSettings, as_dict
from orchestrator.control.controller import Controller
from orchestrator.run import ledger
from orchestrator.run import plan as budget_plan
from orchestrator.run.cost import simulated
from orchestrator.run.noise_prior import load_noise_prior


@dataclass
class PlanState:
    plan: budget_plan.Plan
    check: budget_plan.BudgetCheck | None
    modeled: bool
    marks: dict[str, int] = field(default_factory=dict)


def start(cfg: RunSettings, ctl: Controller, run_dir: Path, p, out) -> PlanState:
    """Print the plan and install the budget before the first restart."""
    req = p.request
    target = as_dict(cfg.target)
    prior = load_noise_prior(run_dir, nodes=ctl.nodes, metric=req.metric)
    noise = prior.trial_noise(int(cfg.bench.repetitions))
    sigma = noise[0] if noise is not None else None
    params = experiment_params.of(cfg)
    min_effect = params.min_effect_pct if params.min_effect_pct is not None else 4.0
    plan = budget_plan.initial(
        prior_costs=prior.costs, repetitions=int(cfg.bench.repetitions),
        has_reference=p.reference is not None, range_commits=len(p.commits), sigma=sigma,
        min_effect_pct=min_effect, final_trials=params.final_trials)
    budget = budget_plan.parse_budget(cfg.budget)
    state = PlanState(plan, None, simulated(target))
    for line in plan.lines(state.modeled):
        out.print(line)
    if budget.set:
        out.print(f"budget: {budget.describe(plan.gpus)}; at it the answer so far, and what"
                  " finishing would cost")
        state.check = budget_plan.BudgetCheck(budget, plan, target)
        ctl.before_restart = state.check
    return state


def after_step(state: PlanState, step: str, rows, out, *, n_differences: int | None = None,
               n_live: int = 0) -> None:
    """A step is done (or the isolate's size is known): say what is left."""
    plan = state.plan
    if n_differences is not None:
        plan.expected["isolate"] = budget_plan.isolate_expected(n_differences, n_live)
        plan.why["isolate"] = (f"{n_differences} difference(s)"
                               + (f", {n_live} within one lifetime" if n_live else ""))
        return
    plan.done.add(step)
    spent = ledger.spent(rows, state.marks)
    lines = plan.lines(state.modeled, spent=spent, title=f"after the {step}, left")
    if lines:
        out.print(lines[0])


def after_compare(state: PlanState, cfg: RunSettings, cdoc: dict, rows, out) -> None:
    """The compare is done: the isolate's differences are known (or there is none)."""
    from orchestrator.commands.isolate import differences_from_compare
    from orchestrator.system.differences import changes_from_system
    from orchestrator.system.runtime_settable import live_indices

    if cdoc.get("verdict") not in ("not_reproduced", "unresolved"):
        no_isolate(state)
    else:
        found = changes_from_system(differences_from_compare(cdoc),
                                    all_env=experiment_params.of(cfg).all_env)
        found = [c for c in found if c.factor != "package"]  # a package source is rare
        live = (live_indices(found) if experiment_params.of(cfg).within_lifetime
                else frozenset())
        after_step(state, "isolate", rows, out, n_differences=len(found), n_live=len(live))
        if not found:
            no_isolate(state)
    after_step(state, "compare", rows, out)


def no_isolate(state: PlanState) -> None:
    """The compare reproduced (or found nothing to test): no isolate."""
    state.plan.expected.pop("isolate", None)


def at_budget(result: dict, state: PlanState, rows, why: str, confidence: float) -> dict:
    """The answer so far at the budget, with what finishing would cost."""
    spent = ledger.spent(rows, state.marks)
    finish = (state.check.to_finish(spent, state.modeled) if state.check is not None
              else {"text": ""})
    out = so_far(result, why=f"{why}; to finish: {finish['text']}", confidence=confidence)
    out["budget"] = {"spent": why, "to_finish": finish,
                     "restarts": sum(spent.values())}
    return out


def reuse_lines(rows, keys, marks, step: str, what: str) -> list[str]:
    line = ledger.reuse_line(rows, keys, marks, step, what)
    return [line] if line else []
