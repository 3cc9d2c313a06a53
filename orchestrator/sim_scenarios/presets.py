"""What a scenario plants, and the text it dresses it in.

`generate.py` owns the mechanics (placing events on a history, writing it with git fast-import,
recording the truth). This module owns the *material*: the preset definitions, the culprit
catalogue, the file tree of an SGLang-like repo and the small edits ordinary commits make to it,
commit messages and authors, the patch set, and the "reference" vs "now" system state.

Everything here is a pure function of a `random.Random` handed in by the caller, so one seed
always gives one scenario. The numbers are chosen to be detectable under the sim's noise
(every harmful effect is >= 10%) and to echo the investigation the tool automates: a +53%
verify regression with only ~8% on decode, NCCL settings worth sweeping, a lowered power limit.

Size: mostly data (the presets and the commit subjects and files they dress them in).
"""

from __future__ import annotations

import hashlib
import json
import random
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import format_datetime

from orchestrator.targets.sim import gpu_state, model, profile
from orchestrator.targets.sim.profile import FRAGMENT_DIRNAME as FRAGMENT_DIR
from orchestrator.targets.sim.profile import MULTIPLICATIVE_KEYS

# Which phase metric each profile multiplier scales; used to state planted effects per metric.
METRIC_OF_KEY = {key: key.removesuffix("_mult") + "_ms" for key in MULTIPLICATIVE_KEYS}
METRIC_OF_KEY["accept_len_mult"] = "accept_len"
SRT = "python/sglang/srt/"


# Truth arithmetic: planted effects are stated through the sim's own profile merge and model, so
# the truth cannot drift from what the server will actually do.
EAGLE_LAUNCH = model.LaunchConfig(
    tp_size=8,
    speculative_algorithm="EAGLE3",
    speculative_num_steps=2,
    speculative_eagle_topk=1,
    speculative_num_draft_tokens=3,
)  # fmt: skip  (the sim target's defaults: verify_ms and draft_ms are measured with it)
BASELINE_LAUNCH = model.LaunchConfig(tp_size=8)  # decode_ms is measured without speculation


def effects_of(
    root: Mapping, fragments: Mapping[str, Mapping] | None = None, env: Mapping[str, str] = {}
) -> profile.Effects:
    """The merged effects of a root profile plus fragments (by stem) under an environment."""
    docs = [profile.parse_fragment("sim_profile", "sim_profile.json", root)]
    for stem, doc in sorted((fragments or {}).items()):
        docs.append(profile.parse_fragment(stem, f"{FRAGMENT_DIR}/{stem}.json", doc))
    return profile.resolve_effects(docs, env)


def _pct(before: float, after: float) -> dict[str, float]:
    return {"pct": round((after / before - 1.0) * 100.0, 2) + 0.0}


def profile_effect(
    before: profile.Effects,
    after: profile.Effects,
    always: tuple[str, ...] = ("verify_ms", "decode_ms"),
) -> dict[str, dict[str, float]]:
    """Planted effect per metric between two merged profiles, in percent of `before`.

    Each multiplier scales its whole phase in the sim's model, so the percentage is exact. The
    metrics in `always` are stated even when untouched (0.0): verify_ms and decode_ms are what
    a finding is judged on; other phases appear only when their multiplier moved.
    """
    effect = {}
    for key, metric in METRIC_OF_KEY.items():
        pct = _pct(getattr(before, key), getattr(after, key))
        if pct["pct"] != 0.0 or metric in always:
            effect[metric] = pct
    return effect


def modelled_effect(
    root: Mapping,
    before: tuple[Mapping[str, str], gpu_state.GpuState],
    after: tuple[Mapping[str, str], gpu_state.GpuState],
) -> dict[str, dict[str, float]]:
    """Effect of an (env, GPU state) change per metric, as the sim's noise-free model predicts.

    For causes that are not a profile multiplier (a power cap, a dropped NCCL variable), how
    much verify and decode move depends on each phase's power draw and all-reduce share.
    """

    def phase_ms(env: Mapping[str, str], state: gpu_state.GpuState) -> dict[str, float]:
        effects = effects_of(root, env=env)
        spec = model.predict(EAGLE_LAUNCH, env, state, effects)
        base = model.predict(BASELINE_LAUNCH, env, state, effects)
        return {"verify_ms": spec.verify_ms, "decode_ms": base.decode_ms,
                "draft_ms": spec.draft_ms, "tok_s": spec.tok_s}  # fmt: skip

    old, new = phase_ms(*before), phase_ms(*after)
    return {metric: _pct(old[metric], new[metric]) for metric in old}


