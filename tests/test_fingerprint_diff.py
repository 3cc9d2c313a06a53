"""Fingerprint diffs as the report and compare show them."""

from __future__ import annotations

import copy

from orchestrator.system.fingerprint_diff import diff


def _fingerprint(sha: str = "a" * 40, patches: dict | None = None) -> dict:
    return {"git": {"sha": sha, "patches": dict(patches or {})},
            "packages": {"torch": "2.9.1"}, "host": {"kernel": "6.8.0"}}


def test_patches_on_the_same_commit_are_named_not_shown_as_two_equal_hashes():
    """A patched candidate against its commit: the commit is the same on both sides, so the
    difference is the patches, by file name."""
    plain = _fingerprint()
    patched = _fingerprint(patches={"05-sched.patch": "h1", "11-gate.patch": "h2"})
    (code,) = diff(plain, patched)
    assert (code.category, code.key, code.reference, code.now) == (
        "code", "patches", "none", "05-sched.patch, 11-gate.patch")
    assert "aaaaaaaaaaaa" in code.detail
    edited = copy.deepcopy(patched)
    edited["git"]["patches"]["11-gate.patch"] = "h3"
    (code,) = diff(patched, edited)
    assert code.now == "05-sched.patch, 11-gate.patch (changed)"


def test_a_different_commit_is_shown_by_its_hashes():
    (code,) = diff(_fingerprint(), _fingerprint(sha="b" * 40, patches={"x.patch": "h"}))
    assert (code.key, code.reference, code.now) == ("git", "a" * 40, "b" * 40)
