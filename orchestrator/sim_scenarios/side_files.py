"""A scenario's side files and their truth: patches, the reference/now system state, env effects.

Split from :mod:`orchestrator.sim_scenarios.generate`: each planted cause outside the history is
priced by the sim's own model here, so a run can be graded cause by cause.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path

from orchestrator.packages.wheels import write_wheel
from orchestrator.sim_scenarios import presets as material
from orchestrator.sim_scenarios import system_stories as stories
from orchestrator.sim_scenarios.presets import (
    FRAGMENT_DIR,
    effects_of,
    modelled_effect,
    profile_effect,
)
from orchestrator.targets.sim import gpu_state
from orchestrator.targets.sim import packages as sim_packages


def write_patches(out: Path, clock: int, profile: Mapping, rng: random.Random) -> dict:
    """Write the preset's patch files; return their truth (which hurt, alone and together)."""
    specs = material.patch_specs(rng)
    (out / "patches").mkdir()
    for i, spec in enumerate(specs):
        when = clock + (i + 1) * 3600
        name, handle, tz = rng.choice(material.AUTHORS)
        text = material.patch_text(spec, (name, material.author_email(handle), tz), when)
        (out / "patches" / spec.filename).write_text(text)
    base = effects_of(profile)
    harmful = [s for s in specs if s.role == "harmful"]
    pair = [s for s in specs if s.role == "pair"]

    def effect_of(chosen: list[material.PatchSpec]) -> dict:
        fragments = {s.stem: s.fragment for s in chosen}
        return profile_effect(base, effects_of(profile, fragments))

    return {
        "dir": "patches",
        "files": [s.filename for s in specs],
        "fragments": {s.filename: f"{FRAGMENT_DIR}/{s.stem}.json" for s in specs},
        "harmful": harmful[0].filename,
        "pair": [s.filename for s in pair],
        "harmless": [s.filename for s in specs if s.role == "harmless"],
        "effects": {
            "harmful": effect_of(harmful),
            "pair": effect_of(pair),
            "pair_members_alone": [effect_of([s]) for s in pair],
            "all": effect_of(specs),
        },
    }


def write_system(out: Path, rng: random.Random, code_profile: Mapping,
                 story: str = "power_nccl") -> tuple[dict, dict]:
    """Write the reference/now system-state files; return the `system` and `env` truth.

    Each change is priced alone (reference with only that factor moved) by the sim's model,
    at the code of the bad commit, so an isolate run can be graded factor by factor.
    """
    if story != "power_nccl":
        return _write_story(out, rng, code_profile, story)
    reference_env, now_env = material.system_envs(rng)
    reference_packages, now_packages = material.system_packages()
    reference_state = gpu_state.default_state()
    now_state = reference_state.with_all_gpus(power_limit_w=material.NOW_POWER_LIMIT_W)
    states = {
        "reference": {"env": reference_env, "gpu_state": gpu_state.to_dict(reference_state),
                      "packages": reference_packages},
        "now": {"env": now_env, "gpu_state": gpu_state.to_dict(now_state), "packages": now_packages},
    }  # fmt: skip
    for when, docs in states.items():
        docs["launcher"] = {"strip": []}
        for what, doc in docs.items():
            (out / f"{when}_{what}.json").write_text(material.render_json(doc))

    def effect(env: Mapping[str, str], state: gpu_state.GpuState) -> dict:
        return modelled_effect(code_profile, (reference_env, reference_state), (env, state))

    def harmful(moved: dict) -> bool:
        return any(moved[m]["pct"] >= 1.0 for m in ("verify_ms", "decode_ms"))

    dropped = {k: v for k, v in reference_env.items() if k != "NCCL_PROTO"}
    harmless_env = {**now_env, "NCCL_PROTO": reference_env["NCCL_PROTO"]}
    harmless_vars = sorted(k for k in set(reference_env) | set(now_env)
                           if k != "NCCL_PROTO" and reference_env.get(k) != now_env.get(k))  # fmt: skip
    bumped, version = material.UNRELATED_PACKAGE_BUMP
    power = reference_state.gpus[0].power_limit_w
    changes = [
        {"factor": "clock", "what": "power_limit_w", "gpus": [g.index for g in now_state.gpus],
         "reference": power, "now": material.NOW_POWER_LIMIT_W,
         "effect": effect(reference_env, now_state)},
        {"factor": "env", "var": "NCCL_PROTO", "reference": reference_env["NCCL_PROTO"],
         "now": None, "effect": effect(dropped, reference_state)},
        {"factor": "packages", "name": bumped, "reference": reference_packages[bumped],
         "now": version, "effect": {}},
        {"factor": "env", "vars": harmless_vars, "effect": effect(harmless_env, reference_state)},
    ]  # fmt: skip
    for change in changes:
        change["harmful"] = bool(change["effect"]) and harmful(change["effect"])
    files = {when: {what: f"{when}_{what}.json" for what in docs} for when, docs in states.items()}
    system = {**files, "changes": changes, "total_effect": effect(now_env, now_state)}
    return system, env_truth(code_profile, now_env, now_state)


