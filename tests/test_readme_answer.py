"""The README's demo shows the answer as the terminal prints it: a first line a person reads
in ten seconds (at most 200 characters), then labelled lines."""

from __future__ import annotations

import re
from pathlib import Path

from orchestrator.answer.headline import HEADLINE_CHARS

README = Path(__file__).resolve().parent.parent / "README.md"


def test_the_readme_demo_answer_opens_with_one_short_line():
    text = README.read_text()
    demo = text[text.index("$ make demo"):]
    demo = demo[:demo.index("```")]
    answers = [line for line in demo.splitlines() if line.startswith("answer: ")]
    assert answers  # the investigation's, then the live server's
    for line in answers:
        assert len(line.removeprefix("answer: ")) <= HEADLINE_CHARS, line
    first = answers[0]
    after = demo.splitlines()[demo.splitlines().index(first) + 1:]
    labelled = [line for line in after if re.match(r"^  [a-z][a-z ]+: ", line)]
    assert any(line.startswith("  left: ") for line in labelled), after[:8]
