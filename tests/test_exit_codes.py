"""One exit-code rule for every command: the README's table and `sleuth help exit-codes` are
read from `orchestrator/errors.py`, and each command's mapping is run on the answers it ends
with (the situations the rule names: explained, a bounded remainder, a remainder shown, a
change with no cause, nothing decided, a run stopped at its budget, a node that changed)."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.answer import assemble, for_compare, for_isolate, for_sweep
from orchestrator.answer.combine import LogChange
from orchestrator.answer.epochs import mark_system_change
from orchestrator.answer.provisional import so_far
from orchestrator.commands.bisect_stop import exit_code as bisect_exit
from orchestrator.commands.bisect_stop import settle
from orchestrator.commands.investigate import exit_code as investigate_exit
from orchestrator.errors import (
    ANSWERED,
    COMMAND_EXITS,
    EXIT_CODES,
    INCONCLUSIVE,
    SYSTEM_CHANGED,
    UNDECIDED,
    answer_exit,
    exit_table,
)
from orchestrator.strategies.base import Verdict

ROOT = Path(__file__).resolve().parent.parent
CHANGE = {"summary": "SM clock lock: none -> 1700 MHz", "node": "local-0", "before_trial": 3,
          "after_trial": 4}


def _readme_table() -> dict[str, tuple[str, set[str]]]:
    """The README's exit-code table: code(s) -> (meaning, the commands that give it)."""
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| ([0-9, ]+) \| (.+?) \| (.+?) \|$", text, re.M)
    out = {}
    for code, meaning, given in rows:
        out[code.strip()] = (meaning, {g.strip() for g in given.split(",")})
    return out


def test_the_readme_table_is_the_rule_in_errors_py():
    table = _readme_table()
    codes = {str(c) for c, _, _ in EXIT_CODES}
    listed = {c.strip() for key in table for c in key.split(",")}
    assert listed == codes, (listed, codes)
    commands = set(COMMAND_EXITS)
    for key, (meaning, given) in table.items():
        for code in (int(c) for c in key.split(",")):
            name = next(n for c, n, _ in EXIT_CODES if c == code)
            if code in (1, 2, 130) or given == {"every command"}:
                continue
            assert given == {cmd for cmd, cs in COMMAND_EXITS.items() if code in cs}, (
                code, given)
            assert given <= commands
            assert name.split()[0] in meaning or (code == SYSTEM_CHANGED
                                                  and "system changed" in meaning)
    # Every command's 0 is in the table ("every command"), and no command gives a code the
    # table does not list.
    assert table["0"][1] == {"every command"}
    for cmd, cs in COMMAND_EXITS.items():
        assert set(cs) <= {c for c, _, _ in EXIT_CODES}, cmd


