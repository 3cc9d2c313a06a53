"""`sleuth <command> --help` and `sleuth help <command>`: each command's usage and options.

Kept as data beside the CLI so every option a user reads here is checked against the
configuration schema by the tests (a renamed key cannot leave its help behind).
"""

from __future__ import annotations

import textwrap

# command: (usage lines, [(option, what it does)])
HELP: dict[str, tuple[tuple[str, ...], tuple[tuple[str, str], ...]]] = {
    "investigate": (
        ("sleuth investigate repo=PATH reference=RUN [bad=REF] [metric=verify_ms] [nodes=K]"
         " [recover=true]",
         "sleuth investigate repo=PATH good=REF bad=REF [metric=verify_ms] [nodes=K]",
         "sleuth investigate repo=PATH reference=log:PATH [log.pattern=REGEX]",
         "sleuth investigate live=PID|URL [live.restart=true] [was=V | reference=RUN]"),
        (("reference=RUN", "an earlier run (id or directory) or fingerprint JSON that measured"
          " the good state; its whole configuration is re-measured now"),
         ("reference=log:PATH", "an old server log (files, globs, a directory; .gz): what it"
          " tells is the reference, what it cannot is listed as unknown"),
         ("log.pattern=REGEX", "a line of your own whose named groups are metrics, e.g."
          " 'verify (?P<verify_ms>[0-9.]+) ms'"),
         ("live=PID|URL", "the slow server as it runs now: measured without a restart"),
         ("live.restart=true", "then fresh starts of its command (server state), and the"
          " original relaunched"),
         ("was=VALUE", "the level then, as you remember it (with live= or good=/bad=)"),
         ("bad=REF", "the commit that is slow now (default: the reference's own commit)"),
         ("good=REF", "without a reference: the good end of the range to bisect"),
         ("metric=NAME", "what got worse (default verify_ms; value for target=command)"),
         ("was=VALUE", "without a reference: the level the metric had when it was fast"),
         ("direction=auto", "auto | increase | decrease: which way is worse"),
         ("first_parent=true", "bisect the mainline (a merge is one step)"),
         ("paths=[python/sglang/srt]", "commits touching these paths are likelier"),
         ("recover=true", "end with a short sweep of space= on the bad commit"),
         ("space=NAME", "the sweep's space with recover=true (default nccl_quick)"),
         ("nodes=K", "trials in parallel on K nodes"),
         ("max_trials=N", "budget of the bisect and of the isolate, each"),
         ("confidence=0.99", "the probability at which a cause is named"),
         ("experiment.params.min_effect_pct=P", "a remainder within P% counts as explained"
          " (default: 4% or a tenth of the change)"),
         ("experiment.params.final_trials=N", "restarts the final check may spend on the"
          " endpoints (default: planned from the noise measured, at most 48)"),
         ("experiment.params.all_env=true", "also test shell/session variables"))),
    "trial": (
        ("sleuth trial repo=PATH commit=REF [restarts=N] [env.VAR=VALUE] [clock=POLICY]",
         "sleuth trial from_log=PATH run_id=NAME [repo=PATH commit=REF] [log.pattern=RE]"),
        (("repo=PATH", "the git repository to check out"),
         ("commit=REF", "the commit to run (default HEAD)"),
         ("restarts=N", "N trials (server restarts): a reference for investigate"),
         ("run_id=NAME", "the run's name, to give later as reference=NAME"),
         ("nodes=K", "restarts in parallel on K nodes"),
         ("packages=[NAME==V]", "package versions installed over the node's for the trial"),
         ("patches=[a.patch,b.patch]", "patches applied to the worktree"),
         ("env.VAR=VALUE", "environment of the server (env.VAR='<unset>' removes one)"),
         ("clock=POLICY", "default | locked:MHZ | power:W | app:MHZ, parts joined by commas"),
         ("bench.repetitions=N", "benchmark repetitions inside each trial"),
         ("from_log=PATH", "keep an old server log as a reference run instead (nothing runs)"),
         ("log.pattern=REGEX", "with from_log: a line whose named groups are metrics"))),
    "bisect": (
        ("sleuth bisect repo=PATH good=REF bad=REF [metric=verify_ms] [nodes=K]",
         "sleuth bisect repo=PATH package=NAME good=V1 bad=V2 packages.find_links=DIR"),
        (("good=REF", "a commit that was fast"),
         ("bad=REF", "a commit that is slow"),
         ("metric=NAME", "what got worse (default verify_ms; value for target=command)"),
         ("direction=auto", "auto | increase | decrease: which way is worse"),
         ("confidence=0.99", "stop when one commit holds this probability"),
         ("nodes=K", "trials in parallel on K nodes"),
         ("max_trials=N", "stop after N trials with the best guess"),
         ("first_parent=true", "follow the mainline (a merge is one step)"),
         ("paths=[python/sglang/srt]", "commits touching these paths are likelier"),
         ("experiment.params.min_effect_pct=P", "a change below P% does not count"),
         ("reference=RUN", "an earlier run that measured the good state: its level is the"
          " change being chased (a range that does not hold it is ruled out sooner)"),
         ("was=VALUE", "the good level as you remember it (e.g. was=19), instead of a"
          " reference"),
         ("run_id=RUN max_trials=N", "continue a bisect that stopped at its budget"),
         ("package=NAME", "search the releases of NAME between versions good and bad"),
         ("package.pre=true", "pre-releases too (yanked ones only when named)"))),
    "compare": (
        ("sleuth compare reference=RUN [metric=verify_ms] [repo=PATH]",),
        (("reference=RUN", "the run (or fingerprint JSON, or log:PATH) to re-measure now"),
         ("metric=NAME", "the metric that decides"),
         ("max_trials=N", "restarts now (default 9)"))),
    "isolate": (
        ("sleuth isolate reference=RUN [metric=verify_ms]",
         "sleuth isolate good.commit=REF good.env.VAR=V bad.clock=POLICY bad.patches=[a.patch]"),
        (("reference=RUN", "test the controllable differences since that run (or log:PATH)"),
         ("good.PART=...", "the good configuration: commit, patches, env.VAR, clock, server"),
         ("bad.PART=...", "the bad configuration (a part left out: same as good)"),
         ("good.packages=[NAME==V]", "a side's package versions (bad.packages likewise)"),
         ("packages.find_links=DIR", "the wheels the versions install from (or"
          " packages.index_url=URL)"),
         ("direction=auto", "auto | increase | decrease: which way is worse"),
         ("metric=NAME", "what got worse"),
         ("confidence=0.99", "the probability at which a cause is named"),
         ("max_trials=N", "stop after N trials"),
         ("experiment.params.all_env=true", "also test shell/session variables"))),
    "sweep": (
        ("sleuth sweep repo=PATH commit=REF space=nccl_pcie [metric=...] [trials=40]",),
        (("space=NAME", "nccl_pcie | nccl_quick | spec_decode, or your own DIR/space/NAME.yaml"),
         ("metric=NAME", "what to optimise"),
         ("direction=auto", "auto | maximize | minimize"),
         ("trials=N", "search budget in restarts (the confirmation adds its own)"),
         ("confidence=0.99", "how surely the best setting must beat the baseline"),
         ("sampler=tpe", "tpe | random | grid"),
         ("seed=S", "the sampler's seed"),
         ("nodes=K", "configurations in flight"),
         ("experiment.params.KNOB=V", "the sweep's knobs (orchestrator/config/params.py)"))),
    "report": (("sleuth report RUN [out=DIR]",),
               (("RUN", "a run id under runs_dir (looked up there first), or a run"
                 " directory (./RUN)"),
                ("runs_dir=DIR", "where the run's directory is (default runs)"),
                ("out=DIR", "write report.md / report.html there"))),
    "resume": (("sleuth resume RUN [runs_dir=DIR] [max_trials=N]",),
               (("RUN", "an interrupted bisect, isolate, sweep or investigate run: its id"
                 " (looked up in runs_dir first) or its directory (./RUN)"),
                ("runs_dir=DIR", "where the run's directory is (default runs)"),
                ("max_trials=N", "a bisect's new, larger budget"))),
    "scenario": (("sleuth scenario out=DIR [commits=100] [seed=0] [preset=one_culprit]",
                  "sleuth scenario out=DIR apply=reference|now|live [runs_dir=R] [nodes=K]"),
                 (("out=DIR", "where to write the repo and truth.json"),
                  ("commits=N", "history length"), ("seed=S", "the scenario's seed"),
                  ("preset=NAME", "which causes to plant (sleuth scenario --help lists them)"),
                  ("apply=WHEN", "put runs_dir's simulated nodes in the scenario's node state"
                                 " then (reference) or now"))),
    "demo": (("sleuth demo [seed=S] [commits=N] [nodes=K]",),
             (("seed=S", "the scenario's seed"), ("commits=N", "history length"),
              ("nodes=K", "simulated nodes (default 3)"))),
    "doctor": (("sleuth doctor",), ()),
    "kernels": (("sleuth kernels then=DIR|FILES now=DIR|FILES [mode=NAME]",),
                (("then=DIR|FILES", "traces of the fast run: a directory, a file, a glob or"
                  " [a,b,c]; one file per restart (SGLang's -TP-N and stage files of one"
                  " profile id are one restart)"),
                 ("now=DIR|FILES", "traces of the slow run, the same way"),
                 ("mode=NAME", "compare only these forward modes (target_verify, draft,"
                  " decode, extend, step, other; comma-separated), or all: each trace as one"
                  " pass"),
                 ("runs_dir=DIR", "where the run directory goes (default runs)"))),
}

