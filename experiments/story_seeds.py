"""The system-level stories, once per scenario seed: causes right, and the exit code.

Runs the end-to-end story tests (`tests/test_investigate_stories.py`, the NCCL release line of
`tests/test_package_bisect_e2e.py`) once per seed with `SLEUTH_STORY_SEED=N`, each test writing
one line per run to a JSON-lines record (`SLEUTH_STORY_RECORD`: the story, the seed, the exit
code, the causes named and whether they are the planted ones, the answer's first line and the
restarts it spent), then prints the table docs/system-level.md shows:

    python -m experiments.story_seeds --seeds 1-20 --record runs/story-seeds.jsonl
    python -m experiments.story_seeds --table runs/story-seeds.jsonl

Each seed runs every story on sim servers and a local Ray: minutes per seed on an idle machine,
far more on a busy one. A record already holding a (story, seed) is not run again for it, so an
interrupted series continues where it stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

TESTS = ("tests/test_investigate_stories.py",
         "tests/test_package_bisect_e2e.py::test_sim_investigate_names_the_nccl_release[run]")
STORIES = ("code_under_system", "env_overlap", "env_synergy", "node_change_investigate",
           "node_change_isolate", "release_line[run]")
# What a right answer exits with where the truth has no remainder; the node changes hold one
# (the lock set mid-run is part of the change and not a tested cause): 5 there.
EXPECTED = {"node_change_investigate": 5, "node_change_isolate": 5}


def _seeds(text: str) -> list[int]:
    lo, _, hi = text.partition("-")
    return list(range(int(lo), int(hi or lo) + 1))


def _rows(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(seeds: list[int], record: Path, timeout: int) -> None:
    record.parent.mkdir(parents=True, exist_ok=True)
    for seed in seeds:
        done = {r["story"] for r in _rows(record) if r["seed"] == seed}
        if set(STORIES) <= done:
            continue
        env = {**os.environ, "SLEUTH_STORY_SEED": str(seed),
               "SLEUTH_STORY_RECORD": str(record.resolve())}
        cmd = [sys.executable, "-m", "pytest", *TESTS, "-q", "-p", "no:cacheprovider",
               f"--timeout={timeout}"]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        tail = out.stdout.strip().splitlines()[-1:] or ["(no output)"]
        print(f"seed {seed}: pytest exit {out.returncode}: {tail[0]}", flush=True)
        missing = set(STORIES) - {r["story"] for r in _rows(record) if r["seed"] == seed}
        for story in sorted(missing):  # a run that ended before its answer: said, not hidden
            with record.open("a") as f:
                f.write(json.dumps({"story": story, "seed": seed, "code": None, "right": None,
                                    "causes": [], "status": "no answer (see pytest output)",
                                    "headline": None, "trials": None}) + "\n")


def table(record: Path) -> str:
    by: dict[str, list[dict]] = defaultdict(list)
    for r in _rows(record):
        by[r["story"]].append(r)
    lines = ["| story | runs | causes right | exit 0 | exit 3 | exit 4 | exit 5 | other |"
             " exit 0 with a wrong cause | expected exit | restarts median (min-max) |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for story in STORIES:
        rows = by.get(story, [])
        if not rows:
            continue
        codes = [r["code"] for r in rows]
        trials = sorted(r["trials"] for r in rows if r.get("trials"))
        median = trials[len(trials) // 2] if trials else "-"
        span = f"{median} ({trials[0]}-{trials[-1]})" if trials else "-"
        lines.append(
            f"| `{story}` | {len(rows)} | {sum(1 for r in rows if r['right'])} |"
            f" {codes.count(0)} | {codes.count(3)} | {codes.count(4)} | {codes.count(5)} |"
            f" {sum(1 for c in codes if c not in (0, 3, 4, 5))} |"
            f" {sum(1 for r in rows if r['code'] == 0 and not r['right'])} |"
            f" {EXPECTED.get(story, 0)} | {span} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", default="1-20")
    parser.add_argument("--record", type=Path, default=Path("runs/story-seeds.jsonl"))
    parser.add_argument("--timeout", type=int, default=1800, help="per test, seconds")
    parser.add_argument("--table", type=Path, help="print the table of a record and exit")
    args = parser.parse_args(argv)
    if args.table:
        print(table(args.table))
        return 0
    run(_seeds(args.seeds), args.record, args.timeout)
    print(table(args.record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