@dataclass(frozen=True)
class CulpritSpec:
    """A planted regression: profile multipliers are multiplied by `factors` at that commit."""

    name: str
    factors: dict[str, float]
    path: str  # the plausible source file the commit also touches
    messages: tuple[str, ...]  # ordinary-looking subjects, one drawn by seed


# fmt: off
CULPRITS = {spec.name: spec for spec in (
    CulpritSpec("verify_53", {"verify_mult": 1.53}, SRT + "speculative/eagle_worker.py", (
        "Refactor verify input preparation in EAGLE worker",
        "[Spec] Reuse draft token buffers across verify steps",
        "Simplify tree mask construction for topk=1")),
    CulpritSpec("verify_30", {"verify_mult": 1.3}, SRT + "layers/attention/flashinfer_backend.py", (
        "Use a shared workspace buffer for the flashinfer prefill wrapper",
        "[Attention] Unify extend and target-verify metadata init")),
    CulpritSpec("verify_decode", {"verify_mult": 1.25, "decode_mult": 1.08},
                SRT + "model_executor/cuda_graph_runner.py", (
        "Pad target-verify batches to captured sizes lazily",
        "[Misc] Clean up cuda graph runner batch size list")),
    CulpritSpec("verify_15", {"verify_mult": 1.15}, SRT + "speculative/eagle_utils.py", (
        "Build the verify tree mask on the host for small batches",
        "[Spec] Recompute draft positions in verify prepare")),
    CulpritSpec("decode_12", {"decode_mult": 1.12, "verify_mult": 1.1},
                SRT + "distributed/parallel_state.py", (
        "Route tp all-reduce through the communication_op helper",
        "Move group coordinator init out of the model runner")),
)}
# fmt: on

# Code that makes NCCL variables matter, planted as `env_effects` on top of the sim's own NCCL
# model (comm.py, which already prices NCCL_PROTO/ALGO/channels/P2P level): this code's fused
# all-reduce is tuned for LL128, and disabling P2P (which comm.py does not price) hurts.
NCCL_ENV_EFFECTS = (
    {"var": "NCCL_PROTO", "value": "LL128", "allreduce_mult": 0.65},  # dropping it: decode ~+8%
    {"var": "NCCL_P2P_DISABLE", "value": "1", "allreduce_mult": 1.5},
)


@dataclass(frozen=True)
class PresetSpec:
    """What one preset plants. `culprits`: catalogue names; None draws one by seed."""

    name: str
    summary: str
    culprits: tuple[str, ...] | None
    unbuildable: int = 0
    merge: bool = False
    patches: bool = False
    system_change: bool = False
    env_effects: tuple[dict, ...] = ()
    system_story: str = "power_nccl"  # which reference -> now system change (SYSTEM_STORIES)
    # What the user has besides the repository: "old_log" (a log of the server from when it
    # was fast, `sim_scenarios/old_log.py`), "live" (a long-running server to start and age,
    # `sim_scenarios/live.py`).
    extra: str = ""


# Variables set on the node since the reference that each make the verify pass leave its CUDA
# graph (either alone: verify +38%; both: +38%, not +90%), and two that do so only together.
OVERLAP_ENV = {"SGLANG_DISABLE_VERIFY_GRAPH": "1", "SGLANG_SPEC_DEBUG_SYNC": "1"}
SYNERGY_ENV = {"SGLANG_VERIFY_PAD_DYNAMIC": "1", "SGLANG_CUDA_GRAPH_MAX_BS": "16"}
OVERLAP_EFFECTS = tuple({"var": var, "value": value, "verify_cuda_graph": False}
                        for var, value in OVERLAP_ENV.items())
SYNERGY_EFFECTS = ({"var": "SGLANG_VERIFY_PAD_DYNAMIC", "value": "1",
                    "with": {"SGLANG_CUDA_GRAPH_MAX_BS": "16"}, "verify_cuda_graph": False},)

