"""Target names -> adapter classes (the `target.name` config key selects one)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from orchestrator.config.schema import BenchConf, TargetConf
from orchestrator.errors import UserError, did_you_mean

if TYPE_CHECKING:  # the adapters (and the HTTP client they bring) load only when one is made
    from orchestrator.targets.base import NodeContext, Target

TARGETS = ("sim", "sglang", "command")


def check_name(name: str) -> None:
    """Refuse an unknown target name without importing any adapter."""
    if name not in TARGETS:
        raise UserError(f"unknown target {name!r}{did_you_mean(name, TARGETS)} (known:"
                        f" {', '.join(TARGETS)})")


def target_class(name: str) -> type[Target]:
    if name == "sim":
        from orchestrator.targets.simnode import SimTarget

        return SimTarget
    if name == "sglang":
        from orchestrator.targets.sglang import SglangTarget

        return SglangTarget
    if name == "command":
        from orchestrator.targets.command import CommandTarget

        return CommandTarget
    check_name(name)
    raise AssertionError(name)  # every name check_name accepts has its branch above


def make_target(conf: TargetConf | Mapping, bench: BenchConf | Mapping,
                node: NodeContext) -> Target:
    """The adapter of `conf`'s target (a plain mapping is built into its record)."""
    name = conf.name if isinstance(conf, TargetConf) else str(conf.get("name"))
    return target_class(name)(conf, bench, node)


def is_simulated(conf: TargetConf | Mapping | None) -> bool:
    """Whether a target configuration runs on the simulated node (`target=sim`, or the sim
    behind the SGLang adapter with `launcher=sim`): every output of such a run says so."""
    if isinstance(conf, TargetConf):
        return conf.name == "sim" or (conf.name == "sglang"
                                      and getattr(conf, "engine", None) == "sim")
    if not conf or not isinstance(conf, Mapping):
        return False
    name = str(conf.get("name") or "")
    return name == "sim" or (name == "sglang" and str(conf.get("engine") or "") == "sim")
