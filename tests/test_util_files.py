"""util.files.write_atomic: the old contents or the new, and no temporary left on failure."""

from __future__ import annotations

import pytest

from orchestrator.util.files import write_atomic


def test_a_write_replaces_the_file_whole(tmp_path):
    path = tmp_path / "findings.json"
    path.write_text("old")
    write_atomic(path, "new")
    assert path.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["findings.json"]


def test_a_failed_write_keeps_what_was_there_and_leaves_no_temporary(tmp_path):
    taken = tmp_path / "state.json"
    taken.mkdir()  # the rename cannot replace a directory
    (taken / "inside").write_text("kept")
    with pytest.raises(OSError):
        write_atomic(taken, "{}")
    assert (taken / "inside").read_text() == "kept"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state.json"]
