"""The controller's part of the packages factor: settings, and every pin built before a run.

A pin that pip cannot install is bad input: it is found here, before the run directory exists,
by building the overlay on the controller (one line with pip's reason, exit 2, nothing written).
On a shared `runs_dir` the nodes then find the overlay ready; a node with its own disk builds
its copy from the same source before its first trial with the pin.

Package differences a system-level compare found are different: the run is already under way.
Those are tested only when the user named a package source (`packages.find_links=DIR` or
`packages.index_url=URL`: testing one means installing an old version of it), and one that
cannot be installed from it is set aside with pip's reason, like a variable the record cannot
restore.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from orchestrator.config.schema import BenchConf, PackagesConf
from orchestrator.errors import UserError
from orchestrator.packages.overlay import (
    OVERLAYS_DIRNAME,
    OverlayCache,
    OverlayError,
    OverlaySettings,
)
from orchestrator.util.pins import format_pin, pins_of

NO_SOURCE = ("not tested: no package source: give packages.find_links=DIR of wheels or"
             " packages.index_url=URL")


@dataclass(frozen=True)
class PackagePlan:
    """What building a pin needs: where overlays live and how pip fetches
    (`overlays`), and the target whose interpreter the servers run (overlays are built for
    it). A command cuts it from its settings (`commands/parts.package_plan`)."""

    overlays: OverlaySettings
    target: object
    bench: BenchConf
    runs_dir: Path


def find_links_checked(conf: PackagesConf) -> str | None:
    """The pins parse and the wheel directory exists: its path, absolute (a resumed run and
    every node find it from anywhere), or None when none was given."""
    pins_of(list(conf.pins))
    links = conf.find_links
    if not links:
        return None
    path = Path(links).expanduser().resolve()
    if not path.is_dir():
        raise UserError(f"packages.find_links={links}: not a directory of wheels")
    return str(path)


def overlay_settings(conf: PackagesConf, runs_dir: Path) -> OverlaySettings:
    gb = conf.max_gb
    return OverlaySettings(
        root=str(runs_dir / ".cache" / OVERLAYS_DIRNAME),
        find_links=(conf.find_links,) if conf.find_links else (),
        index_url=conf.index_url,
        pip_args=tuple(str(a) for a in conf.pip_args),
        max_bytes=int(float(gb) * 2**30) if gb else None,
        timeout_s=float(conf.timeout_s or 1800.0),
    )


def fixed_pins(conf: PackagesConf) -> dict[str, str]:
    """`packages=[...]`: pins every candidate of the run gets."""
    return pins_of(list(conf.pins))


def interpreter(plan: PackagePlan) -> str:
    """The interpreter the target's servers run (overlays are built for it)."""
    from orchestrator.targets.base import NodeContext
    from orchestrator.targets.registry import make_target

    try:
        target = make_target(plan.target, plan.bench,
                             NodeContext("controller", plan.runs_dir / ".nodes"))
        return target.python_executable()
    except Exception:
        return sys.executable


def build(plan: PackagePlan, pins: Mapping[str, str]) -> dict[str, str]:
    """Build the overlays of `pins`; `{pin: pip's reason}` of those that cannot be built."""
    cache = OverlayCache(plan.overlays)
    python = interpreter(plan)
    failed = {}
    for name, version in sorted(pins.items()):
        pin = format_pin(name, version)
        try:
            cache.ensure(pin, python)
        except OverlayError as exc:
            failed[pin] = str(exc)
    return failed


def require(plan: PackagePlan, *pin_sets: Mapping[str, str]) -> None:
    """Every pin of `pin_sets` can be installed, or one line naming the first that cannot."""
    pins: dict[str, str] = {}
    for p in pin_sets:
        pins.update(p)
    if not pins:
        return
    failed = build(plan, pins)
    if failed:
        pin, why = next(iter(failed.items()))
        raise UserError(f"cannot install {pin} for the trials: {why}")


def testable(plan: PackagePlan, changes: Iterable) -> tuple[list, dict[str, str]]:
    """Split system-level changes: those to test, and `{difference key: why not}` for the
    package changes that cannot be (no package source, or pip cannot install the version)."""
    keep, untested = [], {}
    for change in changes:
        if change.factor != "package":
            keep.append(change)
        elif not plan.overlays.configured:
            untested[change.name] = NO_SOURCE
        else:
            why = build(plan, {change.key: str(change.good)})
            if why:
                untested[change.name] = "not tested: " + next(iter(why.values()))
            else:
                keep.append(change)
    return keep, untested
