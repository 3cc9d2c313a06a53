"""A trial's packages: lease its overlays, and check what its server really imported.

The trial runner calls three things: :func:`lease` while preparing (the overlays of the
candidate's pins, built if missing, held so the cache cap leaves them alone), the overlay's
`variables` when it builds the server's environment, and :func:`verify` once the server is up
(before anything is measured): every pin must be what the server imports, or the trial is
`env_mismatch`. The fingerprint then records the versions the server really runs with.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from orchestrator.packages.overlay import OverlaySet, OverlaySettings
from orchestrator.system.fingerprint import package_fields
from orchestrator.util.pins import canonical


def lease(extra: Mapping, pins: Mapping[str, str], python: str) -> OverlaySet | None:
    """The held overlays of `pins` (None without pins). `extra["packages"]` holds the run's
    overlay settings (:class:`OverlaySettings` as JSON). Raises OverlayError."""
    if not pins:
        return None
    doc = extra.get("packages")
    if not doc:
        raise RuntimeError("the candidate pins packages but the trial has no overlay settings")
    return OverlaySet.lease(OverlaySettings.from_json(doc), pins, python)


def _inside(path: str | None, root: Path) -> bool:
    if not path:
        return False
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(root))
    except ValueError:
        return False
    return True


def _same_version(a: object, b: object) -> bool:
    return str(a).strip().lower().replace("_", "-") == str(b).strip().lower().replace("_", "-")


def problems_of(overlays: OverlaySet, report: Mapping) -> list[str]:
    """Why the server does not run what the pins ask (empty when it does)."""
    imported = report.get("packages") or {}
    mapped = report.get("libraries") or {}
    source = report.get("source", "the server")
    out = []
    for o in overlays.overlays:
        got = imported.get(o.name)
        if got is None:
            out.append(f"{o.pin} requested but the server imports no {o.name} ({source})")
            continue
        if not _same_version(got.get("version"), o.version):
            out.append(f"{o.pin} requested but the server imports {o.name} {got.get('version')}"
                       f" from {got.get('location')} ({source})")
            continue
        if _inside(got.get("location"), o.path):
            for module, origin in sorted((got.get("modules") or {}).items()):
                if not _inside(origin, o.path):
                    out.append(f"{o.pin}: module {module} is imported from {origin}, not from"
                               " the overlay")
        for lib in o.libraries:
            for path in mapped.get(lib, []):
                if not _inside(path, o.path):
                    out.append(f"{o.pin}: {lib} is loaded from {path}, not from the overlay")
    return out


def verify(target, overlays: OverlaySet, server, base_url: str, env: Mapping[str, str],
           cwd: Path, fp: dict) -> list[str]:
    """Ask the target what the server imported, record it in `fp`, and return why the pins
    did not take effect (empty when they did). Not being able to tell is a problem too: a
    measurement is only taken under versions that were read back. A server that has already
    exited is left to the next step, which records the crash."""
    if server is not None and server.poll() is not None:
        return []
    try:
        report = target.imported_packages(server, base_url, env, cwd,
                                          [o.name for o in overlays.overlays],
                                          [lib for o in overlays.overlays for lib in o.libraries])
    except (RuntimeError, OSError, ValueError) as exc:
        fp["overlay"] = {"pins": [o.pin for o in overlays.overlays], "error": str(exc),
                         "installed": {o.pin: o.source() for o in overlays.overlays}}
        return [f"cannot tell which package versions the server imported: {exc}"]
    record(fp, overlays, report)
    return problems_of(overlays, report)


def record(fp: dict, overlays: OverlaySet, report: Mapping) -> None:
    """The overlays and what the server imported, in the fingerprint; `packages` becomes the
    versions the server runs with (the node's, with the pinned ones as it imported them).
    `installed`: the file each overlay was installed from, with its sha256."""
    reported = report.get("packages") or {}
    imported = {o.name: reported.get(o.name) for o in overlays.overlays}
    fp["overlay"] = {"pins": [o.pin for o in overlays.overlays],
                     "dirs": {o.pin: str(o.path) for o in overlays.overlays},
                     "installed": {o.pin: o.source() for o in overlays.overlays},
                     "source": report.get("source", ""), "imported": imported,
                     "libraries": dict(report.get("libraries") or {})}
    pkgs = dict(fp.get("packages") or {})
    for o in overlays.overlays:
        for key in [k for k in pkgs if canonical(k) == o.name]:
            del pkgs[key]
        got = imported.get(o.name)
        if got is not None and got.get("version"):
            pkgs[o.name] = str(got["version"])
    fp.update(package_fields(pkgs))