# fmt: off
PRESETS = {spec.name: spec for spec in (
    PresetSpec("one_culprit", "one culprit commit among look-alikes", None),
    PresetSpec("two_culprits", "a verify culprit and a later decode culprit, with a merged "
               "side branch", ("verify_30", "decode_12"), unbuildable=1, merge=True),
    PresetSpec("unbuildable", "one culprit plus three unbuildable commits away from it", None,
               unbuildable=3),
    PresetSpec("system_change", "no culprit in range: power limit lowered and NCCL_PROTO "
               "dropped since the reference", (), system_change=True,
               env_effects=NCCL_ENV_EFFECTS),
    PresetSpec("patch_set", "twelve local patches: one harmful alone, one pair harmful only "
               "together", (), patches=True),
    PresetSpec("seed_story", "a +53% verify culprit, a system-level change and NCCL settings "
               "worth sweeping", ("verify_53",), unbuildable=1, system_change=True,
               env_effects=NCCL_ENV_EFFECTS),
    PresetSpec("clock_pair", "no culprit in range: power limit 600 -> 450 W and an SM clock "
               "lock at 1900 MHz, both set from outside since the reference", (),
               system_change=True, system_story="clock_pair"),
    PresetSpec("power_commit", "a +30% verify culprit, and the power limit lowered 600 -> "
               "450 W since the reference", ("verify_30",), system_change=True,
               system_story="power_limit"),
    PresetSpec("power_only", "no culprit in range: the power limit lowered 600 -> 450 W from"
               " outside since the reference, nothing else", (), system_change=True,
               system_story="power_limit"),
    PresetSpec("launcher_strip", "no culprit in range: NCCL_ALGO=Tree is in the node's "
               "environment, and a launcher wrapper now strips it before the server", (),
               system_change=True, system_story="launcher_strip",
               env_effects=({"var": "NCCL_ALGO", "value": "Tree", "allreduce_mult": 0.4},)),
    PresetSpec("seed_system", "no culprit in range: an outside SM clock lock, NCCL_PROTO "
               "stripped by a launcher, 20 harmless env differences, a driver and a package "
               "bump", (), system_change=True, system_story="seed_system",
               env_effects=({"var": "NCCL_PROTO", "value": "LL128", "allreduce_mult": 0.3},)),
    PresetSpec("code_under_system", "a +15% verify culprit under larger system causes: power "
               "limit 600 -> 500 W (+15%), NCCL_ALGO=Tree stripped by a launcher (+11%), a "
               "harmless package bump and 25 shell variables", ("verify_15",),
               system_change=True, system_story="power_strip",
               env_effects=({"var": "NCCL_ALGO", "value": "Tree", "allreduce_mult": 0.25},)),
    PresetSpec("env_overlap", "no culprit in range: two variables set on the node since the "
               "reference, each alone forcing verify eager (+38%), both together +38% too", (),
               system_change=True, system_story="env_overlap", env_effects=OVERLAP_EFFECTS),
    PresetSpec("env_synergy", "no culprit in range: two variables set on the node since the "
               "reference that force verify eager only together (+38%)", (),
               system_change=True, system_story="env_synergy", env_effects=SYNERGY_EFFECTS),
    PresetSpec("old_log", "only an old log: no sleuth run from when it was fast, its server log"
               " (NCCL_DEBUG=INFO, a custom verify line) in old_logs/; since then the power"
               " limit went 600 -> 450 W and NCCL_PROTO and NCCL_DEBUG were dropped", (),
               system_change=True, system_story="old_log", env_effects=NCCL_ENV_EFFECTS,
               extra="old_log"),
    PresetSpec("server_state", "slow after days, fine after a restart: the code and the node"
               " did not change; a long-running server's state (requests served) makes it"
               " slower, and apply=live starts and ages one", (), system_change=True,
               system_story="unchanged", extra="live"),
    PresetSpec("nccl_upgrade", "no culprit in range: the node's NCCL wheel went 2.27.5 -> 2.28.3"
               " (slower all-reduce), two harmless package bumps and a changed variable; the"
               " old wheels are in wheels/", (), system_change=True, system_story="nccl_upgrade"),
)}
ONE_CULPRIT_CHOICES = ("verify_53", "verify_30", "verify_decode")

