"""`investigate`: after isolate proves a package change harmful, which release of it was it?

"nvidia-nccl-cu12 2.27.5 -> 2.28.3 costs verify +13%" is half an answer: the next question is
which release between the two brought it (and whether a later one fixed it). When the package
source lists the releases in between, the investigation searches them with the release bisect
(`bisect_release`) on the isolate's good configuration, with only that package's version
changing, and the isolate's cause then names the release. Off with `packages.bisect=false`.

The cause keeps the isolate's effect and interval (what the answer adds up); the release search
only says where in the line the change came from, in its own findings (`findings-release.json`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from orchestrator.answer.text import change_label
from orchestrator.commands import bisect, bisect_release, parts
from orchestrator.config.requests import InvestigateRequest
from orchestrator.config.settings import RunSettings
from orchestrator.control import packages
from orchestrator.errors import UserError
from orchestrator.packages.releases import releases_between
from orchestrator.run import findings


def harmful_packages(doc: Mapping, confidence: float) -> list[dict]:
    """The isolate's package causes on their own (not a pair), at the run's confidence."""
    out = []
    for f in doc.get("findings", []):
        diffs = f.get("differences") or []
        if (f.get("kind") == "package" and len(diffs) == 1 and not f.get("interaction")
                and float(f.get("probability") or 0) >= confidence):
            out.append(f)
    return out


def _versions(diff: Mapping) -> tuple[str, str] | None:
    good = diff.get("good") or diff.get("reference")
    bad = diff.get("bad") or diff.get("now")
    return (str(good), str(bad)) if good and bad and str(good) != str(bad) else None


def follow(cfg: RunSettings, req: InvestigateRequest, ctl, run_dir, isolate_doc: dict, out,
           progress=None) -> dict | None:
    """Search the releases of the first package the isolate named; returns the search's
    findings document (None when nothing was searched, with the reason printed)."""
    if not cfg.packages.bisect:
        return None
    for finding in harmful_packages(isolate_doc, req.confidence):
        diff = finding["differences"][0]
        ends = _versions(diff)
        name = str(diff.get("level_key") or diff.get("key"))
        if ends is None:
            continue
        try:
            listing = releases_between(parts.package_plan(cfg).overlays, name, *ends,
                                       pre=cfg.package.pre,
                                       python=packages.interpreter(parts.package_plan(cfg)))
            if len(listing.versions) < 3:
                out.print(f"{name}: the source lists no release between {ends[0]} and {ends[1]}"
                          f": {ends[1]} is the release")
                continue
            packages.require(parts.package_plan(cfg), {name: ends[1]})
        except UserError as exc:
            out.print(f"{name}: releases not searched: {exc}")
            continue
        base = next((r.candidate for r in ctl.store.trials()
                     if r.candidate.key == finding.get("before_key")), None)
        if base is None:
            continue
        out.print(f"\n== which release of {name}: {ends[0]} -> {ends[1]} ==")
        commits, points = bisect_release.as_points(listing, base, base.package_dict)
        # releases are a line, judged on their own ends (not against the reference's level)
        step = dataclasses.replace(req.bisect_step(*ends), first_parent=True, reference=None)
        _, doc = bisect.execute(cfg, step, ctl, run_dir, commits, points, None, out,
                                findings_name="release", progress=progress,
                                release=bisect_release.release_doc(listing))
        name_release(finding, doc)
        findings.write(run_dir, isolate_doc, "isolate")
        return doc
    return None


def name_release(finding: dict, doc: Mapping) -> None:
    """The isolate's package cause names the release(s) the search found, in its label."""
    steps = [f for f in doc.get("findings", []) if f.get("kind") == "package"]
    if doc.get("verdict") != "found" or not steps:
        return
    order = [s["version"] for s in (doc.get("package") or {}).get("versions", [])]
    steps.sort(key=lambda f: order.index(f["release"]) if f.get("release") in order else 0)
    said = []
    for f in steps:
        when = f", released {f['date']}" if f.get("date") else ""
        said.append(f"{f.get('step', 'step')} in {f['release']} against {f['parent']}{when}")
    diff = finding["differences"][0]
    finding["release"] = steps[0]["release"]
    finding["releases"] = [{"release": f["release"], "parent": f["parent"],
                            "step": f.get("step"), "date": f.get("date")} for f in steps]
    finding["label"] = f"{change_label(str(diff.get('label') or finding['id']))} " \
                       f"({'; '.join(said)})"
    finding["summary"] = f"{finding.get('summary', '')} ({'; '.join(said)})".strip()
