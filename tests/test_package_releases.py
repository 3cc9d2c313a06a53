"""Listing a package's releases between two versions: from a wheel directory built here and from
a real index server on loopback (PEP 691 JSON with upload times and yanks, and PEP 503 HTML),
ordered by PEP 440, pre-releases and yanked releases left out unless asked for or named; and the
release findings: which versions were measured, skipped and why, each step's direction."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pkgwheels import release_line

from orchestrator.commands import bisect_release
from orchestrator.config.compose import compose_settings
from orchestrator.config.requests import BisectRequest, InvestigateRequest
from orchestrator.errors import UserError
from orchestrator.packages.overlay import OverlaySettings
from orchestrator.packages.releases import between, list_all, releases_between


def _settings(**kw) -> OverlaySettings:
    return OverlaySettings(root="/nonexistent", **kw)


def test_directory_lists_versions_in_pep440_order_with_pre_releases_only_when_asked(tmp_path):
    versions = ["1.0", "1.2", "1.10", "1.9", "1.10rc1", "1.11.dev0", "2.0"]
    release_line(tmp_path, "Slow_Pkg", dict.fromkeys(versions, 0.0), broken=("1.9",))
    write = tmp_path / "otherpkg-1.5-py3-none-any.whl"
    write.write_bytes(b"")  # another package's file is not a release of this one
    (tmp_path / "slow_pkg-1.1.tar.gz").write_bytes(b"")  # an sdist lists its version too
    listing = releases_between(_settings(find_links=(str(tmp_path),)), "slow-pkg", "1.0",
                               "2.0", pre=False, python="python3")
    assert listing.versions == ["1.0", "1.1", "1.2", "1.9", "1.10", "2.0"]
    assert {e["version"] for e in listing.excluded} == {"1.10rc1", "1.11.dev0"}
    assert all(e["why"].startswith("pre-release") for e in listing.excluded)
    with_pre = releases_between(_settings(find_links=(str(tmp_path),)), "slow-pkg", "1.2",
                                "1.10", pre=True, python="python3")
    assert with_pre.versions == ["1.2", "1.9", "1.10rc1", "1.10"]
    named = releases_between(_settings(find_links=(str(tmp_path),)), "slow-pkg", "1.10rc1",
                             "1.10", pre=False, python="python3")
    assert named.versions == ["1.10rc1", "1.10"]  # an endpoint is searched whatever it is
    down = releases_between(_settings(find_links=(str(tmp_path),)), "slow-pkg", "2.0", "1.9",
                            pre=False, python="python3")
    assert down.versions == ["2.0", "1.10", "1.9"]  # a downgrade is searched from good to bad


def test_an_endpoint_the_source_lacks_is_one_clear_line(tmp_path):
    release_line(tmp_path, "slowpkg", {"1.0": 0.0, "1.1": 0.0})
    with pytest.raises(UserError, match=r"slowpkg 1\.5 is not in the package source .*"
                                        r"versions there: 1\.0, 1\.1"):
        releases_between(_settings(find_links=(str(tmp_path),)), "slowpkg", "1.0", "1.5",
                         pre=False, python="python3")


class _Index(BaseHTTPRequestHandler):
    """A PEP 691 index answering JSON to a client that asks for it, HTML otherwise."""

    files = [
        {"filename": "slowpkg-1.0-py3-none-any.whl", "url": "f/slowpkg-1.0-py3-none-any.whl",
         "upload-time": "2021-01-05T10:00:00.000000Z", "yanked": False},
        {"filename": "slowpkg-1.0.tar.gz", "url": "f/slowpkg-1.0.tar.gz",
         "upload-time": "2021-01-04T09:00:00Z"},
        {"filename": "slowpkg-1.1-py3-none-any.whl", "url": "f/slowpkg-1.1-py3-none-any.whl",
         "upload-time": "2021-02-01T00:00:00Z", "yanked": "broke imports"},
        {"filename": "slowpkg-1.2-py3-none-any.whl", "url": "f/slowpkg-1.2-py3-none-any.whl",
         "upload-time": "2021-03-01T00:00:00Z"},
        {"filename": "slowpkg-1.3-py3-none-any.whl", "url": "f/slowpkg-1.3-py3-none-any.whl",
         "upload-time": "2021-04-01T00:00:00Z", "yanked": True},
    ]

    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path.rstrip("/") != "/simple/slowpkg":
            self.send_error(404)
            return
        if "application/vnd.pypi.simple.v1+json" in (self.headers.get("Accept") or "") \
                and self.server.json_ok:
            body = json.dumps({"meta": {"api-version": "1.1"}, "name": "slowpkg",
                               "files": self.files}).encode()
            kind = "application/vnd.pypi.simple.v1+json"
        else:
            links = []
            for f in self.files:
                y = f.get("yanked")
                attr = "" if not y else (f' data-yanked="{y}"' if isinstance(y, str)
                                         else ' data-yanked=""')
                links.append(f'<a href="{f["url"]}#sha256=00"{attr}>{f["filename"]}</a><br/>')
            body = ("<!DOCTYPE html><html><body>" + "".join(links) + "</body></html>").encode()
            kind = "text/html"
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(params=[True, False], ids=["json", "html"])
def index(request):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    server.json_ok = request.param
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple", request.param
    finally:
        server.shutdown()
        server.server_close()


def test_index_lists_releases_with_dates_and_leaves_yanked_ones_out(index):
    url, json_api = index
    found, source = list_all(_settings(index_url=url), "slowpkg", "python3")
    assert source == url
    listing = between(found, "slowpkg", "1.0", "1.3", pre=False, source=source)
    # 1.1 is yanked (left out); 1.3 is yanked too but named: searched, as pip installs a
    # yanked release only when pinned exactly
    assert listing.versions == ["1.0", "1.2", "1.3"]
    (excluded,) = listing.excluded
    assert excluded["version"] == "1.1" and excluded["why"] == "yanked: broke imports"
    first = listing.releases[0]
    assert sorted(first.files) == ["slowpkg-1.0-py3-none-any.whl", "slowpkg-1.0.tar.gz"]
    assert first.url.startswith(url)
    if json_api:  # PEP 700 upload times: the earliest file's day is the release's date
        assert [r.date for r in listing.releases] == ["2021-01-04", "2021-03-01", "2021-04-01"]
    else:  # an HTML page has no dates: none is made up
        assert all(r.date == "" for r in listing.releases)


def test_an_index_without_the_project_lists_nothing_and_says_so(index):
    url, _ = index
    with pytest.raises(UserError, match="nosuch 1.0 is not in the package source"):
        releases_between(_settings(index_url=url), "nosuch", "1.0", "2.0", pre=False,
                         python="python3")


def test_endpoints_are_strings_as_typed_and_package_names_the_search():
    cfg = compose_settings("bisect", ["target=command", "target.bench=true", "package=Slow_Pkg",
                                    "package.pre=true", "good=1.10", "bad=2.0"])
    assert (cfg.package.name, cfg.package.pre, cfg.good, cfg.bad) == ("Slow_Pkg", True, "1.10",
                                                                       "2.0")
    req = BisectRequest.of(cfg)
    assert (req.package, req.package_pre, req.good, req.bad, req.first_parent) == (
        "Slow_Pkg", True, "1.10", "2.0", True)


class _Row:
    def __init__(self, key, outcome, detail=""):
        from orchestrator.records import Outcome

        self.candidate = type("C", (), {"key": key})()
        self.outcome = Outcome(outcome)
        self.detail = detail


def test_version_status_says_measured_skipped_with_why_and_not_needed():
    rows = [_Row("a", "ok"), _Row("a", "ok"), _Row("b", "prepare_failed",
                                                    "OverlayError: Could not find a version\nx"),
            _Row("c", "interrupted"), _Row("d", "ok"), _Row("d", "crashed", "boom")]
    status = bisect_release.version_status(rows, ["a", "b", "c", "d"], ["1", "2", "3", "4"])
    assert status == [
        {"version": "1", "measured": 2},
        {"version": "2", "measured": 0,
         "skipped": "prepare_failed: OverlayError: Could not find a version"},
        {"version": "3", "measured": 0},
        {"version": "4", "measured": 1}]


def test_step_direction_against_the_regression():
    assert bisect_release._step(+200.0, +100.0, True) == "regression"
    assert bisect_release._step(-33.0, +100.0, True) == "partial fix"
    assert bisect_release._step(-50.0, -1.0, True) == "fix"
    assert bisect_release._step(-30.0, -40.0, False) == "regression"  # throughput fell


def test_directory_as_file_url_and_pip_args_find_links(tmp_path: Path):
    release_line(tmp_path / "a", "slowpkg", {"1.0": 0.0})
    release_line(tmp_path / "b", "slowpkg", {"1.1": 0.0})
    found, _ = list_all(_settings(find_links=(f"file://{tmp_path / 'a'}",),
                                  pip_args=("--find-links", str(tmp_path / "b"))),
                        "slowpkg", "python3")
    assert sorted(str(v) for v in found) == ["1.0", "1.1"]


def test_without_a_source_pip_configuration_names_the_index(index, monkeypatch):
    """No packages.find_links or index_url: the index pip itself would use (here set by
    PIP_INDEX_URL, pip's configuration files switched off) is the one listed."""
    url, _ = index
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("PIP_INDEX_URL", url)
    monkeypatch.delenv("PIP_EXTRA_INDEX_URL", raising=False)
    monkeypatch.delenv("PIP_FIND_LINKS", raising=False)
    found, source = list_all(_settings(), "slowpkg", sys.executable)
    assert source == url and sorted(str(v) for v in found) == ["1.0", "1.1", "1.2", "1.3"]


def test_investigate_names_the_release_in_the_isolate_cause_and_can_be_turned_off():
    from orchestrator.commands import investigate_release as follow
    from orchestrator.config.settings import build

    cause = {"kind": "package", "id": "nvidia-nccl-cu12", "probability": 0.999,
             "summary": "nvidia-nccl-cu12: 2.27.5 -> 2.28.3",
             "differences": [{"factor": "package", "key": "nvidia-nccl-cu12", "good": "2.27.5",
                              "bad": None, "now": "2.28.3",
                              "label": "nvidia-nccl-cu12: 2.27.5 -> 2.28.3"}]}
    weak = {**cause, "id": "xgrammar", "probability": 0.6}
    pair = {**cause, "interaction": True, "differences": cause["differences"] * 2}
    isolate = {"findings": [weak, pair, cause]}
    assert follow.harmful_packages(isolate, 0.99) == [cause]
    assert follow._versions(cause["differences"][0]) == ("2.27.5", "2.28.3")
    off = build({"packages": {"bisect": False}, "confidence": 0.99})
    req = InvestigateRequest.of(compose_settings("investigate", ["target=sim", "good=a", "bad=b"]))
    assert follow.follow(off, req, None, None, isolate, None) is None  # nothing listed, nothing run
    release = {"verdict": "found", "package": {"versions": [
        {"version": v} for v in ("2.27.5", "2.27.7", "2.28.0", "2.28.3", "2.28.7")]},
        "findings": [
            {"kind": "package", "release": "2.28.7", "parent": "2.28.3", "step": "fix"},
            {"kind": "package", "release": "2.28.0", "parent": "2.27.7", "step": "regression",
             "date": "2025-06-01"}]}
    follow.name_release(cause, release)
    assert cause["release"] == "2.28.0"
    assert cause["label"] == ("nvidia-nccl-cu12 2.27.5 -> 2.28.3 (regression in 2.28.0 against"
                              " 2.27.7, released 2025-06-01; fix in 2.28.7 against 2.28.3)")
    from orchestrator.answer.compose import cause_label

    assert cause_label(cause) == cause["label"]


def test_package_name_is_refused_outside_bisect(tmp_path):
    from orchestrator.commands import common

    cfg = compose_settings("isolate", ["target=command", "target.bench=true", "package=slowpkg",
                                     f"runs_dir={tmp_path}"])
    with pytest.raises(UserError, match="package=slowpkg searches releases: it is for sleuth"
                                        " bisect"):
        common.check_common(cfg)


def test_a_short_sha_of_digits_keeps_its_leading_zero_and_null_stays_null():
    cfg = compose_settings("bisect", ["target=command", "target.bench=true", "good=0123456",
                                    "bad=null"])
    assert (cfg.good, cfg.bad) == ("0123456", None)