# People and words.
AUTHORS = (  # (name, GitHub handle, timezone)
    ("Lianmin Qiao", "lqiao", "+0800"), ("Mara Okonkwo", "mokonkwo", "-0700"),
    ("Yichen Duan", "ycduan", "+0800"), ("Tomasz Wierzba", "twierzba", "+0100"),
    ("Priya Raghunathan", "praghu", "+0530"), ("Kenji Morimoto", "kmorimoto", "+0900"),
    ("Sofia Haddad", "shaddad", "-0400"), ("Baizhou Lin", "bzlin", "+0800"),
    ("Daniel Ferreira", "dferreira", "-0300"), ("Hye-jin Park", "hjpark", "+0900"),
    ("Arjun Mehta", "amehta", "-0800"), ("Elena Volkova", "evolkova", "+0200"),
    ("Qiaolin Yu", "qlyu", "+0800"), ("Noah Brennan", "nbrennan", "-0500"),
    ("Xinyuan Tong", "xytong", "+0800"), ("Fatima Zahra Idrissi", "fzidrissi", "+0100"),
)
GITHUB_COMMITTER = ("GitHub", "noreply@github.com", "+0000")

AREAS = {  # area: (files, "[Tag]" scopes, what a commit works on)
    "spec": ((SRT + "speculative/eagle_worker.py", SRT + "speculative/eagle_utils.py",
              SRT + "speculative/spec_info.py"), ("Spec", "EAGLE"),
             ("draft token allocation", "EAGLE3 hidden-state capture", "tree mask for topk > 1",
              "accept length metrics", "draft extend after verify", "NEXTN draft weight loading",
              "speculative decoding with chunked prefill")),
    "attention": ((SRT + "layers/attention/flashinfer_backend.py",
                   SRT + "layers/attention/triton_backend.py"), ("Attention", "FlashInfer"),
                  ("sliding window metadata", "kv indices for paged prefill", "mla absorb path",
                   "decode wrapper planning", "workspace sizing")),
    "cuda_graph": ((SRT + "model_executor/cuda_graph_runner.py",), ("CUDA Graph", "Runner"),
                   ("capture batch sizes", "graph memory pool reuse", "capture progress logging",
                    "padding of replayed batches")),
    "runner": ((SRT + "model_executor/model_runner.py",
                SRT + "model_executor/forward_batch_info.py"), ("Runner", "Core"),
               ("memory profiling", "forward mode dispatch", "weight update path", "dp attention")),
    "dist": ((SRT + "distributed/parallel_state.py",
              SRT + "distributed/device_communicators/pynccl.py",
              SRT + "distributed/device_communicators/custom_all_reduce.py"), ("Distributed", "NCCL"),
             ("custom all-reduce on PCIe", "pynccl group init", "symmetric memory buffers",
              "tp group teardown")),
    "sched": ((SRT + "managers/scheduler.py", SRT + "managers/tokenizer_manager.py"),
              ("Scheduler", "Misc"),
              ("retract decode", "overlap schedule", "abort handling", "priority scheduling",
               "metrics collection")),
    "models": ((SRT + "models/deepseek_v2.py", SRT + "models/kimi_k25.py", SRT + "models/qwen3_moe.py",
                SRT + "layers/moe/fused_moe_triton/layer.py"), ("Model", "MoE"),
               ("shared experts fusion", "weight loading", "expert routing", "fp8 block scales")),
    "args": ((SRT + "server_args.py",), ("Args", "Misc"),
             ("speculative defaults", "attention backend selection", "deprecated flags")),
    "docs": (("README.md", "docs/advanced_features/speculative_decoding.md",
              "docs/references/environment_variables.md"), ("Doc", "Docs"),
             ("speculative decoding guide", "environment variables", "install steps", "typos")),
    "tests": (("test/srt/test_eagle_infer.py", "test/srt/test_cuda_graph.py",
               "test/srt/run_suite.py"), ("CI", "Test"),
              ("flaky eagle test", "test timeouts", "suite partition", "nightly accuracy check")),
    "ci": ((".github/workflows/pr-test.yml", "python/pyproject.toml"), ("CI", "Build"),
           ("runner labels", "dependency pins", "wheel build", "cache keys")),
}
VERBS = (  # verb and the subject prefixes that go with it ("" = none) for code areas
    ("Fix", ("[Fix] ", "[Bugfix] ", "")), ("Support", ("[Feature] ", "feat: ", "")),
    ("Refactor", ("[Refactor] ", "")), ("Clean up", ("[Misc] ", "chore: ", "")),
    ("Optimize", ("[Perf] ", "perf: ", "")), ("Add tests for", ("[CI] ", "test: ", "")),
    ("Simplify", ("", "refactor: ")), ("Handle errors in", ("[Fix] ", "")),
)
AREA_VERBS = {  # areas where code verbs read wrong ("Optimize typos")
    "docs": (("Update", ("[Doc] ", "docs: ", "")), ("Fix", ("[Doc] ", "docs: ")),
             ("Clarify", ("[Doc] ", ""))),
    "tests": (("Fix", ("[CI] ", "test: ", "")), ("Stabilize", ("[CI] ", "")),
              ("Update", ("[CI] ", "test: "))),
    "ci": (("Update", ("[CI] ", "ci: ", "")), ("Fix", ("[CI] ", "ci: ")), ("Bump", ("[CI] ", ""))),
}
LOOKALIKE_SOURCE_MESSAGES = (  # perf-sounding changes to the suspicious files, no effect
    (SRT + "speculative/eagle_worker.py", "perf: avoid a host sync in EAGLE verify"),
    (SRT + "speculative/eagle_worker.py", "[Perf] Reuse verify logits buffer"),
    (SRT + "model_executor/cuda_graph_runner.py",
     "[Perf] Reduce cuda graph replay overhead for target verify"),
    (SRT + "model_executor/cuda_graph_runner.py", "perf: capture verify graphs once"),
    (SRT + "layers/attention/flashinfer_backend.py",
     "perf: plan flashinfer verify wrapper ahead of replay"),
)
LOOKALIKE_PROFILE_MESSAGES = (  # change the profile's bytes, not its meaning
    "Tune speculative verify defaults for Kimi-K2.5",
    "perf: make phase multipliers explicit in the perf profile",
    "chore: normalize perf profile formatting", "[Perf] Revisit verify path tuning knobs",
)
UNBUILDABLE_CHANGES = (  # (file, breaking subject, import error, fixing subject)
    (SRT + "layers/attention/__init__.py", "Move attention backend registry into its own module",
     "ImportError: cannot import name 'ATTENTION_BACKENDS' from "
     "'sglang.srt.layers.attention.registry'", "Fix missing import after attention registry move"),
    (SRT + "managers/io_struct.py", "Split io_struct request types by endpoint",
     "ImportError: cannot import name 'GenerateReqInput' from 'sglang.srt.managers.io_struct'",
     "Re-export GenerateReqInput from io_struct"),
    (SRT + "utils/common.py", "Drop legacy helpers from utils.common",
     "ImportError: cannot import name 'get_bool_env_var' from 'sglang.srt.utils.common'",
     "Restore get_bool_env_var for downstream imports"),
)
# fmt: on


