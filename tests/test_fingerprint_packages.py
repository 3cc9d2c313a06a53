"""The installed-package listing in a fingerprint is read once and kept until the site
directories change: an install, upgrade or removal between two trials is in the second one's
fingerprint, and a listing read while a directory was changing is never kept."""

from __future__ import annotations

import importlib.metadata
import os
import sys
import time
from pathlib import Path

import pytest

from orchestrator.system import fingerprint


def fake_dist(site: Path, name: str, version: str) -> Path:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    return info


def age(path: Path, seconds: float = 60.0) -> None:
    """Set a directory's mtime in the past (as an install long ago would have left it)."""
    past = time.time() - seconds
    os.utime(path, (past, past))


@pytest.fixture()
def site(tmp_path: Path, monkeypatch) -> Path:
    """A site directory of our own in front of the standard library's (the only paths left, so
    no other directory changing meanwhile can decide a test), and an empty listing cache."""
    site = tmp_path / "site-packages"
    site.mkdir()
    stdlib = [p for p in sys.path if p.startswith(sys.base_prefix) and "-packages" not in p]
    monkeypatch.setattr(sys, "path", [str(site), *stdlib])
    monkeypatch.setattr(fingerprint, "_listing", None)
    return site


@pytest.fixture()
def reads(monkeypatch) -> list[int]:
    """How many times the distributions were listed (each listing parses every METADATA)."""
    count: list[int] = []
    original = importlib.metadata.distributions

    def counted(*args, **kwargs):
        count.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(importlib.metadata, "distributions", counted)
    return count


def test_the_listing_is_what_importlib_metadata_lists(site):
    fake_dist(site, "Flashinfer-Python", "0.4.1")
    direct = {d.metadata["Name"].lower(): d.version for d in importlib.metadata.distributions()
              if d.metadata["Name"]}
    assert fingerprint.all_packages() == dict(sorted(direct.items()))
    assert fingerprint.all_packages()["flashinfer-python"] == "0.4.1"


def test_unchanged_site_directories_are_not_read_again(site, reads):
    fake_dist(site, "torch", "2.9.0")
    age(site)
    first = fingerprint.all_packages()
    second = fingerprint.all_packages()
    assert len(reads) == 1
    assert first == second and first["torch"] == "2.9.0"
    second["torch"] = "edited by a caller"
    assert fingerprint.all_packages()["torch"] == "2.9.0"  # callers get copies


@pytest.mark.parametrize("change", ["install", "upgrade", "remove"])
def test_a_change_of_site_packages_is_in_the_next_fingerprint(site, reads, change):
    old = fake_dist(site, "sglang", "0.5.9")
    age(site)
    assert fingerprint.all_packages()["sglang"] == "0.5.9"
    if change == "install":
        fake_dist(site, "flashinfer-python", "0.4.1")
    elif change == "upgrade":  # what pip does: the old .dist-info goes, the new one comes
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
        fake_dist(site, "sglang", "0.5.23")
    else:
        for f in old.iterdir():
            f.unlink()
        old.rmdir()
    after = fingerprint.all_packages()
    assert len(reads) == 2
    expected = {"install": ("flashinfer-python", "0.4.1"), "upgrade": ("sglang", "0.5.23")}
    if change in expected:
        name, version = expected[change]
        assert after[name] == version
    else:
        assert "sglang" not in after


def test_a_listing_read_while_a_directory_was_changing_is_not_kept(site, reads):
    fake_dist(site, "triton", "3.5.0")  # the directory changed just now
    fingerprint.all_packages()
    fingerprint.all_packages()
    assert len(reads) == 2  # an install finishing in the same tick would not show in its mtime
    age(site)
    fingerprint.all_packages()
    fingerprint.all_packages()
    assert len(reads) == 3


def test_a_new_import_path_is_a_new_signature(site, tmp_path, reads, monkeypatch):
    age(site)
    fingerprint.all_packages()
    other = tmp_path / "other-site"
    other.mkdir()
    fake_dist(other, "transformers", "4.57.0")
    age(other)
    monkeypatch.setattr(sys, "path", [str(other), *sys.path])
    assert fingerprint.all_packages()["transformers"] == "4.57.0"
    assert len(reads) == 2


def test_key_versions_match_names_as_pep_503_compares_them(site):
    fake_dist(site, "flashinfer_python", "0.4.1")
    fake_dist(site, "sgl.kernel", "0.3.16")
    versions = fingerprint.package_versions(("flashinfer-python", "sgl-kernel", "absent-pkg"))
    assert versions == {"flashinfer-python": "0.4.1", "sgl-kernel": "0.3.16"}


def test_collect_records_the_cached_listing(site):
    fake_dist(site, "torch", "2.9.0")
    fp = fingerprint.collect(commit="a" * 40, patches=[], requested_env={}, server_env={},
                             node="local-0")
    assert fp["packages"]["torch"] == "2.9.0"
    assert fp["key_versions"]["torch"] == "2.9.0"


def test_a_separate_sglang_interpreter_is_listed_again_when_its_site_changes(tmp_path,
                                                                            monkeypatch):
    """target.python: the server's own interpreter is asked once, and again after an upgrade."""
    import subprocess

    from orchestrator.targets import sglang as sglang_target
    from orchestrator.targets.base import NodeContext
    from orchestrator.targets.registry import make_target

    site = tmp_path / "server-site"
    site.mkdir()
    fake_dist(site, "sglang", "0.5.9")
    age(site)
    python = tmp_path / "python"
    python.write_text(f"#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} \"$@\"\n")
    python.chmod(0o755)
    runs: list[int] = []
    real_run = subprocess.run

    def counted(*args, **kwargs):
        runs.append(1)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(sglang_target.subprocess, "run", counted)
    target = make_target({"name": "sglang", "python": str(python)}, {},
                         NodeContext(name="n", state_dir=tmp_path / "node"))
    assert target.node_packages()["sglang"] == "0.5.9"
    assert target.node_packages()["sglang"] == "0.5.9"
    assert len(runs) == 1
    for f in (site / "sglang-0.5.9.dist-info").iterdir():
        f.unlink()
    (site / "sglang-0.5.9.dist-info").rmdir()
    fake_dist(site, "sglang", "0.5.23")  # upgraded between two trials
    assert target.node_packages()["sglang"] == "0.5.23"
    assert len(runs) == 2
