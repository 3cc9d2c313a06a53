"""Which directory a run named on the command line is: `RUN` (an id under `runs_dir`) or a path.

One rule for every command that names a run (`resume`, `report`, `reference=`), kept free of
heavy imports so the refusals it makes run on the raw command line too (`config/early.py`):

- a name with a `/`, or starting with `.` or `~`, is a path: `./RUN`, `runs/RUN`, `/abs/RUN`;
- a bare name is a run id: it is looked up in `runs_dir` first; the current directory counts
  only where `runs_dir` holds no such run. With `runs_dir` left at its default, a run of that
  name in both places is ambiguous and refused in one line naming both (`./RUN` or
  `runs_dir=...` says which);
- only a directory holding `trials.db` is a run: a folder that happens to share the name is not.
"""

from __future__ import annotations

from pathlib import Path

from orchestrator.errors import UserError

DEFAULT_RUNS_DIR = "runs"


def is_run(path: Path) -> bool:
    return (path / "trials.db").is_file()


def is_path(ref: str) -> bool:
    return "/" in ref or ref.startswith((".", "~"))


def locate_run(ref: str, runs_dir: str | Path) -> Path:
    """The run directory `ref` names (resolved), or a UserError in one line."""
    if is_path(ref):
        path = Path(ref).expanduser()
        if not is_run(path):
            raise UserError(f"no run {ref!r}: expected a run directory with trials.db")
        return path.resolve()
    root = Path(runs_dir).expanduser().resolve()
    in_root, here = root / ref, Path(ref).resolve()
    found = [p for p in dict.fromkeys((in_root, here)) if is_run(p)]
    if not found:
        raise UserError(f"no run {ref!r} in {root} (runs_dir): expected a run id there or a"
                        " run directory with trials.db")
    if len(found) == 2 and str(runs_dir) == DEFAULT_RUNS_DIR:
        raise UserError(f"{ref!r} names two runs: {in_root} (runs_dir) and {here} (the current"
                        f" directory); say which: runs_dir={root} or ./{ref}")
    return found[0]