def author_email(handle: str) -> str:
    """GitHub's no-reply form, with a stable numeric id derived from the handle."""
    return f"{zlib.crc32(handle.encode()) % 90000000 + 10000000}+{handle}@users.noreply.github.com"


# The file tree and the edits ordinary commits make.
LICENSE_HEADER = (
    "# Copyright 2023-2025 SGLang Team\n"
    '# Licensed under the Apache License, Version 2.0 (the "License");\n'
    "# you may not use this file except in compliance with the License.\n"
)
WORDS = (
    "batch", "tokens", "draft", "verify", "graph", "buffer", "kv", "indices", "stream", "rank",
    "group", "seq_lens", "positions", "logits", "hidden", "topk", "accept", "pool", "cache",
)  # fmt: skip


def python_file(path: str, rng: random.Random) -> str:
    """A plausible module: header, docstring, tunable constants, a class with a forward()."""
    stem = path.rsplit("/", 1)[-1].removesuffix(".py")
    class_name = "".join(part.capitalize() for part in stem.split("_"))
    constants = "".join(
        f"_{word.upper()}_{kind} = {rng.choice((8, 16, 32, 48, 64, 128, 256))}\n"
        for word, kind in zip(rng.sample(WORDS, 3), ("LIMIT", "SIZE", "STEPS"), strict=True)
    )
    return (
        f'{LICENSE_HEADER}"""{stem.replace("_", " ").capitalize()} for the SGLang runtime."""\n\n'
        "from __future__ import annotations\n\nimport logging\nfrom typing import Optional\n\n"
        "import torch\n\nlogger = logging.getLogger(__name__)\n\n"
        f"{constants}\n\nclass {class_name}:\n"
        "    def __init__(self, server_args, model_runner):\n"
        "        self.server_args = server_args\n"
        "        self.model_runner = model_runner\n"
        "        self.device = model_runner.device\n\n"
        "    def forward(self, forward_batch, skip_attn_backend_init: bool = False):\n"
        "        return self.model_runner.forward(forward_batch, skip_attn_backend_init)\n"
    )


