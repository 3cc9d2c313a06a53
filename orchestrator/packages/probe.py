"""What a running server really imported: read from the server process, never assumed.

A pin can fail to take effect in many quiet ways: a launcher or `sudo` drops `PYTHONPATH` or
`LD_LIBRARY_PATH`, the server runs another interpreter than the one the overlay was built for,
`python -I` ignores the environment, an earlier `sys.path` entry holds another copy, a native
library was already found elsewhere by the dynamic linker. So the versions are read from the
server itself, two ways:

- **Python distributions**: a probe runs with the server process's own interpreter (as it was
  invoked, from `/proc/<pid>/cmdline`, so a virtual environment is the same one), its
  isolation flags (`-I`, `-E`, `-s`, `-S`, `-P`), its environment (`/proc/<pid>/environ`), its
  working directory and its first `sys.path` entry (the script's directory, or the working
  directory for `-m`), and asks `importlib.metadata` which distribution of each pinned name that
  path finds first, and where the distribution's top-level modules are imported from;
- **native libraries**: `/proc/<pid>/maps` of every process of the server's group says from
  which file each shared library of an overlay (`libnccl.so.2`) was really loaded.

A server without a Python process of its own (a benchmark command alone) is probed with the
interpreter and environment its command runs with.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from orchestrator.util.process import group_members, read_environ

PROBE_TIMEOUT_S = 120.0
_PYTHON_NAME = re.compile(r"^(?:python|pypy)[0-9.]*(?:-dbg)?$")
# Interpreter flags that change what sys.path holds: the probe runs with the same ones.
_PATH_FLAGS = set("IEsSP")

PROBE = r"""
import importlib.metadata as md, importlib.util as iu, json, os, sys
names, path0 = json.loads(sys.argv[1]), sys.argv[2]
if sys.path and sys.path[0] in ("", os.getcwd()):
    if path0 == "-":
        sys.path.pop(0)
    elif path0:
        sys.path[0] = path0
out = {}
for name in names:
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        out[name] = None
        continue
    top = (dist.read_text("top_level.txt") or "").split()
    if not top:
        top = sorted({f.parts[0][:-3] if f.parts[0].endswith(".py") else f.parts[0]
                      for f in (dist.files or []) if f.parts and (len(f.parts) > 1 or
                      f.parts[0].endswith(".py")) and not f.parts[0].endswith((".dist-info",
                      ".data")) and f.parts[0] not in ("..", "bin", "__pycache__")})
    modules = {}
    for mod in top[:8]:
        try:
            spec = iu.find_spec(mod)
        except Exception:
            spec = None
        if spec is not None and spec.origin not in (None, "namespace"):
            modules[mod] = spec.origin
    out[name] = {"version": dist.version, "location": str(dist.locate_file("")),
                 "modules": modules}
