"""Help and errors: each command's usage, `--cfg job`, the line a stopped run ends with, what a
resumed run says it reuses, and the sweep's own direction words."""

from __future__ import annotations

import io

import pytest
from omegaconf import OmegaConf
from rich.console import Console

from orchestrator.cli import COMMANDS, main
from orchestrator.commands import common
from orchestrator.commands.parts import create_run
from orchestrator.config.compose import compose_config, compose_settings
from orchestrator.config.settings import settings_of
from orchestrator.errors import UserError
from orchestrator.records import Candidate, Outcome, TrialResult
from orchestrator.run.rundir import running
from orchestrator.ui.help import HELP


def _run(capsys, argv: list[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    return exc.value.code, capsys.readouterr().out


def test_bisect_help_lists_its_options(capsys):
    code, out = _run(capsys, ["bisect", "--help"])
    assert code == 0 and out.startswith("usage: sleuth bisect")
    for option in ("good=", "bad=", "metric=", "confidence=", "nodes=", "target="):
        assert option in out, option
    assert _run(capsys, ["help", "bisect"]) == (0, out)
    assert _run(capsys, ["bisect", "repo=x", "-h"]) == (0, out)


@pytest.mark.parametrize("command", list(COMMANDS))
def test_every_command_has_help_that_fits_80_columns(capsys, command):
    code, out = _run(capsys, [command, "--help"])
    assert code == 0 and f"sleuth {command}" in out and COMMANDS[command] in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_the_command_list_fits_80_columns(capsys):
    code, out = _run(capsys, ["--help"])
    assert code == 0 and all(f"  {c}" in out for c in COMMANDS)
    assert max(len(line) for line in out.splitlines()) <= 80


@pytest.mark.parametrize("command", [c for c in HELP if c not in ("report", "resume", "doctor")])
def test_the_options_help_names_exist_in_the_configuration(command):
    cfg = compose_config(command, ["target=sim"])
    for option, _ in HELP[command][1]:
        key = option.split("=", 1)[0]
        if key.startswith(("good.", "bad.", "env.", "experiment.params.")) or key == "RUN":
            continue
        assert OmegaConf.select(cfg, key, default="<absent>") != "<absent>", (command, key)


# Each command's request record (`config/requests.py`) holds what the command reads from the
# command line: every field is an option its help shows (the key a user types for it).
REQUEST_KEYS = {"package_pre": "package.pre", "run": "RUN", "search": "trials",
                "space": "space", "out": "out", "modes": "mode"}


def _request_fields(command: str) -> list[str]:
    import dataclasses

    from orchestrator.config import requests

    record = getattr(requests, f"{command.capitalize()}Request", None)
    if command in ("report", "resume"):
        record = requests.RunRequest
    return [f.name for f in dataclasses.fields(record)] if record is not None else []


@pytest.mark.parametrize("command", [c for c in COMMANDS if _request_fields(c)])
def test_every_argument_a_command_reads_is_in_its_help(capsys, command):
    code, out = _run(capsys, [command, "--help"])
    options = {line.split()[0].split("=", 1)[0] for line in out.splitlines()
               if line.startswith("  ") and line.split()}
    usage = out.split("\n\n", 1)[0]
    skip = {"resume": {"out"}, "report": {"max_trials"}}.get(command, set())
    for name in _request_fields(command):
        key = REQUEST_KEYS.get(name, name)
        if name in skip:
            continue
        assert key in options or f"{key}=" in usage or f" {key}" in usage, (command, key)


def test_demo_help_offers_no_target(capsys):
    code, out = _run(capsys, ["demo", "--help"])
    assert code == 0 and "target=" not in out


def test_help_of_an_unknown_command_is_bad_input(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["help", "frobnicate"])
    assert exc.value.code == 2 and "unknown command" in capsys.readouterr().err


def test_cfg_job_prints_the_configuration(capsys):
    code, out = _run(capsys, ["trial", "--cfg", "job", "target=sim", "env.NCCL_PROTO=LL128"])
    assert code == 0 and "NCCL_PROTO: LL128" in out and "name: sim" in out
    assert _run(capsys, ["trial", "--cfg=job", "target=sim", "env.NCCL_PROTO=LL128"]) == (0, out)
    assert _run(capsys, ["trial", "target=sim", "env.NCCL_PROTO=LL128", "--cfg"]) == (0, out)


def test_a_sweep_takes_maximize_and_a_bisect_does_not():
    sweep = compose_config("sweep", ["target=sim", "space=nccl_quick", "direction=maximize",
                                     "metric=output_throughput"])
    common.check_common(settings_of(sweep))
    with pytest.raises(UserError, match="increase or decrease"):
        common.check_common(compose_settings("bisect", ["target=sim", "direction=maximize"]))
    with pytest.raises(UserError, match="maximize or minimize"):
        common.check_common(compose_settings("sweep", ["target=sim", "direction=up"]))


def test_target_command_defaults_to_its_own_metric():
    assert compose_config("bisect", ["target=command", "target.bench=x"]).metric == "value"
    assert compose_config("bisect", ["target=command", "target.bench=x", "metric=p99"]).metric \
        == "p99"
    assert compose_config("bisect", ["target=sim"]).metric == "verify_ms"


def _finish(store, cand: Candidate, outcome: Outcome) -> int:
    tid = store.begin_trial(store.candidate_id(cand), node="local-0", phase="search")
    store.finish_trial(tid, TrialResult(outcome, "x"))
    return tid


def test_resume_counts_finished_and_interrupted_trials(tmp_path):
    cfg = compose_settings("bisect", ["target=sim", f"runs_dir={tmp_path}", "run_id=r"])
    run_dir, store = create_run(cfg)
    cand = Candidate.make("a" * 40)
    _finish(store, cand, Outcome.OK)
    _finish(store, cand, Outcome.LAUNCH_FAILED)
    _finish(store, cand, Outcome.INTERRUPTED)  # an earlier Ctrl-C: not reused
    store.begin_trial(store.candidate_id(cand), node="local-0", phase="search")  # cut short
    store.interrupt_unfinished()
    assert common.resume_notice(run_dir, store) == (
        "resuming r: 2 finished trials reused, 2 interrupted (not evidence; what is still needed"
        " runs again)")
    store.close()


def test_every_resumable_command_reopens_its_run_the_same_way(tmp_path, capsys):
    """The preamble the four resumable commands share: the saved config reaches the command's
    own preparation; only then are cut-short trials interrupted and the run `running` again.
    A run of another command, or a preparation that refuses, leaves the store as it was."""
    from orchestrator.errors import UserError
    from orchestrator.store import RunStore

    cfg = compose_settings("isolate", ["target=sim", f"runs_dir={tmp_path}", "run_id=r"])
    run_dir, store = create_run(cfg)
    cand = Candidate.make("a" * 40)
    _finish(store, cand, Outcome.OK)
    cut = store.begin_trial(store.candidate_id(cand), node="local-0", phase="search")
    store.set_status("interrupted")
    store.close()
    with pytest.raises(UserError, match="r is an isolate run, not a bisect"):
        common.reopen_run(run_dir, "bisect", lambda c: (c, None))

    def refuse(saved):
        raise UserError("the plan is gone")

    with pytest.raises(UserError, match="the plan is gone"):
        common.reopen_run(run_dir, "isolate", refuse)
    untouched = RunStore.open(run_dir / "trials.db", readonly=True)
    assert untouched.trial(cut).outcome is None and untouched.status() == "interrupted"
    untouched.close()
    capsys.readouterr()
    store, saved, prepared = common.reopen_run(run_dir, "isolate",
                                               lambda c: (c, ("plan", c.metric)))
    assert prepared == ("plan", cfg.metric) and saved.run_id == "r"
    assert store.trial(cut).outcome is Outcome.INTERRUPTED and store.status() == "running"
    assert "resuming r: 1 finished trial reused, 1 interrupted" in capsys.readouterr().out
    store.close()


@pytest.mark.parametrize("command, resumable", [("bisect", True), ("compare", False)])
def test_ctrl_c_ends_with_the_resume_line(tmp_path, command, resumable):
    cfg = compose_settings(command, ["target=sim", f"runs_dir={tmp_path}", "run_id=stopped"])
    run_dir, store = create_run(cfg)
    _finish(store, Candidate.make("a" * 40), Outcome.OK)
    buf = io.StringIO()
    with pytest.raises(KeyboardInterrupt), running(store, run_dir, Console(file=buf, width=200)):
        raise KeyboardInterrupt
    text = buf.getvalue()
    assert "simulated node" in text.splitlines()[0]
    if resumable:
        assert f"continue with: sleuth resume stopped runs_dir={tmp_path}" in text
    else:
        assert "not resumable" in text and "sleuth resume" not in text