def text_file(path: str) -> str:
    if path.endswith(".md"):
        title = path.rsplit("/", 1)[-1].removesuffix(".md").replace("_", " ").title()
        return f"# {title}\n\nSGLang is a fast serving framework for large language models.\n"
    if path.endswith(".toml"):
        return (
            '[project]\nname = "sglang"\ndynamic = ["version"]\nrequires-python = ">=3.10"\n'
            'dependencies = [\n    "flashinfer_python==0.6.3",\n    "torch==2.9.1",\n]\n'
        )
    if path.endswith(".yml"):
        return "name: PR Test\non:\n  pull_request:\njobs:\n  unit-test:\n    runs-on: 1-gpu\n"
    return "Apache License\nVersion 2.0, January 2004\n"


def initial_tree(rng: random.Random) -> dict[str, str]:
    """Every file of the repo at its first commit (the profile is added by the caller)."""
    paths = {path for files, _, _ in AREAS.values() for path in files}
    paths |= {path for path, *_ in UNBUILDABLE_CHANGES} | {"LICENSE", "python/sglang/__init__.py"}
    tree = {"python/sglang/version.py": '__version__ = "0.5.7"\n'}
    for path in sorted(paths):
        tree[path] = python_file(path, rng) if path.endswith(".py") else text_file(path)
    return dict(sorted(tree.items()))


def edit_content(path: str, content: str, rng: random.Random, topic: str) -> str:
    """One small, plausible change: a new helper, a tuned constant, a note, a doc line."""
    if path.endswith(".py"):
        lines = content.splitlines(keepends=True)
        constant_rows = [
            i for i, line in enumerate(lines) if line.startswith("_") and " = " in line
        ]
        if constant_rows and rng.random() < 0.35:
            row = rng.choice(constant_rows)
            name, old = lines[row].rstrip("\n").split(" = ")
            new = rng.choice([v for v in (4, 8, 16, 24, 32, 48, 64, 96, 160, 256) if str(v) != old])
            lines[row] = f"{name} = {new}\n"
            return "".join(lines)
        a, b = rng.sample(WORDS, 2)
        return content + (
            f"\n\ndef _{a}_{b}_{rng.randrange(10, 99)}(forward_batch, limit: int = "
            f"{rng.choice((8, 16, 32, 64))}) -> int:\n"
            f'    """Helper for {topic}."""\n'
            f"    if forward_batch is None or forward_batch.{a} is None:\n"
            "        return limit\n"
            f"    return min(limit, int(forward_batch.{a}.shape[0]))\n"
        )
    if path.endswith((".toml", ".yml")):
        return content + f"# {topic}\n"
    return content + f"\n- Notes on {topic}.\n"


