"""Generate a scenario: an SGLang-like git repo with planted causes, and the truth beside it.

Tests and the demo need a repo whose answer is known: which commit made verify slower, which
commits cannot be built, which patch (or pair of patches) hurts, what changed on the system.
The sim server reads its behaviour from the checked-out `sim_profile.json` (plus
`sim_profile.d/*.json` fragments), its environment and a GPU state file, so planting a cause
means changing those inputs at a known point and recording where in `truth.json`.

Layout of `out/`: `repo/` (the git repo, checked out at HEAD), `truth.json`, `patches/` (when
the preset has them) and, for system-level presets,
`{reference,now}_{env,gpu_state,packages,launcher}.json`.

The history is written with one `git fast-import` process fed a single stream (1000 commits
take well under a second of git time); author and committer dates come from the seed, so the
same (preset, commits, seed) always gives the same SHAs.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from orchestrator.errors import SleuthError, UserError
from orchestrator.sim_scenarios import presets as material
from orchestrator.sim_scenarios.git_repo import write_repo
from orchestrator.sim_scenarios.presets import (
    effects_of,
    profile_effect,
)
from orchestrator.sim_scenarios.side_files import write_patches, write_system
from orchestrator.targets.sim.profile import ADDITIVE_KEYS, MULTIPLICATIVE_KEYS

MIN_COMMITS = 20
MAX_COMMITS = 2000
DEFAULT_PRESET = "one_culprit"
PRESETS = tuple(material.PRESETS)
PROFILE_PATH = "sim_profile.json"
GOOD_TAG = "v0.5.8"
SIDE_BRANCH_COMMITS = 3


class ScenarioInputError(UserError, ValueError):
    """Bad request for a scenario: a ValueError for callers, exit 2 for the CLI."""


@dataclass(frozen=True)
class Scenario:
    """A generated scenario: where it lives and what was planted."""

    out: Path
    repo: Path
    truth: dict


@dataclass(frozen=True)
class _Commit:
    mark: int
    parents: tuple[int, ...]
    author: tuple[str, str, str]  # name, email, tz
    committer: tuple[str, str, str]
    author_time: int
    commit_time: int
    message: str
    changes: tuple[tuple[str, str], ...]  # (path, full new content)
    kind: str
    index: int | None  # first-parent position relative to good; None on the side branch


# ---------------------------------------------------------------------------------------------
# Input checks.


def validate_request(out: Path, commits: int, seed: int, preset: str) -> None:
    """Raise ScenarioInputError (a ValueError) with one clear sentence for any bad input."""
    if isinstance(commits, bool) or not isinstance(commits, int):
        raise ScenarioInputError(f"commits must be an integer, got {commits!r}.")
    if not MIN_COMMITS <= commits <= MAX_COMMITS:
        raise ScenarioInputError(
            f"commits must be between {MIN_COMMITS} and {MAX_COMMITS}, got {commits}."
        )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ScenarioInputError(f"seed must be an integer, got {seed!r}.")
    if preset not in material.PRESETS:
        raise ScenarioInputError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}.")
    out = Path(out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ScenarioInputError(f"output path {out} already exists and is not an empty directory.")


# ---------------------------------------------------------------------------------------------
# Planning: where each planted event sits on the first-parent line.


def _pick(rng: random.Random, candidate_lists: list[list[int]]) -> int:
    """First non-empty candidate list wins: constraints relax in order until something fits."""
    for candidates in candidate_lists:
        if candidates:
            return rng.choice(candidates)
    raise SleuthError("internal error: no room left to place a planted commit")


def _place_events(
    spec: material.PresetSpec, culprits: list[str], rng: random.Random, first: int, last: int
) -> dict[int, tuple]:
    """Map first-parent positions (first..last) to planted events; the rest are ordinary."""
    events: dict[int, tuple] = {}
    span = range(first, last + 1)

    def free(pos: int) -> bool:
        return first <= pos <= last and pos not in events

    interior = [p for p in span if first < p < last]
    positions: list[int] = []
    for _ in culprits:
        spaced = [p for p in interior if free(p) and all(abs(p - q) >= 3 for q in positions)]
        positions.append(_pick(rng, [spaced, [p for p in interior if free(p)]]))
        events[positions[-1]] = ("culprit",)
    for pos, name in zip(sorted(positions), culprits, strict=True):
        events[pos] = ("culprit", name)

    def isolated_pair(p: int, distance: int) -> bool:
        """p (broken) and p + 1 (fix) are free, bad stays buildable, nothing planted nearby."""
        return (
            free(p) and free(p + 1) and p + 1 < last
            and all(free(q) for q in (p - 1, p + 2) if first <= q <= last)
            and all(min(abs(p - c), abs(p + 1 - c)) >= distance for c in positions)
        )  # fmt: skip

    for change in rng.sample(range(len(material.UNBUILDABLE_CHANGES)), spec.unbuildable):
        tiers = [[p for p in span if isolated_pair(p, distance)] for distance in (3, 2, 1)]
        tiers.append([p for p in span if free(p) and free(p + 1) and p + 1 <= last])
        pos = _pick(rng, tiers)
        events[pos], events[pos + 1] = ("unbuildable", change), ("fix", change)

    if spec.merge:
        far = [
            p for p in span if free(p) and p > first + 1 and all(abs(p - c) >= 2 for c in positions)
        ]
        events[_pick(rng, [far, [p for p in span if free(p) and p > first]])] = ("merge",)

    room = [p for p in span if free(p)]
    n_lookalikes = min(max(3, (last - first) // 12), 80, len(room) // 2)
    for pos in sorted(rng.sample(room, n_lookalikes)):
        events[pos] = ("lookalike", rng.choice(("source", "source", "profile")))
    return events


# ---------------------------------------------------------------------------------------------
# Building the history.


class _History:
    """Accumulates commits: the current tree, profile document, clock and PR counter."""

    def __init__(self, rng: random.Random, profile: dict) -> None:
        self.rng = rng
        self.tree = material.initial_tree(rng)
        self.profile = profile
        self.indent, self.sort_keys = 2, False
        self.tree[PROFILE_PATH] = self.render_profile()
        self.commits: list[_Commit] = []
        self.clock = 1751328000 + rng.randrange(0, 90 * 86400)  # from 2025-07-01 UTC
        self.pr = rng.randrange(9000, 14000)

    def render_profile(self) -> str:
        return material.render_json(self.profile, self.indent, self.sort_keys)

    def edit(self, path: str, subject: str) -> tuple[str, str]:
        """Edit a file; `subject` (a commit subject or its object) becomes the change's topic."""
        topic = re.sub(r"^(\[[^]]*\] |[a-z]+: )", "", subject)
        topic = topic[0].lower() + topic[1:] if topic[:2].istitle() else topic
        self.tree[path] = material.edit_content(path, self.tree.get(path, ""), self.rng, topic)
        return path, self.tree[path]

    def profile_change(self) -> tuple[str, str]:
        self.tree[PROFILE_PATH] = self.render_profile()
        return PROFILE_PATH, self.tree[PROFILE_PATH]

    def add(
        self,
        message: str,
        changes: list[tuple[str, str]],
        kind: str,
        index: int | None,
        parents: tuple[int, ...],
        squash: bool | None = None,
    ) -> int:
        rng = self.rng
        name, handle, tz = rng.choice(material.AUTHORS)
        email = material.author_email(handle)
        self.clock += rng.randint(10 * 60, 6 * 3600)
        squash = rng.random() < 0.85 if squash is None else squash
        if squash:  # squash-merged pull request: GitHub commits, the author wrote it earlier
            self.pr += rng.randint(1, 40)
            message = f"{message} (#{self.pr})"
            committer = material.GITHUB_COMMITTER
            author_time = self.clock - rng.randint(0, 3 * 86400)
        else:
            committer, author_time = (name, email, tz), self.clock
        mark = len(self.commits) + 1
        author = (name, email, tz)
        self.commits.append(_Commit(mark, parents, author, committer, author_time, self.clock,
                                    message, tuple(changes), kind, index))  # fmt: skip
        return mark

    def ordinary(self) -> tuple[str, list[tuple[str, str]]]:
        rng = self.rng
        area = rng.choice(list(material.AREAS))
        paths, scopes, objects = material.AREAS[area]
        verb, prefixes = rng.choice(material.AREA_VERBS.get(area, material.VERBS))
        thing = rng.choice(objects)
        prefix = rng.choice(prefixes + (f"[{rng.choice(scopes)}] ",))
        message = f"{prefix}{verb.lower() if prefix.endswith(': ') else verb} {thing}"
        changes = [self.edit(rng.choice(paths), thing)]
        if area not in material.AREA_VERBS and rng.random() < 0.3:
            changes.append(self.edit(rng.choice(material.AREAS["tests"][0]), thing))
        return message, changes