COMMON = (
    ("target=NAME", "sglang (a real server, the default) | sim (the simulated node) | command"),
    ("cluster=local", "local (a private Ray instance) | ray (cluster.address=HOST:PORT)"),
    ("runs_dir=DIR", "where run directories go (default runs)"),
    ("--cfg [job]", "print the resolved configuration and exit"),
    ("--config-dir DIR", "your own config groups, e.g. DIR/target/mynode.yaml"),
)
DEMO_COMMON = ("runs_dir=DIR", "--cfg [job]")


WIDTH = 80


def _options(options) -> list[str]:
    """Two columns that fit 80: an option too long for the first column gets its own line."""
    col = 22
    out = []
    for opt, what in options:
        body = textwrap.wrap(what, WIDTH - col - 4) or [""]
        if len(opt) > col:
            out.append(f"  {opt}")
            out += [f"  {'':<{col}}  {line}" for line in body]
        else:
            out.append(f"  {opt:<{col}}  {body[0]}")
            out += [f"  {'':<{col}}  {line}" for line in body[1:]]
    return out


def command_help(command: str, summary: str) -> str:
    usage, options = HELP.get(command, ((f"sleuth {command}",), ()))
    lines = [*textwrap.wrap(usage[0], WIDTH, initial_indent="usage: ", subsequent_indent=" " * 9),
             *[w for u in usage[1:] for w in textwrap.wrap(u, WIDTH, initial_indent=" " * 7,
                                                           subsequent_indent=" " * 9)],
             "", summary]
    if options:
        lines += ["", "options:", *_options(options)]
    if command == "demo":  # the demo is the simulated node's own story: no target to choose
        lines += ["", "common options:", *_options(o for o in COMMON if o[0] in DEMO_COMMON)]
    elif command not in ("report", "resume", "doctor", "scenario", "kernels"):
        lines += ["", "common options:", *_options(COMMON)]
    if command == "scenario":
        from orchestrator.sim_scenarios.presets import PRESETS

        lines += ["", "presets:", *_options((n, spec.summary) for n, spec in PRESETS.items())]
    lines += ["", "any setting of `sleuth " + command + " --cfg` can be given as key=value"]
    return "\n".join(lines)