# Patches (the `patches` factor): each adds one `sim_profile.d/<stem>.json` fragment.
PATCH_SUBJECTS = (
    ("nccl-min-channels", "nccl: set NCCL_MIN_NCHANNELS for PCIe tp8"),
    ("flashinfer-workspace", "flashinfer: larger prefill workspace for verify"),
    ("eagle-hidden-copy", "eagle: skip redundant hidden-state copy in draft extend"),
    ("cuda-graph-bs48", "cuda graph: capture batch sizes up to 48 for speculative decoding"),
    ("sched-accept-log", "scheduler: log spec accept length per batch"),
    ("moe-triton-config", "moe: tuned fused_moe triton config for RTX PRO 6000"),
    ("attn-tensor-cores", "attention: enable tensor cores for the decode wrapper"),
    ("decode-log-interval", "server: default --decode-log-interval 10 for profiling"),
    ("verify-timing", "eagle: per-step verify timing instrumentation"),
    ("pynccl-draft-comm", "dist: reuse the pynccl communicator for the draft model"),
    ("kimi-shared-gate", "kimi-k2.5: fuse the shared expert gate"),
    ("chat-template-cache", "tokenizer: cache the compiled chat template"),
)
NEUTRAL_FRAGMENTS = (
    {"verify_mult": 1.0}, {"decode_mult": 1.0, "draft_mult": 1.0}, {"allreduce_mult": 1.0},
    {"prefill_mult": 1.0}, {"accept_len_mult": 1.0}, {"verify_ms_add": 0.0},
    {"verify_cuda_graph": True}, {"draft_mult": 1.0},
)  # fmt: skip
HARMFUL_PATCH_FACTORS = {"verify_mult": 1.22}
PAIR_PATCH_FACTORS = ({"verify_mult": 1.18}, {"decode_mult": 1.1})


@dataclass(frozen=True)
class PatchSpec:
    """One patch file: the fragment it adds and its role in the truth."""

    filename: str
    stem: str
    subject: str
    fragment: dict
    role: str  # "harmful" | "pair" | "harmless"


def patch_specs(rng: random.Random) -> list[PatchSpec]:
    """Twelve patches; which one is harmful and which two form the pair is drawn from the seed.

    Each pair member `requires` the other, so either alone changes nothing: only isolating
    subsets (not one-at-a-time reverts) can find it.
    """
    harmful, pair_a, pair_b = rng.sample(range(len(PATCH_SUBJECTS)), 3)
    stems = [f"{i + 1:02d}-{slug}" for i, (slug, _) in enumerate(PATCH_SUBJECTS)]
    specs = []
    for i, (_, subject) in enumerate(PATCH_SUBJECTS):
        if i == harmful:
            fragment, role = dict(HARMFUL_PATCH_FACTORS), "harmful"
        elif i in (pair_a, pair_b):
            other, factors = (pair_b, 0) if i == pair_a else (pair_a, 1)
            fragment, role = {"requires": [stems[other]], **PAIR_PATCH_FACTORS[factors]}, "pair"
        else:
            fragment, role = dict(rng.choice(NEUTRAL_FRAGMENTS)), "harmless"
        specs.append(PatchSpec(f"{stems[i]}.patch", stems[i], subject, fragment, role))
    return specs


def patch_text(spec: PatchSpec, author: tuple[str, str, str], when: int) -> str:
    """A `git format-patch`-style patch adding one fragment; applies with `git apply`/`git am`."""
    body = render_json(spec.fragment).splitlines()
    blob = hashlib.sha1(
        f"blob {sum(len(line) + 1 for line in body)}\0".encode()
        + "".join(line + "\n" for line in body).encode()
    ).hexdigest()
    path = f"{FRAGMENT_DIR}/{spec.stem}.json"
    name, email, _ = author
    fake_commit = hashlib.sha1(f"{spec.stem}:{when}".encode()).hexdigest()
    date = format_datetime(datetime.fromtimestamp(when, UTC))
    hunk = f"@@ -0,0 +1,{len(body)} @@" if len(body) > 1 else "@@ -0,0 +1 @@"
    return (
        f"From {fake_commit} Mon Sep 17 00:00:00 2001\nFrom: {name} <{email}>\nDate: {date}\n"
        f"Subject: [PATCH] {spec.subject}\n\n---\n {path} | {len(body)} {'+' * len(body)}\n"
        f" 1 file changed, {len(body)} insertion{'s' if len(body) > 1 else ''}(+)\n"
        f" create mode 100644 {path}\n\ndiff --git a/{path} b/{path}\nnew file mode 100644\n"
        f"index 0000000..{blob[:7]}\n--- /dev/null\n+++ b/{path}\n{hunk}\n"
        + "".join(f"+{line}\n" for line in body)
        + "-- \n2.39.5\n\n"
    )