def _write_story(out: Path, rng: random.Random, code_profile: Mapping, story: str
                 ) -> tuple[dict, dict]:
    """A system story of :func:`stories.system_story`: files, and each change priced alone on
    the server's environment (the node's minus what its launcher strips)."""
    reference, now, changes = stories.system_story(story, rng)
    files: dict[str, dict[str, str]] = {}
    for when, state in (("reference", reference), ("now", now)):
        docs = {"env": state.env, "gpu_state": gpu_state.to_dict(state.gpus),
                "packages": state.packages, "launcher": {"strip": list(state.strip)}}
        for what, doc in docs.items():
            (out / f"{when}_{what}.json").write_text(material.render_json(doc))
        files[when] = {what: f"{when}_{what}.json" for what in docs}
    for name, version in reference.wheels:
        write_wheel(out / "wheels", name, version, wheel_files(name, version),
                    f"{name} as the simulated node had it")
    if reference.wheels:
        files["wheels"] = "wheels"  # type: ignore[assignment]

    def effect(state: stories.SystemState) -> dict:
        return modelled_effect(code_profile, (reference.server_env, reference.model_gpus()),
                               (state.server_env, state.model_gpus()))

    priced = []
    for record, moved in changes:
        change = {**record, "effect": effect(moved)}
        change["harmful"] = any(change["effect"][m]["pct"] >= 1.0
                                for m in ("verify_ms", "decode_ms"))
        priced.append(change)
    system = {**files, "changes": priced, "total_effect": effect(now),
              "launcher": {"now_strips": list(now.strip)}}
    return system, env_truth(code_profile, now.server_env, now.gpus)


def wheel_files(name: str, version: str) -> dict[str, str | bytes]:
    """What a simulated node's wheel holds: the NCCL one its shared library (which the sim
    finds on LD_LIBRARY_PATH and never loads), any other one a module with its version."""
    if name in sim_packages.NCCL_DISTRIBUTIONS:
        return {"nvidia/nccl/__init__.py": "",
                f"nvidia/nccl/lib/{sim_packages.NCCL_LIBRARY}":
                    f"simulated NCCL {version}: not a real shared library\n".encode()}
    module = name.replace("-", "_")
    return {f"{module}/__init__.py": f"__version__ = {version!r}\n"}


def env_truth(code_profile: Mapping, now_env: Mapping, now_state: gpu_state.GpuState) -> dict:
    """The planted env effects, each priced on top of the "now" env: what a sweep can win back."""
    planted = [dict(entry) for entry in code_profile.get("env_effects", ())]
    priced = []
    for entry in planted:
        env = {**now_env, entry["var"]: entry["value"]}
        moved = modelled_effect(code_profile, (now_env, now_state), (env, now_state))
        priced.append({"var": entry["var"], "value": entry["value"], "effect": moved})
    helpful = [p for p in priced if p["effect"]["verify_ms"]["pct"] < 0]
    return {"planted": planted, "effects": priced,
            "worth_sweeping": {p["var"]: p["value"] for p in helpful}}  # fmt: skip
