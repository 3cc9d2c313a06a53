"""`sleuth <command> [--cfg] [--config-dir DIR] [key=value ...]`.

Exit codes (DESIGN.md): 0 done, 1 failure, 2 bad input (one line on stderr, nothing written),
3 finished but inconclusive, 130 interrupted.
"""

from __future__ import annotations

import errno
import importlib
import signal
import sys
from collections.abc import Sequence

from orchestrator.errors import SleuthError, UserError
from orchestrator.safe_text import printable

COMMANDS = {
    "trial": "run one isolated, measured trial of a candidate",
    "bisect": "find the commit(s) between good=REF and bad=REF that moved a metric",
    "resume": "finish an interrupted run: sleuth resume RUN",
    "report": "ranked findings of a run: terminal tables, report.md, report.html (sleuth report RUN)",
    "isolate": "which differences between good.* and bad.* (or a reference run and now) cause it",
    "compare": "re-measure a reference run's candidate now; if it no longer reproduces, diff the system",
    "demo": "build a scenario repo and investigate it on the simulated node",
    "scenario": "generate a scenario repo with planted causes (out=DIR commits=N seed=S preset=P)",
    "doctor": "check this machine: git, Ray, NVML/GPUs, sglang, runs/ writable",
    "sweep": "search a space of settings (space=nccl_pcie ...) for the fastest, rank the knobs",
}

# Commands whose first plain argument names a run (id or directory).
POSITIONAL_RUN = {"resume", "report"}


def _quote(value: str) -> str:
    """Quote a value for Hydra's override grammar (paths hold characters it would parse)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


USAGE = "usage: sleuth <command> [--cfg] [--config-dir DIR] [key=value ...]"


def _help() -> str:
    lines = [USAGE, "", "commands:"]
    lines += [f"  {name:<10} {text}" for name, text in COMMANDS.items()]
    lines += ["", "examples:",
              "  sleuth trial repo=PATH commit=HEAD env.NCCL_PROTO=LL128 bench.repetitions=3",
              "  sleuth trial --cfg             print the resolved configuration and exit"]
    return "\n".join(lines)


def parse_args(argv: Sequence[str]) -> tuple[str, bool, str | None, list[str]]:
    args = list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        return "help", False, None, []
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        raise UserError(f"unknown command {command!r} (known: {', '.join(COMMANDS)})")
    show_cfg, config_dir, overrides = False, None, []
    positional_used = False
    i = 0
    while i < len(rest):
        a = rest[i]
        if a == "--cfg":
            show_cfg = True
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
    from orchestrator.config.compose import compose_config, to_yaml

    cfg = compose_config(command, overrides, config_dir=config_dir)
    if show_cfg:
        print(to_yaml(cfg), end="")
        return 0
    module = importlib.import_module(f"orchestrator.commands.{command}")
    return int(module.run(cfg))


def main(argv: Sequence[str] | None = None) -> None:
    try:
        code = run(sys.argv[1:] if argv is None else argv)
    except SleuthError as exc:
        msg = " ".join(printable(str(exc)).split())
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
