"""Overlays install from exactly the configured source, say which file they came from, and are
checked when reused: real pip, real wheels, pip configuration planted in every place pip
reads one (a `PIP_CONFIG_FILE`, the global files under `XDG_CONFIG_DIRS`, the user's under
`HOME`, a virtual environment's own `pip.conf`, and the `PIP_*` variables)."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.packages import integrity
from orchestrator.packages.overlay import OverlayCache, OverlayError, OverlaySettings
from orchestrator.packages.wheels import write_wheel


def _wheel(out: Path, version: str, marker: str) -> Path:
    return write_wheel(out, "slowpkg", version, {"slowpkg/__init__.py": f"WHO = {marker!r}\n"})


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture()
def planted(tmp_path, monkeypatch):
    """A good wheel directory, and a second source holding another `slowpkg 1.5` that pip's
    configuration names from everywhere it can."""
    good = tmp_path / "good"
    evil = tmp_path / "evil"
    good_wheel = _wheel(good, "1.5", "good")
    _wheel(evil, "1.5", "evil")
    _wheel(evil, "9.9", "evil")
    conf = f"[global]\nfind-links = {evil}\nno-index = true\n"
    (tmp_path / "env.conf").write_text(conf)
    (tmp_path / "xdg" / "pip").mkdir(parents=True)
    (tmp_path / "xdg" / "pip" / "pip.conf").write_text(conf)  # a "global" configuration
    (tmp_path / "home" / ".config" / "pip").mkdir(parents=True)
    (tmp_path / "home" / ".config" / "pip" / "pip.conf").write_text(conf)  # the user's
    monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "env.conf"))
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "xdg"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("PIP_FIND_LINKS", str(evil))
    monkeypatch.setenv("PIP_EXTRA_INDEX_URL", evil.as_uri())
    return good, evil, good_wheel


def _venv_with_site_config(tmp_path: Path, evil: Path) -> str:
    """A virtual environment whose own `pip.conf` (pip's "site" file) points at `evil`."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages",
                    str(venv)], check=True, capture_output=True)
    (venv / "pip.conf").write_text(f"[global]\nfind-links = {evil}\nno-index = true\n")
    return str(venv / "bin" / "python")


def _who(overlay) -> str:
    return (overlay.path / "slowpkg" / "__init__.py").read_text()


def test_a_configured_source_is_the_only_source_whatever_pip_conf_says(tmp_path, planted):
    good, evil, good_wheel = planted
    python = _venv_with_site_config(tmp_path, evil)
    # The planted configuration is live: pip on its own installs the other 1.5.
    probe = subprocess.run([python, "-m", "pip", "download", "--no-deps", "-d",
                            str(tmp_path / "dl"), "slowpkg==1.5"], capture_output=True, text=True)
    assert probe.returncode == 0, probe.stderr
    assert _sha256(next((tmp_path / "dl").glob("*.whl"))) != _sha256(good_wheel)

    cache = OverlayCache(OverlaySettings(str(tmp_path / "cache"), find_links=(str(good),)))
    for interpreter in (sys.executable, python):
        overlay = cache.ensure("slowpkg==1.5", interpreter)
        assert _who(overlay) == "WHO = 'good'\n"
        # The findings' record: the file it came from, and that file's sha256.
        assert overlay.origin == good_wheel.as_uri()
        assert overlay.sha256 == _sha256(good_wheel)
        assert overlay.source() == {"file": good_wheel.as_uri(), "sha256": _sha256(good_wheel)}
    # A version only the planted source has is not installable from the configured one.
    with pytest.raises(OverlayError, match="slowpkg==9.9"):
        cache.ensure("slowpkg==9.9")


def test_without_a_configured_source_pips_own_configuration_is_used_and_keyed(tmp_path,
                                                                             planted,
                                                                             monkeypatch):
    _good, evil, _ = planted
    cache = OverlayCache(OverlaySettings(str(tmp_path / "cache")))
    overlay = cache.ensure("slowpkg==1.5")
    assert _who(overlay) == "WHO = 'evil'\n"  # as documented: pip's configuration is the source
    assert overlay.origin.startswith(evil.as_uri())
    first = cache.key("slowpkg==1.5", sys.executable)
    # Another configuration is another source: not the same cache entry.
    other = tmp_path / "other"
    _wheel(other, "1.5", "other")
    monkeypatch.setenv("PIP_FIND_LINKS", str(other))
    assert cache.key("slowpkg==1.5", sys.executable) != first


def test_a_tampered_overlay_is_found_and_rebuilt(tmp_path, planted):
    good, _evil, good_wheel = planted
    cache = OverlayCache(OverlaySettings(str(tmp_path / "cache"), find_links=(str(good),)))
    overlay = cache.ensure("slowpkg==1.5")
    module = overlay.path / "slowpkg" / "__init__.py"
    # Swapped code, with the modification time put back as it was (`touch -r`).
    st = module.stat()
    module.write_text("WHO = 'swap'\n")
    os.utime(module, ns=(st.st_atime_ns, st.st_mtime_ns))
    again = cache.ensure("slowpkg==1.5")
    assert _who(again) == "WHO = 'good'\n"
    assert "does not match its RECORD hash" in again.repaired
    assert again.source()["rebuilt"] == again.repaired
    # Its dist-info removed: the server would import the node's version instead.
    for info in again.path.glob("*.dist-info"):
        for f in info.iterdir():
            f.unlink()
        info.rmdir()
    third = cache.ensure("slowpkg==1.5")
    assert "no slowpkg *.dist-info" in third.repaired and _who(third) == "WHO = 'good'\n"
    assert third.sha256 == _sha256(good_wheel)
    # A file pip never put there.
    (third.path / "slowpkg" / "extra.py").write_text("x = 1\n")
    assert "not one of the files pip installed" in cache.ensure("slowpkg==1.5").repaired
    # Intact: reused as it is, without a rebuild.
    intact = cache.ensure("slowpkg==1.5")
    assert intact.repaired == "" and intact.path == third.path


def test_a_damaged_overlay_that_cannot_be_rebuilt_is_one_line_naming_it(tmp_path, planted):
    good, _evil, good_wheel = planted
    cache = OverlayCache(OverlaySettings(str(tmp_path / "cache"), find_links=(str(good),)))
    overlay = cache.ensure("slowpkg==1.5")
    (overlay.path / "slowpkg" / "__init__.py").write_text("WHO = 'swap'\n")
    good_wheel.unlink()  # the source no longer has it
    with pytest.raises(OverlayError) as raised:
        cache.ensure("slowpkg==1.5")
    line = str(raised.value)
    assert "\n" not in line
    assert f"the cached overlay of slowpkg==1.5 ({overlay.path}) is damaged" in line
    assert "could not be rebuilt" in line


def test_the_signature_is_cheap_and_the_record_check_is_exact(tmp_path, planted):
    good, _evil, _ = planted
    cache = OverlayCache(OverlaySettings(str(tmp_path / "cache"), find_links=(str(good),)))
    overlay = cache.ensure("slowpkg==1.5")
    assert integrity.check(overlay.path, "slowpkg") == ""
    before = integrity.signature(overlay.path)
    assert integrity.signature(overlay.path) == before
    # Bytecode Python writes itself is not damage.
    cache_dir = overlay.path / "slowpkg" / "__pycache__"
    cache_dir.mkdir(exist_ok=True)
    (cache_dir / "x.cpython-311.pyc").write_bytes(b"\0")
    assert integrity.signature(overlay.path) != before
    assert integrity.check(overlay.path, "slowpkg") == ""
    assert integrity.check(overlay.path, "otherpkg") == "no otherpkg *.dist-info in it"