print(json.dumps(out))
"""


def _which(command: str, env: Mapping[str, str], cwd: str) -> str | None:
    if "/" in command:
        return str(Path(cwd, command)) if not os.path.isabs(command) else command
    return shutil.which(command, path=env.get("PATH", os.defpath))


def _read_link(path: str) -> str | None:
    try:
        return os.readlink(path)
    except OSError:
        return None


def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def python_invocation(cmdline: Sequence[str], cwd: str) -> tuple[list[str], str] | None:
    """(interpreter and its path flags, first sys.path entry) of a Python command line, or
    None when it is not one. The first entry is "-" when none is added (`-I`, `-P`, `-c` has
    the working directory)."""
    start = next((i for i, a in enumerate(cmdline) if _PYTHON_NAME.match(os.path.basename(a))),
                 None)
    if start is None:  # not Python (a launcher prefix such as numactl is skipped)
        return None
    cmdline = cmdline[start:]
    letters: set[str] = set()
    path0 = cwd
    i = 1
    while i < len(cmdline):
        arg = cmdline[i]
        if not arg.startswith("-") or arg == "-":
            if arg != "-":  # a script: its directory comes first on sys.path
                path0 = os.path.dirname(os.path.realpath(os.path.join(cwd, arg)))
            break
        if arg in ("-X", "-W", "--check-hash-based-pycs"):
            i += 2
            continue
        if arg.startswith("--"):
            i += 1
            continue
        head = re.split("[mcXW]", arg[1:], maxsplit=1)[0]  # `-Im mod`: -I, then -m
        letters |= set(head) & _PATH_FLAGS
        if len(head) < len(arg) - 1 and arg[1 + len(head)] in "mc":
            break
        i += 1
    flags = ["-" + "".join(sorted(letters))] if letters else []
    if letters & {"I", "P"}:
        path0 = "-"
    return [cmdline[0], *flags], path0


def run_probe(python: Sequence[str], env: Mapping[str, str], cwd: str, path0: str,
              names: Sequence[str]) -> dict[str, dict | None]:
    """Run the probe; raises RuntimeError with one line when it cannot tell."""
    argv = [*python, "-c", PROBE, json.dumps(list(names)), path0]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, env=dict(env), cwd=cwd,
                              timeout=PROBE_TIMEOUT_S, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RuntimeError(f"the package probe could not run ({python[0]}): {exc}") from exc
    lines = [ln for ln in done.stdout.splitlines() if ln.strip()]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"the package probe failed ({python[0]}, exit {done.returncode}):"
                           f" {tail[:300]}")
    return json.loads(lines[-1])


def mapped_libraries(pids: Iterable[int], basenames: Iterable[str]) -> dict[str, list[str]]:
    """`{basename: [files mapped under that name]}` in the processes' `/proc/<pid>/maps`."""
    wanted = set(basenames)
    found: dict[str, set[str]] = {}
    if not wanted:
        return {}
    for pid in pids:
        try:
            text = Path(f"/proc/{pid}/maps").read_text(errors="replace")
        except OSError:
            continue
        for line in text.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[5].startswith("/"):
                path = parts[5].removesuffix(" (deleted)")
                if os.path.basename(path) in wanted:
                    found.setdefault(os.path.basename(path), set()).add(path)
    return {k: sorted(v) for k, v in found.items()}


def report_of_process(pid: int, pgid: int, names: Sequence[str], libraries: Sequence[str],
                      fallback_python: str) -> dict:
    """What the server group of `pid` imported: the probe under its first Python process's
    own invocation, environment and working directory, and the native libraries it mapped."""
    pids = [pid, *[p for p in group_members(pgid) if p != pid]]
    chosen = None
    for p in pids:
        cwd = _read_link(f"/proc/{p}/cwd")
        argv = _cmdline(p)
        try:
            env = read_environ(p)
        except OSError:
            continue
        if cwd is None or not argv:
            continue
        invocation = python_invocation(argv, cwd)
        if invocation is not None:
            python, path0 = invocation
            resolved = _which(python[0], env, cwd)
            if resolved:
                chosen = ([resolved, *python[1:]], env, cwd, path0, p)
                break
    if chosen is None:  # no Python process in the group (yet): its environment, our Python
        env = read_environ(pid)
        cwd = _read_link(f"/proc/{pid}/cwd") or "/"
        chosen = ([fallback_python], env, cwd, cwd, pid)
    python, env, cwd, path0, probed = chosen
    return {"source": f"probe of pid {probed} ({python[0]})",
            "packages": run_probe(python, env, cwd, path0, names),
            "libraries": mapped_libraries(pids, libraries)}


def report_of_command(argv: Sequence[str], env: Mapping[str, str], cwd: str,
                      names: Sequence[str], fallback_python: str) -> dict:
    """What the command `argv`, started with `env` in `cwd`, imports: a benchmark command
    without a server process to read runs with exactly this interpreter and environment (a
    wrapper inside the command that changes them is not seen). A command that is not a Python
    command line is probed with `fallback_python`."""
    invocation = python_invocation(argv, cwd)
    python, path0 = invocation if invocation is not None else ([fallback_python], cwd)
    resolved = _which(python[0], env, cwd) or fallback_python
    python = [resolved, *python[1:]]
    return {"source": f"probe ({python[0]})", "packages": run_probe(python, env, cwd, path0, names),
            "libraries": {}}
