"""`sleuth <command> [--cfg] [--config-dir DIR] [key=value ...]`.

Exit codes: one rule for every command, in `orchestrator/errors.py` (`sleuth help exit-codes`
prints it): 0 answered, 1 failure, 2 bad input (one line on stderr, nothing written), 3 not
fully answered, 4 undecided, 5 the node's system changed during the run, 130 interrupted.
"""

from __future__ import annotations

import errno
import importlib
import signal
import sys
from collections.abc import Sequence

from orchestrator.errors import SleuthError, UserError, did_you_mean
from orchestrator.util.safe_text import printable, readable

COMMANDS = {
    "investigate": "why is it slower? from a reference run (or good..bad) to an answer",
    "trial": "measured trials of one candidate (restarts=N makes a reference)",
    "bisect": "the commit(s) (package=NAME: releases) that moved a metric",
    "resume": "finish an interrupted run: sleuth resume RUN",
    "report": "a run's answer and findings: terminal, report.md, report.html",
    "isolate": "which differences between good.* and bad.* (or since a reference)",
    "compare": "re-measure a reference now; if it differs, diff the system",
    "demo": "build a scenario repo and investigate it on the simulated node",
    "scenario": "a repo with planted causes (out=DIR); apply=reference|now|live",
    "doctor": "check this machine: git, Ray, NVML/GPUs, sglang, runs/ writable",
    "sweep": "search a space of settings (space=nccl_pcie) for the fastest",
    "kernels": "diff profiler traces you have: then=DIR|FILES now=DIR|FILES",
}

# `sleuth help TOPIC` beside the commands' own help.
HELP_TOPICS = ("exit-codes",)

# Commands whose first plain argument names a run (id or directory).
POSITIONAL_RUN = {"resume", "report"}


def _quote(value: str) -> str:
    """Quote a value for Hydra's override grammar (paths hold characters it would parse)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


USAGE = "usage: sleuth <command> [--cfg] [--config-dir DIR] [key=value ...]"


def _help() -> str:
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<11} {text}" for name, text in COMMANDS.items()]
    lines += ["", "examples:",
              "  sleuth demo                    the whole story on the simulated node",
              "  sleuth trial repo=PATH commit=GOOD restarts=3        a reference, now",
              "  sleuth investigate repo=PATH reference=RUN bad=HEAD  later: why slower?",
              "  sleuth kernels then=DIR now=DIR  which kernels got slower, from your traces",
              "  sleuth bisect --help           one command's usage and options",
              "  sleuth trial --cfg             print the resolved configuration and exit",
              "  sleuth help exit-codes         what each exit code means, per command",
              "",
              "The target is a real SGLang server unless target=sim (the simulated node) or",
              "target=command (any benchmark command) says otherwise."]
    return "\n".join(lines)


# What `--cfg` may be followed by (Hydra's spelling): the job's configuration is what sleuth
# composes; it has no Hydra runtime configuration of its own to show.
CFG_PARTS = ("job", "all")
HELP_FLAGS = ("-h", "--help")


def _unknown(command: str) -> UserError:
    return UserError(f"unknown command {command!r}{did_you_mean(command, COMMANDS)} (known:"
                     f" {', '.join(COMMANDS)})")


def parse_args(argv: Sequence[str]) -> tuple[str, bool, str | None, list[str]]:
    """(command, show_cfg, config_dir, overrides); command `help` or `help:<command>` for
    the usage of all commands or of one."""
    args = list(argv)
    if not args or args[0] in (*HELP_FLAGS, "help"):
        if len(args) > 1 and args[0] == "help":
            if args[1] in HELP_TOPICS:
                return f"help:{args[1]}", False, None, []
            if args[1] not in COMMANDS:
                raise _unknown(args[1])
            return f"help:{args[1]}", False, None, []
        return "help", False, None, []
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        raise _unknown(command)
    if any(a in HELP_FLAGS for a in rest):
        return f"help:{command}", False, None, []
    show_cfg, config_dir, overrides = False, None, []
    positional_used = False
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--cfg" or a.startswith("--cfg="):
            show_cfg = True
            part = a.split("=", 1)[1] if "=" in a else (
                rest[i + 1] if i + 1 < len(rest) and rest[i + 1] in (*CFG_PARTS, "hydra")
                else None)
            if part is not None and "=" not in a:
                i += 1
            if part == "hydra":
                raise UserError("--cfg hydra: sleuth composes its configuration with Hydra's"
                                " compose API and has no Hydra runtime config; --cfg job shows"
                                " the configuration")
            if part is not None and part not in CFG_PARTS:
                raise UserError(f"--cfg {part}: use --cfg or --cfg job")
        elif a == "--config-dir":
            if i + 1 >= len(rest):
                raise UserError("--config-dir needs a directory")
            config_dir = rest[i + 1]
            i += 1
        elif a.startswith("--config-dir="):
            config_dir = a.split("=", 1)[1]
        elif a.startswith("-"):
            raise UserError(f"unknown option {a!r}")
        elif command in POSITIONAL_RUN and "=" not in a and not positional_used:
            overrides.append(f"run_id={_quote(a)}")
            positional_used = True
        else:
            overrides.append(a)
        i += 1
    return command, show_cfg, config_dir, overrides


def run(argv: Sequence[str]) -> int:
    command, show_cfg, config_dir, overrides = parse_args(argv)
    if command == "help":
        print(_help())
        return 0
    if command.startswith("help:"):
        from orchestrator.ui.help import command_help

        name = command.split(":", 1)[1]
        if name == "exit-codes":
            from orchestrator.errors import exit_table

            print(exit_table())
            return 0
        print(command_help(name, COMMANDS[name]))
        return 0
    from orchestrator.config import early
    from orchestrator.config.overrides import check_repeats

    check_repeats(overrides)
    early.check(command, overrides, config_dir)  # what the raw words decide, before Hydra
    from orchestrator.config.compose import compose_config, shown_yaml
    from orchestrator.config.settings import settings_of

    cfg = compose_config(command, overrides, config_dir=config_dir)
    if show_cfg:
        print(shown_yaml(cfg), end="")
        return 0
    settings = settings_of(cfg)  # the typed tree every layer below reads, built once here
    from orchestrator.commands import preflight

    preflight.check(command, settings)  # before the command's module brings Ray and SciPy along
    # `investigate live=PID|URL` starts from the running server (commands/investigate_live.py)
    name = "investigate_live" if command == "investigate" and settings.live.server else command
    module = importlib.import_module(f"orchestrator.commands.{name}")
    return int(module.run(settings))


def main(argv: Sequence[str] | None = None) -> None:
    try:
        code = run(sys.argv[1:] if argv is None else argv)
    except SleuthError as exc:
        msg = readable(" ".join(printable(str(exc)).split()))
        print(f"sleuth: error: {msg}", file=sys.stderr)
        code = exc.exit_code
    except KeyboardInterrupt:
        # Another Ctrl-C while the interpreter winds down (Ray's exit hooks) would kill it by
        # the signal instead of exiting 130: the user has been heard, ignore the rest.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        print("sleuth: interrupted", file=sys.stderr)
        code = 130
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        print(f"sleuth: error: no space left on device: {printable(str(exc))}", file=sys.stderr)
        code = 1
    sys.exit(code)


if __name__ == "__main__":
    main()
