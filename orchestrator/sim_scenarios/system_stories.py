"""System stories of the scenarios: how a node's system changed between the reference and now.

Split from :mod:`orchestrator.sim_scenarios.presets` (whose `system_envs` is the story of
the `system_change` and `seed_story` presets). Each story is the reference and current system
of a node (login env, GPU state, packages, the variables its launcher wrapper strips) and its
changes one by one, each as the reference with only that change made, so the sim's model can
price it alone. Pure functions of a `random.Random` handed in by the caller.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass, replace

from orchestrator.sim_scenarios.presets import (
    BASE_PACKAGES,
    HARMLESS_ENV_NAMES,
    NODE_ENV,
    NOW_POWER_LIMIT_W,
    OVERLAP_ENV,
    SYNERGY_ENV,
    UNRELATED_PACKAGE_BUMP,
    plant_harmless,
)
from orchestrator.targets.sim import gpu_state
from orchestrator.targets.sim.packages import nccl_of

# The seed-like story: variables that change between sessions and that nothing reads for
# performance; not shell/session names, so a system-level isolate tests them (and must clear
# them). TOKENIZERS_PARALLELISM is one a name-based secret rule would have mistaken for a token.
SEED_HARMLESS_ENV = (
    "WANDB_PROJECT", "WANDB_RUN_GROUP", "HF_HUB_ENABLE_HF_TRANSFER", "HF_HUB_OFFLINE",
    "TRANSFORMERS_VERBOSITY", "TOKENIZERS_PARALLELISM", "PYTHONUNBUFFERED",
    "PYTHONDONTWRITEBYTECODE", "MALLOC_ARENA_MAX", "TZ", "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR", "CUDA_CACHE_PATH", "PIP_CACHE_DIR", "CONDA_DEFAULT_ENV",
    "NUMEXPR_MAX_THREADS", "TF_CPP_MIN_LOG_LEVEL", "MLFLOW_TRACKING_URI", "JOB_ID", "SLURM_JOB_NAME",
)  # fmt: skip
SEED_LOCK_MHZ = 1600  # 66% of the maximum: verify +44%, decode ~+7%
CLOCK_PAIR_LOCK_MHZ = 1900
NOW_DRIVER_VERSION = "595.45.04"
SEED_PACKAGE_BUMP = ("transformers", "4.57.3")
# The package story: the node's NCCL wheel upgraded into the sim's 2.28 regression, a harmless
# package bumped whose old wheel the node still has, one bumped without its old wheel.
NCCL_UPGRADE = ("nvidia-nccl-cu12", "2.28.3")
HARMLESS_PACKAGE_BUMP = ("xgrammar", "0.1.29")
# The story of a commit under larger system causes: a milder power cap (verify +15%) than the
# other stories' 450 W, NCCL_ALGO=Tree stripped by a launcher (+11% with the code's tuning).
POWER_STRIP_W = 500
POWER_STRIP_SESSION_VARS = 25
UNCACHED_PACKAGE_BUMP = ("safetensors", "0.7.0")


@dataclass(frozen=True)
class SystemState:
    """A node's system as a scenario records it: login env, GPU state, packages, and the
    variables its launcher wrapper strips before the server starts."""

    env: dict[str, str]
    gpus: gpu_state.GpuState
    packages: dict[str, str]
    strip: tuple[str, ...] = ()
    # (name, version) wheels the node's package cache holds (the scenario writes them to
    # `wheels/`, for `packages.find_links`).
    wheels: tuple[tuple[str, str], ...] = ()

    @property
    def server_env(self) -> dict[str, str]:
        return {k: v for k, v in self.env.items() if k not in self.strip}

    def model_gpus(self, pins: Mapping[str, str] | None = None) -> gpu_state.GpuState:
        """The GPU state as the sim's model prices it: with the NCCL version its installed
        packages (with `pins` over them, an overlay that took effect) load."""
        packages = {**self.packages, **(pins or {})}
        return replace(self.gpus, nccl_version=nccl_of(packages, self.gpus.nccl_version))


def system_story(name: str, rng: random.Random
                 ) -> tuple[SystemState, SystemState, list[tuple[dict, SystemState]]]:
    """(reference, now, changes): each change is its truth record and the reference system with
    only that change made, so the sim's model can price it alone."""
    base = dict(NODE_ENV)
    gpus = gpu_state.default_state()
    if name == "clock_pair":
        ref = SystemState(dict(base), gpus, dict(BASE_PACKAGES))
        now_gpus = gpus.with_all_gpus(power_limit_w=NOW_POWER_LIMIT_W,
                                      sm_clock_locked_mhz=CLOCK_PAIR_LOCK_MHZ)
        now = SystemState(dict(base), now_gpus, dict(BASE_PACKAGES))
        changes = [
            ({"factor": "clock", "what": "power_limit_w", "reference": 600,
              "now": NOW_POWER_LIMIT_W},
             SystemState(ref.env, gpus.with_all_gpus(power_limit_w=NOW_POWER_LIMIT_W),
                         ref.packages)),
            ({"factor": "clock", "what": "sm_clock_locked_mhz", "reference": None,
              "now": CLOCK_PAIR_LOCK_MHZ},
             SystemState(ref.env, gpus.with_all_gpus(sm_clock_locked_mhz=CLOCK_PAIR_LOCK_MHZ),
                         ref.packages)),
        ]
        return ref, now, changes
    if name == "power_limit":
        ref = SystemState(dict(base), gpus, dict(BASE_PACKAGES))
        now_gpus = gpus.with_all_gpus(power_limit_w=NOW_POWER_LIMIT_W)
        now = SystemState(dict(base), now_gpus, dict(BASE_PACKAGES))
        changes = [({"factor": "clock", "what": "power_limit_w", "reference": 600,
                     "now": NOW_POWER_LIMIT_W}, now)]
        return ref, now, changes
    if name == "launcher_strip":
        env = {**base, "NCCL_ALGO": "Tree"}
        ref = SystemState(env, gpus, dict(BASE_PACKAGES))
        now = SystemState(env, gpus, dict(BASE_PACKAGES), strip=("NCCL_ALGO",))
        changes = [({"factor": "env", "var": "NCCL_ALGO", "reference": "Tree", "now": None,
                     "how": "stripped by the node's launcher wrapper"}, now)]
        return ref, now, changes
    if name == "seed_system":
        ref_env, now_env = {**base, "NCCL_PROTO": "LL128"}, {**base, "NCCL_PROTO": "LL128"}
        plant_harmless(rng, SEED_HARMLESS_ENV, ref_env, now_env)
        ref_env, now_env = dict(sorted(ref_env.items())), dict(sorted(now_env.items()))
        bumped, version = SEED_PACKAGE_BUMP
        ref = SystemState(ref_env, gpus, dict(BASE_PACKAGES))
        now_gpus = replace(gpus.with_all_gpus(sm_clock_locked_mhz=SEED_LOCK_MHZ),
                           driver_version=NOW_DRIVER_VERSION)
        now = SystemState(now_env, now_gpus, {**BASE_PACKAGES, bumped: version},
                          strip=("NCCL_PROTO",))
        harmless_vars = sorted(k for k in set(ref_env) | set(now_env)
                               if ref_env.get(k) != now_env.get(k))
        changes = [
            ({"factor": "clock", "what": "sm_clock_locked_mhz", "reference": None,
              "now": SEED_LOCK_MHZ},
             SystemState(ref_env, gpus.with_all_gpus(sm_clock_locked_mhz=SEED_LOCK_MHZ),
                         ref.packages)),
            ({"factor": "env", "var": "NCCL_PROTO", "reference": "LL128", "now": None,
              "how": "stripped by the node's launcher wrapper"},
             SystemState(ref_env, gpus, ref.packages, strip=("NCCL_PROTO",))),
            ({"factor": "env", "vars": harmless_vars},
             SystemState({**now_env}, gpus, ref.packages)),
            ({"factor": "driver", "what": "driver_version", "reference": gpus.driver_version,
              "now": NOW_DRIVER_VERSION},
             SystemState(ref_env, replace(gpus, driver_version=NOW_DRIVER_VERSION),
                         ref.packages)),
            ({"factor": "packages", "name": bumped, "reference": BASE_PACKAGES[bumped],
              "now": version}, SystemState(ref_env, gpus, now.packages)),
        ]
        return ref, now, changes
    if name == "nccl_upgrade":
        return _nccl_upgrade(base, gpus)
    if name == "power_strip":
        return _power_strip(base, gpus, rng)
    if name in ("env_overlap", "env_synergy"):
        return _env_added(base, gpus, OVERLAP_ENV if name == "env_overlap" else SYNERGY_ENV)
    if name == "old_log":
        return _old_log(base, gpus)
    if name == "unchanged":
        same = SystemState(dict(base), gpus, dict(BASE_PACKAGES))
        return same, same, []
    raise ValueError(f"unknown system story {name!r}")


