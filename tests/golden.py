"""Golden sentences: the exact words an answer says, kept in one file per subject.

Tests check an answer through its structured fields (causes, effects, intervals, status,
flags); the wording of a sentence is pinned once, here, rather than as fragments spread over
many tests, so rewording an answer changes one file and its review shows every sentence that
moved. After a deliberate rewording, rewrite the file and read its diff:

    SLEUTH_GOLDEN=update python -m pytest tests/test_answer.py -p no:xdist

(one process: workers would write the same file at once).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

HERE = Path(__file__).parent / "golden"


def check(subject: str, name: str, text: str) -> None:
    """`text` is the sentence `name` of `subject` (tests/golden/<subject>.json) word for
    word."""
    path = HERE / f"{subject}.json"
    kept = json.loads(path.read_text()) if path.exists() else {}
    if os.environ.get("SLEUTH_GOLDEN") == "update":
        kept[name] = text
        path.write_text(json.dumps(kept, indent=1, sort_keys=True, ensure_ascii=False) + "\n")
        return
    assert name in kept, (f"no golden sentence {name!r} in {path.name}: run with"
                          " SLEUTH_GOLDEN=update to write it, then read the diff")
    assert text == kept[name], (f"the sentence {name!r} changed (tests/golden/{path.name}):\n"
                                f"  golden: {kept[name]}\n  now:    {text}\nrun with"
                                " SLEUTH_GOLDEN=update if the change is meant")
