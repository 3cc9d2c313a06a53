"""The part of a run's settings the controller, its node pool and its trial specs read.

A command cuts it from its whole settings (`commands/parts.control`), so what reaches the
controller is what it uses: where trials run and how many at once, how a trial starts and
measures, where pinned packages are built, and the clock policies every node checks before its
first trial. Command-specific decisions (an isolate's sides, a sweep's space) stay with the
command; only their clock policies come down, as a list.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.schema import BenchConf, ClusterConf, EvidenceConf, TrialConf
from orchestrator.packages.overlay import OverlaySettings


@dataclass(frozen=True)
class ControlSettings:
    repo: str
    runs_dir: Path  # absolute: `.cache/` (worktrees, overlays) and `.nodes/` live under it
    nodes: int
    cluster: ClusterConf
    trial: TrialConf
    target: object  # the target's typed record (`config.schema.TARGET_SCHEMAS`)
    bench: BenchConf
    evidence: EvidenceConf
    overlays: OverlaySettings
    cache_max_bytes: int | None  # `cache.max_gb` in bytes; None: uncapped
    clocks: tuple[str, ...] = ("default",)  # every clock policy the run's trials set