# System state: "reference" (when it was fast) and "now".
BASE_PACKAGES = {
    "sglang": "0.5.9", "sgl-kernel": "0.3.21", "flashinfer-python": "0.6.3", "torch": "2.9.1",
    "triton": "3.5.1", "transformers": "4.57.1", "nvidia-nccl-cu12": "2.27.5",
    "nvidia-cublas-cu12": "12.8.4.1", "xgrammar": "0.1.27", "numpy": "2.3.4",
    "fastapi": "0.121.1", "uvicorn": "0.38.0", "pydantic": "2.12.4", "pyzmq": "27.1.0",
    "safetensors": "0.6.2", "huggingface-hub": "0.36.0", "rich": "13.9.4", "tqdm": "4.67.1",
}  # fmt: skip
UNRELATED_PACKAGE_BUMP = ("rich", "14.2.0")
HARMLESS_ENV_NAMES = (
    "SSH_CLIENT", "SSH_CONNECTION", "SSH_TTY", "TERM_SESSION_ID", "OLDPWD", "SHLVL", "TMUX_PANE",
    "WINDOWID", "XDG_SESSION_ID", "DBUS_SESSION_BUS_ADDRESS", "LS_COLORS", "HISTSIZE",
    "HISTCONTROL", "LESSOPEN", "EDITOR", "PAGER", "MAIL", "COLORTERM", "TERM_PROGRAM",
    "TERM_PROGRAM_VERSION", "VSCODE_IPC_HOOK_CLI", "GIT_ASKPASS", "PROMPT_COMMAND", "STARSHIP_SHELL",
    "LC_TERMINAL", "LC_TERMINAL_VERSION", "WANDB_RUN_GROUP", "HF_HUB_ENABLE_HF_TRANSFER",
    "MOTD_SHOWN", "_",
)  # fmt: skip
NOW_POWER_LIMIT_W = 450  # reference: the stock 600 W of the sim's default GPU state


# A node's login environment, the same then and now.
NODE_ENV = {
    "HOME": "/home/infer", "USER": "infer", "LANG": "C.UTF-8", "TERM": "xterm-256color",
    "PATH": "/usr/local/cuda/bin:/usr/local/bin:/usr/bin:/bin", "HF_HOME": "/data/hf",
    "CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7", "NCCL_IB_DISABLE": "1",
}  # fmt: skip


def system_envs(rng: random.Random) -> tuple[dict[str, str], dict[str, str]]:
    """Reference and now env: NCCL_PROTO dropped, 30 harmless variables changed."""
    reference = {**NODE_ENV, "NCCL_PROTO": "LL128"}
    now = {k: v for k, v in reference.items() if k != "NCCL_PROTO"}
    plant_harmless(rng, HARMLESS_ENV_NAMES, reference, now)
    return dict(sorted(reference.items())), dict(sorted(now.items()))


def plant_harmless(rng: random.Random, names: tuple[str, ...], reference: dict, now: dict) -> None:
    """Change `names` between the two environments: a third set only then, a third only now,
    a third with another value. Boolean-looking names get boolean values."""
    for i, name in enumerate(names):
        old, new = f"{name.lower()}-{rng.randrange(1000, 9999)}", f"{name.lower()}-{i}-now"
        if name == "TOKENIZERS_PARALLELISM":
            old, new = "true", "false"
        if i % 3 == 0:  # set only then
            reference[name] = old
        elif i % 3 == 1:  # set only now
            now[name] = new
        else:  # value changed
            reference[name], now[name] = old, new


def system_packages() -> tuple[dict[str, str], dict[str, str]]:
    name, version = UNRELATED_PACKAGE_BUMP
    return dict(BASE_PACKAGES), {**BASE_PACKAGES, name: version}


def render_json(doc: object, indent: int = 2, sort_keys: bool = False) -> str:
    return json.dumps(doc, indent=indent, sort_keys=sort_keys) + "\n"