def _plan_history(
    spec: material.PresetSpec, n_commits: int, rng: random.Random
) -> tuple[_History, int, int, dict[int, tuple], list[dict]]:
    """Build every commit in memory. Returns (history, good mark, good pos, events, culprits)."""
    side_len = SIDE_BRANCH_COMMITS if spec.merge else 0
    n_first_parent = n_commits - side_len
    good_pos, last = max(1, n_first_parent // 20), n_first_parent - 1
    if spec.culprits is None:
        culprits = [rng.choice(material.ONE_CULPRIT_CHOICES)]
    else:
        culprits = list(spec.culprits)
    events = _place_events(spec, culprits, rng, good_pos + 1, last)

    history = _History(rng, _initial_profile(spec))
    planted: list[dict] = []
    marks_by_pos: dict[int, int] = {}
    for pos in range(n_first_parent):
        parents = (marks_by_pos[pos - 1],) if pos else ()
        index = pos - good_pos
        event = events.get(pos, ("ordinary",))
        kind = event[0]
        if pos == 0:
            changes = sorted(history.tree.items())
            mark = history.add("Initial commit", changes, "root", index, parents, squash=False)
        elif pos == good_pos:
            changes = [("python/sglang/version.py", f'__version__ = "{GOOD_TAG[1:]}"\n')]
            history.tree.update(changes)
            mark = history.add(f"Release {GOOD_TAG}", changes, "good", index, parents, True)
        elif kind == "culprit":
            culprit = material.CULPRITS[event[1]]
            before = effects_of(history.profile)
            for key, factor in culprit.factors.items():
                history.profile[key] = round(history.profile.get(key, 1.0) * factor, 6)
            message = rng.choice(culprit.messages)
            changes = [history.edit(culprit.path, message), history.profile_change()]
            mark = history.add(message, changes, kind, index, parents)
            effect = profile_effect(before, effects_of(history.profile))
            planted.append({"mark": mark, "name": culprit.name, "effect": effect})
        elif kind in ("unbuildable", "fix"):
            path, message, error, fix_message = material.UNBUILDABLE_CHANGES[event[1]]
            if kind == "unbuildable":
                history.profile["import_error"] = error
            else:
                history.profile.pop("import_error", None)
                message = fix_message
            changes = [history.edit(path, message), history.profile_change()]
            mark = history.add(message, changes, kind, index, parents)
        elif kind == "lookalike" and event[1] == "source":
            path, message = rng.choice(material.LOOKALIKE_SOURCE_MESSAGES)
            mark = history.add(message, [history.edit(path, message)], kind, index, parents)
        elif kind == "lookalike":
            _neutral_profile_edit(history)
            message = rng.choice(material.LOOKALIKE_PROFILE_MESSAGES)
            changes = [history.edit("python/sglang/srt/server_args.py", message)]
            mark = history.add(message, changes + [history.profile_change()], kind, index, parents)
        elif kind == "merge":
            fork = marks_by_pos[max(0, pos - rng.randint(2, 6))]
            handle = rng.choice(material.AUTHORS)[1]
            side_files = []
            for i in range(side_len):
                path = f"docs/advanced_features/hierarchical_cache_{i + 1}.md"
                history.tree[path] = f"# Hierarchical cache, part {i + 1}\n\nHost-memory KV tier.\n"
                side_files.append((path, history.tree[path]))
                message = f"[Doc] Hierarchical cache guide, part {i + 1}"
                fork = history.add(message, [side_files[-1]], "side", None, (fork,), False)
            message = f"Merge pull request #{history.pr + 1} from {handle}/hicache-docs"
            mark = history.add(message, side_files, kind, index, parents + (fork,), False)
        else:
            message, changes = history.ordinary()
            mark = history.add(message, changes, kind, index, parents)
        marks_by_pos[pos] = mark
    return history, marks_by_pos[good_pos], good_pos, events, planted


def _neutral_profile_edit(history: _History) -> None:
    """Change the profile's bytes but not its meaning: reformat, or add/drop a neutral key."""
    rng, profile = history.rng, history.profile
    neutral = {key: 1.0 for key in MULTIPLICATIVE_KEYS if key not in profile or profile[key] == 1.0}
    neutral.update({key: 0.0 for key in ADDITIVE_KEYS if profile.get(key, 0.0) == 0.0})
    choice = rng.choice(("indent", "sort", "key", "key"))
    if choice == "key":
        key = rng.choice(sorted(neutral))
        if key in profile:
            del profile[key]
        else:
            profile[key] = neutral[key]
    elif choice == "sort":
        history.sort_keys = not history.sort_keys
    if choice == "indent" or history.render_profile() == history.tree[PROFILE_PATH]:
        history.indent = 4 if history.indent == 2 else 2


def generate_scenario(out: Path, commits: int, seed: int, preset: str = DEFAULT_PRESET) -> Scenario:
    """Generate the scenario into `out` (created; must be absent or empty) and return it."""
    validate_request(out, commits, seed, preset)
    if shutil.which("git") is None:
        raise SleuthError("git is not installed; it is needed to write the scenario repo.")
    out = Path(out)
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    try:
        return _generate(out, commits, seed, preset)
    except BaseException:
        if created:
            shutil.rmtree(out, ignore_errors=True)
        else:
            for child in out.iterdir():
                shutil.rmtree(child) if child.is_dir() else child.unlink()
        raise


def _generate(out: Path, commits: int, seed: int, preset: str) -> Scenario:
    spec = material.PRESETS[preset]
    rng = random.Random(f"sleuth-scenario/{preset}/{commits}/{seed}")
    root_profile = json.loads(material.render_json(_initial_profile(spec)))
    history, good_mark, good_pos, events, planted = _plan_history(spec, commits, rng)
    marks = write_repo(out / "repo", history.commits, {GOOD_TAG: good_mark})
    by_mark = {c.mark: c for c in history.commits}

    def listed(kind: str) -> list[str]:
        return [marks[c.mark] for c in history.commits if c.kind == kind]

    culprits = [
        {"sha": marks[p["mark"]], "index": by_mark[p["mark"]].index,
         "message": by_mark[p["mark"]].message, "name": p["name"], "effect": p["effect"]}
        for p in planted
    ]  # fmt: skip
    truth: dict = {
        "preset": preset,
        "summary": spec.summary,
        "seed": seed,
        "commits": commits,
        "good": marks[good_mark],
        "good_tag": GOOD_TAG,
        "bad": marks[history.commits[-1].mark],
        "culprits": culprits,
        "total_effect": profile_effect(effects_of(root_profile), effects_of(history.profile)),
        "unbuildable": listed("unbuildable"),
        "lookalikes": listed("lookalike"),
        "events": [
            {"kind": c.kind, "sha": marks[c.mark], "index": c.index, "message": c.message}
            for c in history.commits
            if c.kind not in ("ordinary", "root", "side")
        ],
    }
    truth["range_commits"] = history.commits[-1].index  # first-parent steps from good to bad
    if spec.merge:
        merge = next(c for c in history.commits if c.kind == "merge")
        truth["merge"] = {"sha": marks[merge.mark], "index": merge.index, "side": listed("side")}
    if spec.patches:
        truth["patches"] = write_patches(out, history.clock, history.profile, rng)
    if spec.system_change:
        truth["system"], truth["env"] = write_system(out, rng, history.profile, spec.system_story)
    if spec.extra == "old_log":
        from orchestrator.sim_scenarios.old_log import record_old_log

        truth["old_log"] = record_old_log(out, truth, seed)
    elif spec.extra == "live":
        from orchestrator.sim_scenarios.live import plan_live

        truth["live"] = plan_live(out, truth, seed)
    (out / "truth.json").write_text(material.render_json(truth))
    return Scenario(out=out, repo=out / "repo", truth=truth)


def _initial_profile(spec: material.PresetSpec) -> dict:
    profile: dict = {"verify_mult": 1.0, "decode_mult": 1.0, "verify_cuda_graph": True}
    if spec.env_effects:
        profile["env_effects"] = [dict(effect) for effect in spec.env_effects]
    return profile
