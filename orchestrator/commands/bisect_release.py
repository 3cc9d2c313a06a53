"""`sleuth bisect package=NAME good=V1 bad=V2`: which release of a package moved the metric.

The releases between the two versions (from the package source, in version order: see
`orchestrator/packages/releases.py`) are the bisect's ordered points, exactly as commits are:
each point is the run's candidate (its commit, patches, environment, clocks, other pins) with
`NAME==version` pinned in an overlay. The search is the commit bisect's strategy unchanged, so a
release line gets everything a commit range does: outlier restarts, several steps, a partial
fix, provisional answers. A release pip cannot install for the server's interpreter fails its
trial's preparation, and the strategy skips it as it skips a commit that does not build.

A release stands in for a commit where the strategy and the report read one (`CommitInfo` with
the version as its `sha`); the findings are then rewritten to speak of releases: kind
`package`, the release and the one before it, the release date where the source gives one,
each step's direction, and which versions were measured, skipped (and why) or left out.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence

from orchestrator import answer
from orchestrator.answer import text
from orchestrator.commands import common, parts
from orchestrator.config.requests import BisectRequest
from orchestrator.config.settings import RunSettings
from orchestrator.control import packages
from orchestrator.metrics import regression_direction
from orchestrator.packages.releases import Listing, describe, releases_between
from orchestrator.records import Candidate, Outcome
from orchestrator.util.pins import canonical, pin_list
from orchestrator.workspace import CommitInfo


def plan(cfg: RunSettings, req: BisectRequest
         ) -> tuple[list[CommitInfo], list[Candidate], dict]:
    """The releases as bisect points, and what the run records about them (`release`); the
    name and the two versions were checked with the request (`BisectRequest.of`)."""
    ws = common.workspace(cfg)
    base = common.candidate(cfg, ws)  # the code every release runs under
    name = canonical(req.package)
    fixed = packages.fixed_pins(cfg.packages)
    listing = releases_between(parts.package_plan(cfg).overlays, name, req.good, req.bad,
                               pre=req.package_pre, python=packages.interpreter(parts.package_plan(cfg)))
    # The endpoints must install: bad input otherwise (one line, nothing written).
    packages.require(parts.package_plan(cfg), {name: listing.versions[0]}, {name: listing.versions[-1]})
    commits, points = as_points(listing, base, fixed)
    return commits, points, release_doc(listing)


def as_points(listing: Listing, base: Candidate, pins: Mapping[str, str]
              ) -> tuple[list[CommitInfo], list[Candidate]]:
    """Each release as the strategy and the report read a commit (the version as its `sha`,
    the one before as its parent), and as a candidate: `base` with `pins` and the release."""
    commits, prev = [], ()
    for r in listing.releases:
        commits.append(CommitInfo(sha=r.version, parents=prev,
                                  subject=f"{listing.name} {r.version}", author="", date=r.date,
                                  files=()))
        prev = (r.version,)
    points = [dataclasses.replace(base, packages=pin_list({**pins, listing.name: v}))
              for v in listing.versions]
    return commits, points


def release_doc(listing: Listing) -> dict:
    return {"name": listing.name, "source": listing.source,
            "releases": [r.to_json() for r in listing.releases],
            "excluded": list(listing.excluded)}


def opening(release: Mapping) -> str:
    return "bisecting " + describe(release["name"], [r["version"] for r in release["releases"]],
                                   release["excluded"], release["source"])


def version_status(rows: Sequence, keys: Sequence[str], versions: Sequence[str],
                   name: str = "") -> list[dict]:
    """Per release: the restarts measured, or why it was skipped (every trial failed), or that
    the search never needed it."""
    out = []
    for version, key in zip(versions, keys, strict=True):
        mine = [r for r in rows if r.candidate.key == key and r.outcome is not None]
        ok = sum(1 for r in mine if r.outcome.measured)
        failed = [r for r in mine if not r.outcome.measured
                  and r.outcome is not Outcome.INTERRUPTED]
        item: dict = {"version": version, "measured": ok}
        installed = installed_files(mine, name)
        if installed:
            item["installed"] = installed
        if not ok and failed:
            detail = (failed[0].detail or "").strip().splitlines()
            item["skipped"] = f"{failed[0].outcome.value}" + (f": {detail[0][:200]}"
                                                              if detail else "")
        out.append(item)
    return out


def installed_files(rows: Sequence, name: str) -> list[dict]:
    """The distinct files the trials of one release installed `name` from (`{"file", "sha256",
    "trials"}`), read from their fingerprints: normally one; more would mean the nodes'
    caches hold different builds of one version, which the findings must show."""
    seen: dict[tuple[str, str], list[int]] = {}
    for r in rows:
        result = getattr(r, "result", None)
        overlay = ((result.fingerprint if result else None) or {}).get("overlay") or {}
        for pin, source in (overlay.get("installed") or {}).items():
            if pin.split("==", 1)[0] != name:
                continue
            key = (str(source.get("file", "")), str(source.get("sha256", "")))
            seen.setdefault(key, []).append(r.id)
    return [{"file": f, "sha256": h, "trials": ids} for (f, h), ids in seen.items()]


def _step(pct: float, total_pct: float | None, bad_increases: bool) -> str:
    """A step's direction: `regression` (the metric got worse), `fix` or `partial fix` when
    it went back (partial: the endpoints still differ the regression's way)."""
    worse = pct > 0 if bad_increases else pct < 0
    if worse:
        return "regression"
    still = total_pct is not None and (total_pct > 0 if bad_increases else total_pct < 0)
    return "partial fix" if still else "fix"


def rewrite(doc: dict, release: Mapping, rows: Sequence, keys: Sequence[str], *,
            metric: str, direction: str) -> dict:
    """A commit-shaped bisect document, told as releases of the package."""
    name = str(release["name"])
    info = {r["version"]: r for r in release["releases"]}
    versions = [r["version"] for r in release["releases"]]
    increases = regression_direction(metric, direction) == "increase"
    total = (doc.get("total_effect") or {}).get("pct")
    for f in doc.get("findings", []):
        version, parent = str(f["id"]), str(f.get("parent", ""))
        r = info.get(version, {})
        effect = (f.get("effect_detail") or {}).get(metric) or (f.get("effect") or {}).get(metric)
        f["kind"] = "package"
        f["id"] = f"{name} {version}"
        f.update(package=name, release=version, parent=parent)
        for key in ("subject", "author"):
            f.pop(key, None)
        if r.get("date"):
            f["date"] = r["date"]
        if r.get("url"):
            f["url"] = r["url"]
        when = f" (released {r['date']})" if r.get("date") else ""
        f["label"] = f"{name} {parent} -> {version}{when}"
        moved = f"{metric} {text.change_text(effect, metric)}" if effect else f"{metric} changed"
        f["summary"] = f"{name} {version}{when}: {moved} against {parent}"
        if effect and isinstance(effect.get("pct"), int | float):
            f["step"] = _step(float(effect["pct"]), total, increases)
            f["summary"] += f" ({f['step']})"
        if f.get("range"):
            f["summary"] = f["summary"] + f" (one of {len(f['range'])} releases: neighbours " \
                "that could not be installed or run)"
    for o in doc.get("outliers", []):
        o["release"] = o.get("commit")
    status = version_status(rows, keys, versions, name)
    doc["package"] = {**dict(release), "versions": status}
    measured = [f"{s['version']} ({s['measured']})" for s in status if s["measured"]]
    skipped = [f"{s['version']} ({s['skipped']})" for s in status if s.get("skipped")]
    notes = [f"releases measured (restarts): {', '.join(measured) or 'none'}"]
    if skipped:
        notes.append(f"releases skipped: {'; '.join(skipped)}")
    if release.get("excluded"):
        notes.append("releases left out: " + "; ".join(
            f"{e['version']} ({e['why']})" for e in release["excluded"]))
    doc["notes"] = [*doc.get("notes", []), *notes]
    if doc.get("message"):
        doc["message"] = _release_words(doc["message"], versions)
    mechanism = (doc.get("answer") or {}).get("mechanism")
    doc["answer"] = answer.for_bisect(doc, good=f"{name} {versions[0]}",
                                      bad=f"{name} {versions[-1]}", mechanism=mechanism)
    return doc


def _release_words(message: str, versions: Sequence[str]) -> str:
    """The strategy's sentence in releases: `point 6` is `1.6`, a commit a release."""
    def at(text: str) -> str:
        i = int(text)
        return versions[i] if i < len(versions) else f"point {text}"

    message = re.sub(r"\bpoints (\d+) and (\d+)",
                     lambda m: f"releases {at(m.group(1))} and {at(m.group(2))}", message)
    message = re.sub(r"\bpoint (\d+)", lambda m: at(m.group(1)), message)
    return message.replace("commits", "releases").replace("commit", "release")


def step_lines(doc: Mapping) -> list[str]:
    """The steps, in release order, with their direction: what a person reads after the
    answer ("1.3 -> 1.4 regression x3.0 [..]; 1.6 -> 1.7 partial fix -33% [..]")."""
    metric = str(doc.get("metric", ""))
    steps = [f for f in doc.get("findings", []) if f.get("kind") == "package"]
    order = [s["version"] for s in (doc.get("package") or {}).get("versions", [])]
    steps.sort(key=lambda f: order.index(f["release"]) if f.get("release") in order else 0)
    out = []
    for f in steps:
        effect = (f.get("effect") or {}).get(metric)
        out.append(f"  {f['label']}: {f.get('step', 'step')} {metric} "
                   f"{text.change_text(effect, metric)} (P {f.get('probability')})")
    return (["steps:"] + out) if out else []