@pytest.mark.e2e
def test_sleuth_help_exit_codes_prints_the_rule():
    """Through the installed entry point, as a user types it."""
    sleuth = Path(sys.executable).with_name("sleuth")
    run = subprocess.run([str(sleuth), "help", "exit-codes"], capture_output=True, text=True,
                         timeout=120, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == exit_table().strip()
    for cmd in ("investigate", "bisect", "isolate", "compare", "sweep", "trial"):
        assert re.search(rf"^  {cmd}\s+5  ", run.stdout, re.M), cmd


def _whole(pct: float, se: float = 0.01) -> LogChange:
    return LogChange(math.log1p(pct / 100.0), se, 20)


def _cause(pct: float, se: float = 0.01, **extra) -> dict:
    return {"kind": "env", "id": "NCCL_PROTO", "label": "NCCL_PROTO LL128 -> unset",
            "probability": 0.999, **LogChange(math.log1p(pct / 100.0), se, 20).to_json(),
            **extra}


def test_an_answers_exit_code_follows_the_rule():
    """The one mapping every command's answer goes through."""
    explained = assemble("verify_ms", _whole(30.0), [_cause(29.0)], lead="")
    assert explained["status"] == "explained" and answer_exit(explained) == ANSWERED
    # Undecided against the 4% min effect, but the cause carries the change: 0, with how
    # much may be left in the sentence.
    bounded = assemble("verify_ms", _whole(30.0, 0.025), [_cause(29.0, 0.02)], lead="")
    assert bounded["unexplained"]["decision"] == "undecided"
    assert answer_exit(bounded) == ANSWERED and "may be left" in bounded["headline"]
    # A remainder beyond the min effect is shown: 3.
    shown = assemble("verify_ms", _whole(30.0), [_cause(15.0)], lead="")
    assert shown["status"] == "partly_explained" and answer_exit(shown) == INCONCLUSIVE
    # The cause does not carry the change (the remainder may be half of it): 3.
    weak = assemble("verify_ms", _whole(10.0, 0.02), [_cause(5.0, 0.02)], lead="")
    assert weak["status"] == "undecided" and answer_exit(weak) == INCONCLUSIVE
    # A change, nothing named: 3; nothing decided at all: 4; nothing changed: 0.
    assert answer_exit(assemble("verify_ms", _whole(30.0), [], lead="")) == INCONCLUSIVE
    assert answer_exit(assemble("verify_ms", _whole(3.0, 0.03), [], lead="")) == UNDECIDED
    assert answer_exit(assemble("verify_ms", _whole(0.5, 0.005), [], lead="")) == ANSWERED
    # Stopped at its budget: a best guess is not an answer (3), nothing decided (4).
    assert answer_exit(so_far(explained, why="budget spent")) == INCONCLUSIVE
    assert answer_exit(so_far({"metric": "verify_ms", "causes": [], "total": None,
                               "status": "undecided"}, why="budget spent")) == UNDECIDED
    # The node changed during the run: 5, whatever the answer was.
    assert answer_exit(mark_system_change(dict(explained), [CHANGE])) == SYSTEM_CHANGED


def test_investigate_maps_its_answer_by_the_rule():
    assert investigate_exit(assemble("verify_ms", _whole(30.0), [_cause(29.0)],
                                     lead="")) == ANSWERED
    assert investigate_exit(mark_system_change(
        assemble("verify_ms", _whole(30.0), [_cause(29.0)], lead=""), [CHANGE])) == 5


def test_bisect_maps_its_verdicts_by_the_rule(tmp_path):
    """found: the answer's own rule; not reproducible: 0 when ruled out or no change, 4 at
    the cap; reversed: 3; budget: 3 or 4; a node that changed mid-run: 5."""
    def code(status: str, doc: dict, rows=()) -> int:
        verdict = Verdict(done=True, status=status, message="")
        return bisect_exit(verdict, settle(doc, verdict, list(rows)))

    found = {"answer": assemble("verify_ms", _whole(30.0), [_cause(29.0)], lead="")}
    assert code("found", found) == ANSWERED
    part = {"answer": assemble("verify_ms", _whole(30.0), [_cause(15.0)], lead="")}
    assert code("found", part) == INCONCLUSIVE
    alike = assemble("verify_ms", _whole(0.5, 0.005), [], lead="", status="not_in_code")
    assert code("not_reproducible", {"answer": dict(alike)}) == ANSWERED
    capped = assemble("verify_ms", _whole(3.0, 0.03), [], lead="", status="not_in_code")
    assert code("not_reproducible", {"answer": dict(capped)}) == UNDECIDED
    assert code("not_reproducible", {"answer": dict(capped),
                                     "chased": {"ruled_out": True}}) == ANSWERED
    faster = assemble("verify_ms", _whole(-30.0), [], lead="")
    assert code("reversed", {"answer": faster}) == INCONCLUSIVE
    guess = so_far(assemble("verify_ms", _whole(30.0), [], lead=""), why="budget spent")
    assert code("budget_exhausted", {"answer": guess}) == INCONCLUSIVE


def test_isolate_compare_and_sweep_map_their_answers_by_the_rule():
    iso = {"metric": "verify_ms", "experiment": "isolate", "verdict": "found",
           "total_effect": {"verify_ms": {"pct": 30.0, "ci": [28.0, 32.0],
                                          "log": [math.log(1.3), 0.008, 20]}},
           "findings": [{"kind": "env", "id": "NCCL_PROTO", "probability": 0.999,
                         "effect": {"verify_ms": {"pct": 29.0, "ci": [27.0, 31.0],
                                                  "log": [math.log(1.29), 0.008, 20]}}}]}
    assert answer_exit(for_isolate(iso)) == ANSWERED
    assert answer_exit(so_far(for_isolate(iso), why="budget spent after 60 restarts")) == 3
    assert answer_exit(mark_system_change(for_isolate(iso), [CHANGE])) == SYSTEM_CHANGED
    ref = {"metric": "verify_ms", "findings": [],
           "total_effect": {"verify_ms": {"pct": 1.0, "ci": [-1.0, 3.0],
                                          "log": [math.log(1.01), 0.01, 10]}}}
    assert answer_exit(for_compare({**ref, "verdict": "reproduced"})) == ANSWERED
    assert answer_exit(for_compare({**ref, "verdict": "not_reproduced"})) == INCONCLUSIVE
    assert answer_exit(for_compare({**ref, "verdict": "unresolved"})) == UNDECIDED
    best = {"id": "NCCL_PROTO=LL128", "config": {"NCCL_PROTO": "LL128"},
            "effect": {"verify_ms": {"pct": -1.0, "ci": [-2.4, 0.5]}}}
    sweep = {"experiment": "sweep", "metric": "verify_ms", "n_configurations": 12,
             "direction": "minimize", "findings": [best]}
    for verdict, code in (("found", 0), ("baseline_best", 0), ("no_better", 0),
                          ("inconclusive", 4)):
        assert answer_exit(for_sweep({**sweep, "verdict": verdict})) == code, verdict
    said = for_sweep({**sweep, "verdict": "no_better"})["sentence"]
    assert said.startswith("no setting measured beats the baseline by more than -2.4%")


def test_trial_gives_5_when_its_restarts_measured_two_systems(tmp_path):
    from test_system_watch import _fingerprint, _trial

    from orchestrator.commands.trial import exit_for
    from orchestrator.store import RunStore

    store = RunStore.create(tmp_path / "trials.db", run_id="t", command="trial",
                            config_yaml="{}")
    try:
        _trial(store, _fingerprint(), phase="trial")
        _trial(store, _fingerprint(), phase="trial")
        assert exit_for(store.trials()) == ANSWERED
        _trial(store, _fingerprint(gpu__gpus__0__power_limit_w=450), phase="trial")
        assert exit_for(store.trials()) == SYSTEM_CHANGED
    finally:
        store.close()
