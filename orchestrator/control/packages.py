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
from pathlib import Path

from orchestrator.config.settings import RunSettings, evolve
from orchestrator.errors import UserError
from orchestrator.packages.overlay import (
    OVERLAYS_DIRNAME,
    OverlayCache,
    OverlayError,
    OverlaySettings,
)
from orchestrator.run.rundir import runs_root
from orchestrator.util.pins import format_pin, pins_of

NO_SOURCE = ("not tested: no package source: give packages.find_links=DIR of wheels or"
             " packages.index_url=URL")


def check_settings(cfg: RunSettings) -> RunSettings:
    """The pins parse and the wheel directory exists; the settings returned hold its path
    absolute (a resumed run and every node find it from anywhere)."""
    pins_of(list(cfg.packages.pins))
    links = cfg.packages.find_links
    if links:
        path = Path(links).expanduser().resolve()
        if not path.is_dir():
            raise UserError(f"packages.find_links={links}: not a directory of wheels")
        cfg = evolve(cfg, {"packages.find_links": str(path)})
    return cfg


def settings(cfg: RunSettings) -> OverlaySettings:
    conf = cfg.packages
    gb = conf.max_gb
    return OverlaySettings(
        root=str(runs_root(cfg) / ".cache" / OVERLAYS_DIRNAME),
        find_links=(conf.find_links,) if conf.find_links else (),
        index_url=conf.index_url,
        pip_args=tuple(str(a) for a in conf.pip_args),
        max_bytes=int(float(gb) * 2**30) if gb else None,
        timeout_s=float(conf.timeout_s or 1800.0),
    )


def fixed_pins(cfg: RunSettings) -> dict[str, str]:
    """`packages=[...]`: pins every candidate of the run gets."""
    return pins_of(list(cfg.packages.pins))


def interpreter(cfg: RunSettings) -> str:
    """The interpreter the target's servers run (overlays are built for it)."""
    from orchestrator.targets.base import NodeContext
    from orchestrator.targets.registry import make_target

    try:
        target = make_target(cfg.target, cfg.bench,
                             NodeContext("controller", runs_root(cfg) / ".nodes"))
        return target.python_executable()
    except Exception:
        return sys.executable


def build(cfg: RunSettings, pins: Mapping[str, str]) -> dict[str, str]:
    """Build the overlays of `pins`; `{pin: pip's reason}` of those that cannot be built."""
    cache = OverlayCache(settings(cfg))
    python = interpreter(cfg)
    failed = {}
    for name, version in sorted(pins.items()):
        pin = format_pin(name, version)
        try:
            cache.ensure(pin, python)
        except OverlayError as exc:
            failed[pin] = str(exc)
    return failed


def require(cfg: RunSettings, *pin_sets: Mapping[str, str]) -> None:
    """Every pin of `pin_sets` can be installed, or one line naming the first that cannot."""
    pins: dict[str, str] = {}
    for p in pin_sets:
        pins.update(p)
    if not pins:
        return
    failed = build(cfg, pins)
    if failed:
        pin, why = next(iter(failed.items()))
        raise UserError(f"cannot install {pin} for the trials: {why}")


def testable(cfg: RunSettings, changes: Iterable) -> tuple[list, dict[str, str]]:
    """Split system-level changes: those to test, and `{difference key: why not}` for the
    package changes that cannot be (no package source, or pip cannot install the version)."""
    keep, untested = [], {}
    configured = settings(cfg).configured
    for change in changes:
        if change.factor != "package":
            keep.append(change)
        elif not configured:
            untested[change.name] = NO_SOURCE
        else:
            why = build(cfg, {change.key: str(change.good)})
            if why:
                untested[change.name] = "not tested: " + next(iter(why.values()))
            else:
                keep.append(change)
    return keep, untested