def _nccl_upgrade(base: dict[str, str], gpus: gpu_state.GpuState
                  ) -> tuple[SystemState, SystemState, list[tuple[dict, SystemState]]]:
    """Same code, same GPUs, same environment but one variable: the node's packages were
    upgraded, NCCL into the sim's 2.28 regression (verify and decode pay for every all-reduce)."""
    ref_env, now_env = {**base, "TRANSFORMERS_VERBOSITY": "warning"}, dict(base)
    bumps = (NCCL_UPGRADE, HARMLESS_PACKAGE_BUMP, UNCACHED_PACKAGE_BUMP)
    ref_pkgs = dict(BASE_PACKAGES)
    now_pkgs = {**ref_pkgs, **dict(bumps)}
    wheels = tuple((n, ref_pkgs[n]) for n, _ in bumps[:2])
    ref = SystemState(ref_env, gpus, ref_pkgs, wheels=wheels)
    now = SystemState(now_env, gpus, now_pkgs, wheels=wheels)
    changes = [({"factor": "packages", "name": n, "reference": ref_pkgs[n], "now": v,
                 "wheel": (n, ref_pkgs[n]) in wheels},
                SystemState(ref_env, gpus, {**ref_pkgs, n: v})) for n, v in bumps]
    changes.append(({"factor": "env", "var": "TRANSFORMERS_VERBOSITY", "reference": "warning",
                     "now": None}, SystemState(now_env, gpus, ref_pkgs)))
    return ref, now, changes




