"""The parts of a run's settings each lower layer takes, cut here from the whole tree.

A command holds the whole `RunSettings`; the modules below `commands/` each get the part they
use, as a small frozen record: the controller and its nodes (`ControlSettings`), the package
overlays (`PackagePlan`), the reference loader (`ReferenceQuery`), the run directory (the
configuration to write down, as a plain mapping). One place that knows which settings each
part holds, so a setting read below the commands is found by reading its part's record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.config.settings import RunSettings, as_dict, evolve
from orchestrator.control.packages import PackagePlan, overlay_settings
from orchestrator.control.settings import ControlSettings
from orchestrator.reference.record import ReferenceQuery
from orchestrator.run import rundir
from orchestrator.store import RunStore
from orchestrator.store.locate import locate_run

if TYPE_CHECKING:
    from orchestrator.strategies.sweep.space import SearchSpace


def pin_run(cfg: RunSettings) -> RunSettings:
    """The settings with the run's id chosen and `runs_dir` absolute, as the run stores them
    and as its nodes (which may start elsewhere) read them."""
    return evolve(cfg, run_id=cfg.run_id or rundir.new_run_id(cfg.command),
                  runs_dir=str(cfg.runs_root))


def create_run(cfg: RunSettings) -> tuple[Path, RunStore]:
    """`runs/<run-id>/` with the settings pinned by `pin_run` (which the caller runs with)
    written down in it (`run.rundir.create_run`)."""
    return rundir.create_run(as_dict(pin_run(cfg)))


def find_run(cfg: RunSettings, ref: str) -> Path:
    """A run given as a directory path or as a run id under runs_dir (`store/locate.py`)."""
    return locate_run(ref, cfg.runs_dir)


def package_plan(cfg: RunSettings) -> PackagePlan:
    """Where pinned packages are built and which Python they are built for."""
    return PackagePlan(overlays=overlay_settings(cfg.packages, cfg.runs_root),
                       target=cfg.target, bench=cfg.bench, runs_dir=cfg.runs_root)


def control(cfg: RunSettings, *, sides: Sequence[object] = (),
            space: SearchSpace | None = None) -> ControlSettings:
    """What the controller, its node pool and its trial specs read, with every clock policy
    the command's trials set: the run's own, an isolate's sides (`good.clock=...`), a sweep's
    clock levels. The nodes check each against their GPUs before the first trial, so a policy
    a GPU refuses is found before any trial is spent."""
    clocks = [str(side["clock"]) for side in sides
              if isinstance(side, Mapping) and side.get("clock")]
    if space is not None:
        clocks += [str(v) for p in space.params if p.kind == "clock" for v in p.values
                   if v is not None]
    gb = cfg.cache.max_gb
    return ControlSettings(
        repo=str(cfg.repo), runs_dir=cfg.runs_root, nodes=cfg.nodes, cluster=cfg.cluster,
        trial=cfg.trial, target=cfg.target, bench=cfg.bench, evidence=cfg.evidence,
        overlays=package_plan(cfg).overlays,
        cache_max_bytes=int(float(gb) * 2**30) if gb else None,
        clocks=tuple(sorted({str(cfg.clock or "default"), *clocks})))


def reference_query(cfg: RunSettings) -> ReferenceQuery:
    """What the reference loader reads to find and describe a reference (a run, a log)."""
    good = cfg.good if isinstance(cfg.good, str | int) and cfg.good else None
    return ReferenceQuery(
        repo=str(cfg.repo) if cfg.repo else None, runs_dir=cfg.runs_root,
        run_id=str(cfg.run_id) if cfg.run_id else None, commit=str(cfg.commit or "HEAD"),
        good=str(good) if good is not None else None,
        log_pattern=str(getattr(getattr(cfg, "log", None), "pattern", "") or ""),
        target=cfg.target)
