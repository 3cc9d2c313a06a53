"""Target names -> adapter classes (the `target.name` config key selects one)."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.errors import UserError
from orchestrator.targets.base import NodeContext, Target


def target_class(name: str) -> type[Target]:
    if name == "sim":
        from orchestrator.targets.simnode import SimTarget

        return SimTarget
    raise UserError(f"unknown target {name!r} (known: sim)")


def make_target(conf: Mapping, bench: Mapping, node: NodeContext) -> Target:
    return target_class(str(conf.get("name")))(conf, bench, node)
