"""Target names -> adapter classes (the `target.name` config key selects one)."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.errors import UserError
from orchestrator.targets.base import NodeContext, Target


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
    raise UserError(f"unknown target {name!r} (known: sim, sglang, command)")


def make_target(conf: Mapping, bench: Mapping, node: NodeContext) -> Target:
    return target_class(str(conf.get("name")))(conf, bench, node)
