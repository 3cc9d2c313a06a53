"""Full-graph bisection (`first_parent=false`) on a real merge-heavy repository built here.

The repository has a mainline that merges side branches, one of them forked *before* the good
commit (its first commit's parent lies outside the range), one a branch of a branch. The
culprit is a side-branch commit. In git's topological order the mainline commits merged after
it come later in the list without containing it, so a bisection that reads "later" as "bad"
is wrong there; the graph bisection must name the side-branch commit and verify it against its
real git parent. The plan is the bisect command's own (`bisect.plan`), the trials come from the
value each commit's checkout holds (read with `git show`), with restart noise.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from conftest import git

from orchestrator.commands import bisect
from orchestrator.config.compose import compose_settings
from orchestrator.config.requests import BisectRequest
from orchestrator.strategies import BisectStrategy, Observation
from orchestrator.workspace.commits import parent_points


def _commit(repo: Path, value: float, message: str) -> str:
    (repo / "value.txt").write_text(f"{value}\n")
    (repo / "log.txt").write_text((repo / "log.txt").read_text() + message + "\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def _merge(repo: Path, branch: str, message: str) -> str:
    git(repo, "merge", "-q", "--no-ff", "-X", "theirs", "-m", message, branch)
    return git(repo, "rev-parse", "HEAD")


def merge_heavy_repo(repo: Path) -> dict[str, str]:
    """Build the history; returns the named commits. Values: 10.0 before the culprit, 13.0
    (+30%) in every commit that contains it."""
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    (repo / "log.txt").write_text("")
    names: dict[str, str] = {}
    for i in range(3):
        names[f"base{i}"] = _commit(repo, 10.0, f"base {i}")
    git(repo, "checkout", "-q", "-b", "early", names["base1"])  # forked before the good commit
    names["early0"] = _commit(repo, 10.0, "early branch 0")
    names["early1"] = _commit(repo, 10.0, "early branch 1")
    git(repo, "checkout", "-q", "main")
    names["good"] = _commit(repo, 10.0, "good")
    value = main_value = 10.0
    for i in range(4):
        names[f"main{i}"] = _commit(repo, main_value, f"main {i}")
        git(repo, "checkout", "-q", "-b", f"side{i}")
        for j in range(3):
            if i == 2 and j == 0:
                value = 13.0
                names["culprit"] = _commit(repo, value, "side 2: reuse the buffer")
            else:
                names[f"side{i}.{j}"] = _commit(repo, value, f"side {i}.{j}")
            if i == 1 and j == 0:  # a branch of a branch, merged back into side1
                git(repo, "checkout", "-q", "-b", "sub1")
                names["sub1"] = _commit(repo, value, "sub 1")
                git(repo, "checkout", "-q", "side1")
                _merge(repo, "sub1", "merge sub1 into side1")
        git(repo, "checkout", "-q", "main")
        # mainline moves on before the merge: these commits do not contain the branch
        for j in range(3):
            names[f"main{i}.{j}"] = _commit(repo, main_value, f"main {i}.{j}")
        names[f"merge{i}"] = _merge(repo, f"side{i}", f"merge side {i}")
        (repo / "value.txt").write_text(f"{value}\n")  # the merge holds the branch's value
        git(repo, "commit", "-q", "--amend", "-a", "--no-edit")
        names[f"merge{i}"] = git(repo, "rev-parse", "HEAD")
        main_value = value
    names["merge_early"] = _merge(repo, "early", "merge early branch")
    names["bad"] = _commit(repo, float((repo / "value.txt").read_text()), "bad")
    return names


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    repo = tmp_path_factory.mktemp("graph") / "repo"
    names = merge_heavy_repo(repo)
    cfg = compose_settings("bisect", [f"repo={repo}", f"good={names['good']}",
                                    f"bad={names['bad']}", "first_parent=false",
                                    f"runs_dir={repo.parent / 'runs'}"])
    commits, points, _ = bisect.plan(cfg, BisectRequest.stored(cfg))
    values = [float(git(repo, "show", f"{c.sha}:value.txt")) for c in commits]
    return repo, names, commits, values


def test_the_plan_lists_the_graph_with_the_parent_from_outside_the_range(graph):
    repo, names, commits, values = graph
    shas = [c.sha for c in commits]
    assert shas[0] == names["good"] and shas[-1] == names["bad"]
    # early0's parent (base1) is an ancestor of the good commit: listed, marked, taken as good
    boundary = [c for c in commits if c.boundary]
    assert [c.sha for c in boundary] == [names["base1"]]
    parents, assumed_good = parent_points(commits)
    assert assumed_good == [0, shas.index(names["base1"])]
    for i, commit in enumerate(commits):
        assert [shas[p] for p in parents[i]] == [p for p in commit.parents if p in shas]
    # The order is topological but not monotone: some later commits do not contain the culprit.
    culprit = shas.index(names["culprit"])
    later = [i for i in range(culprit + 1, len(shas)) if values[i] == 10.0]
    assert later, "the test needs commits after the culprit that do not contain it"


@pytest.mark.parametrize("seed", range(3))
def test_graph_bisection_names_the_side_branch_commit_against_its_git_parent(graph, seed):
    repo, names, commits, values = graph
    shas = [c.sha for c in commits]
    parents, assumed_good = parent_points(commits)
    strategy = BisectStrategy(len(commits), parents=parents, assumed_good=assumed_good)
    rng = np.random.default_rng(seed)
    obs: list[Observation] = []
    while len(obs) < 300:
        proposals = strategy.propose(obs, [], 2)
        if not proposals:
            break
        for p in proposals:
            obs.append(Observation(p.point, values[p.point] * math.exp(0.03 * rng.standard_normal()),
                                   trial_id=len(obs)))
    verdict = strategy.verdict(obs)
    assert verdict.status == "found", verdict.message
    top = verdict.top
    assert shas[top.point] == names["culprit"] and top.probability >= 0.99
    git_parent = git(repo, "rev-parse", f"{names['culprit']}^")
    assert [shas[p] for p in top.parents] == [git_parent]
    assert 24.0 < top.effect_pct < 36.0  # the planted +30%, measured against that parent
    assert {o.point for o in obs} & {top.point, *top.parents} == {top.point, *top.parents}


def test_a_chain_reading_of_the_same_history_is_not_what_the_graph_bisection_does(graph):
    """The old full-graph mode took the previous position as the parent; here the previous
    position of the culprit is not its parent."""
    repo, names, commits, _ = graph
    shas = [c.sha for c in commits]
    culprit = shas.index(names["culprit"])
    assert shas[culprit - 1] != git(repo, "rev-parse", f"{names['culprit']}^")


def test_a_first_parent_culprit_that_is_a_merge_prints_the_first_parent_false_command(graph):
    """On the mainline the step comes in with `merge side 2`; the answer says it is a merge
    and gives the command that searches the merged branch's commits (good = its first
    parent, bad = the merge, first_parent=false), as the `next:` line."""
    from orchestrator.answer.headline import lines

    repo, names, _, _ = graph
    cfg = compose_settings("bisect", [f"repo={repo}", f"good={names['good']}",
                                    f"bad={names['bad']}", f"runs_dir={repo.parent / 'runs'}",
                                    "target=sim"])
    commits, _, _ = bisect.plan(cfg, BisectRequest.stored(cfg))
    merge = next(c for c in commits if c.sha == names["merge2"])
    assert len(merge.parents) == 2
    doc = {"findings": [{"kind": "commit", "id": merge.sha}],
           "answer": {"metric": "verify_ms", "causes": [], "next": ""}}
    bisect.mark_merges(cfg, doc, commits)
    assert doc["findings"][0]["merge"] is True
    command = doc["answer"]["next"]
    assert command.startswith(f"sleuth bisect good={merge.parents[0][:12]} "
                              f"bad={merge.sha[:12]} first_parent=false target=sim")
    said = [line["text"] for line in lines(doc["answer"]) if line["label"] == "merge"]
    assert said and "is a merge" in said[0] and command in said[0]