def _power_strip(base: dict[str, str], gpus: gpu_state.GpuState, rng: random.Random
                 ) -> tuple[SystemState, SystemState, list[tuple[dict, SystemState]]]:
    """Two system causes larger than a commit's: the power limit 600 -> 500 W, NCCL_ALGO=Tree
    stripped by a launcher; a harmless package bump and 25 shell variables beside them."""
    ref_env, now_env = {**base, "NCCL_ALGO": "Tree"}, {**base, "NCCL_ALGO": "Tree"}
    plant_harmless(rng, HARMLESS_ENV_NAMES[:POWER_STRIP_SESSION_VARS], ref_env, now_env)
    ref_env, now_env = dict(sorted(ref_env.items())), dict(sorted(now_env.items()))
    bumped, version = UNRELATED_PACKAGE_BUMP
    ref = SystemState(ref_env, gpus, dict(BASE_PACKAGES))
    capped = gpus.with_all_gpus(power_limit_w=POWER_STRIP_W)
    now = SystemState(now_env, capped, {**BASE_PACKAGES, bumped: version}, strip=("NCCL_ALGO",))
    session = sorted(k for k in set(ref_env) | set(now_env) if ref_env.get(k) != now_env.get(k))
    changes = [
        ({"factor": "clock", "what": "power_limit_w", "reference": 600, "now": POWER_STRIP_W},
         SystemState(ref_env, capped, ref.packages)),
        ({"factor": "env", "var": "NCCL_ALGO", "reference": "Tree", "now": None,
          "how": "stripped by the node's launcher wrapper"},
         SystemState(ref_env, gpus, ref.packages, strip=("NCCL_ALGO",))),
        ({"factor": "env", "vars": session}, SystemState(now_env, gpus, ref.packages)),
        ({"factor": "packages", "name": bumped, "reference": BASE_PACKAGES[bumped],
          "now": version}, SystemState(ref_env, gpus, now.packages)),
    ]
    return ref, now, changes


def _old_log(base: dict[str, str], gpus: gpu_state.GpuState
             ) -> tuple[SystemState, SystemState, list[tuple[dict, SystemState]]]:
    """The node as an old log caught it (NCCL_PROTO=LL128, and NCCL_DEBUG=INFO for the
    log's NCCL lines) and now: the power limit lowered 600 -> 450 W and both variables gone."""
    ref_env = {**base, "NCCL_PROTO": "LL128", "NCCL_DEBUG": "INFO"}
    ref = SystemState(ref_env, gpus, dict(BASE_PACKAGES))
    capped = gpus.with_all_gpus(power_limit_w=NOW_POWER_LIMIT_W)
    now = SystemState(dict(base), capped, dict(BASE_PACKAGES))
    changes = [
        ({"factor": "clock", "what": "power_limit_w", "reference": 600, "now": NOW_POWER_LIMIT_W},
         SystemState(ref_env, capped, ref.packages)),
        ({"factor": "env", "var": "NCCL_PROTO", "reference": "LL128", "now": None},
         SystemState({k: v for k, v in ref_env.items() if k != "NCCL_PROTO"}, gpus,
                     ref.packages)),
        ({"factor": "env", "var": "NCCL_DEBUG", "reference": "INFO", "now": None},
         SystemState({k: v for k, v in ref_env.items() if k != "NCCL_DEBUG"}, gpus,
                     ref.packages)),
    ]
    return ref, now, changes


def _env_added(base: dict[str, str], gpus: gpu_state.GpuState, added: Mapping[str, str]
               ) -> tuple[SystemState, SystemState, list[tuple[dict, SystemState]]]:
    """Variables set on the node since the reference; each change priced alone (whether they
    hurt alone, overlap or hurt only together is the code's `env_effects`)."""
    ref = SystemState(dict(base), gpus, dict(BASE_PACKAGES))
    now = SystemState({**base, **added}, gpus, dict(BASE_PACKAGES))
    changes = [({"factor": "env", "var": var, "reference": None, "now": value},
                SystemState({**base, var: value}, gpus, ref.packages))
               for var, value in added.items()]
    return ref, now, changes
