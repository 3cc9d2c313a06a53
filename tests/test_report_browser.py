"""`sleuth report` on a real bisect, opened in real headless Chromium.

One real run per module: a small git repo whose culprit commit's subject carries `<script>`,
bisected with real sim servers on two Ray nodes, then reported. The page is loaded through the
DevTools protocol (a minimal WebSocket client below, standard library only): console errors and
exceptions are collected, a screenshot is taken, and the DOM is queried for the findings table,
the decoded plots and the commit subject rendered as text.

Chromium is whatever the machine has (`.ci/run` installs Debian's `chromium` where it can); the
browser tests skip, saying why, where there is none. No test installs packages.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import os
import shutil
import socket
import struct
import subprocess
import time
import urllib.request
from urllib.parse import urlparse

import matplotlib.image
import pytest
from conftest import git

from orchestrator.cli import run as cli_run
from orchestrator.commands import bisect, parts
from orchestrator.config.compose import compose_settings
from orchestrator.records import Candidate
from orchestrator.ui.progress import Progress

pytestmark = pytest.mark.e2e

FAST = ["target=sim", "target.time_scale=0.02", "target.load_seconds=5", "bench.requests=2",
        "bench.output_len=32", "bench.input_len=32", "bench.warmup_requests=1",
        "bench.repetitions=2", "trial.ready_timeout_s=30"]
EVIL_SUBJECT = "verify: <script>document.title='pwned'</script> & <b>fast</b> | path"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update",
                  "--disable-sync", "--window-size=1280,1800", "--remote-debugging-port=0",
                  "--remote-allow-origins=*"]


# -- a real run ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_run(tmp_path_factory, ray_session):
    """A finished bisect over 8 commits (culprit at 5, its subject holding `<script>`)."""
    tmp = tmp_path_factory.mktemp("report_real")
    repo = tmp / "repo"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    shas = []
    for i in range(8):
        (repo / "sim_profile.json").write_text(json.dumps({"verify_mult": 1.5} if i >= 5 else {}))
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "--allow-empty", "-m", EVIL_SUBJECT if i == 5 else f"commit {i}")
        shas.append(git(repo, "rev-parse", "HEAD"))
    cfg = compose_settings("bisect", [f"repo={repo}", f"runs_dir={tmp / 'runs'}", f"good={shas[0]}",
                                    f"bad={shas[-1]}", "metric=verify_ms", "nodes=2",
                                    "run_id=real", *FAST])
    assert bisect.run(cfg) == 0
    terminal = io.StringIO()
    with contextlib.redirect_stdout(terminal):
        assert cli_run(["report", "real", f"runs_dir={tmp / 'runs'}"]) == 0
    return {"run_dir": tmp / "runs" / "real", "culprit": shas[5], "repo": repo,
            "terminal": terminal.getvalue()}


def test_report_files_of_a_real_bisect(real_run):
    run_dir = real_run["run_dir"]
    for name in ("report.md", "report.html", "plots/distributions.png", "plots/posterior.png",
                 "plots/phases.png", "plots/timeline.png"):
        assert (run_dir / name).is_file(), name
    md = (run_dir / "report.md").read_text()
    assert real_run["culprit"][:12] in md
    assert "&lt;script>" in md and "<script>" not in md
    # The terminal tables name the culprit with its probability, and the paths of both files.
    out = real_run["terminal"]
    assert real_run["culprit"][:12] in out and ">0.999" in out
    assert str(run_dir / "report.html") in out and str(run_dir / "report.md") in out


def test_progress_follows_a_real_controller(real_run, tmp_path):
    """The controller's real event lines drive the progress counters and durations."""
    from rich.console import Console

    from orchestrator.commands.parts import create_run
    from orchestrator.control.controller import Controller

    cfg = compose_settings("trial", [f"repo={real_run['repo']}", f"runs_dir={tmp_path / 'runs'}",
                                   "nodes=1", *FAST])
    run_dir, store = create_run(cfg)
    buf = io.StringIO()
    progress = Progress(Console(file=buf, width=200), total_hint=2, live=False)
    try:
        with progress, Controller(parts.control(cfg), store, run_dir, on_event=progress.on_event) as ctl:
            ctl.submit(Candidate.make(real_run["culprit"]))
            row = next(rows[0] for rows in iter(ctl.wait, None) if rows)
            snap = progress.snapshot()
    finally:
        store.close()
    assert row.outcome.value == "ok"
    assert snap.done == 1 and snap.ok == 1 and not snap.running and snap.nodes == ("local-0",)
    assert snap.mean_duration == pytest.approx(row.ended_at - row.started_at, abs=0.1)
    assert snap.eta_s == pytest.approx(snap.mean_duration, rel=0.01)  # one trial left, one node
    assert "progress: 1/~2 trials done (1 ok, 0 failed)" in buf.getvalue()


# -- headless Chromium over the DevTools protocol ------------------------------------------------

def chromium_binary() -> str:
    """A Chromium already on this machine (`SLEUTH_CHROMIUM`, else `chromium` on PATH). A test
    never installs packages: `.ci/run` installs Debian's chromium where it can, elsewhere these
    tests skip and say why."""
    found = (os.environ.get("SLEUTH_CHROMIUM") or shutil.which("chromium")
             or shutil.which("chromium-browser"))
    if not found:
        pytest.skip("no Chromium on this machine (install Debian's `chromium`, or point"
                    " SLEUTH_CHROMIUM at a binary, to run the browser tests)")
    return found


class WebSocket:
    """The client half of RFC 6455, just enough for the DevTools protocol (text frames)."""

    def __init__(self, url: str, timeout: float = 30.0):
        parsed = urlparse(url)
        self.sock = socket.create_connection((parsed.hostname, parsed.port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall((f"GET {parsed.path} HTTP/1.1\r\nHost: {parsed.netloc}\r\n"
                           "Upgrade: websocket\r\nConnection: Upgrade\r\n"
                           f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        self.reader = self.sock.makefile("rb")
        status = self.reader.readline()
        assert b" 101 " in status, status
        while self.reader.readline() not in (b"\r\n", b""):
            pass

    def _frame(self, opcode: int, payload: bytes) -> None:
        mask = os.urandom(4)
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.sock.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload)))

    def send(self, text: str) -> None:
        self._frame(0x1, text.encode())

    def _read(self, n: int) -> bytes:
        data = self.reader.read(n)
        if len(data) != n:
            raise ConnectionError("websocket closed")
        return data

    def recv(self) -> str:
        message = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._read(8))[0]
            mask = self._read(4) if b1 & 0x80 else None
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x9:
                self._frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("websocket closed by the browser")
            message += payload
            if b0 & 0x80:
                return message.decode()

    def close(self) -> None:
        self.sock.close()


class Page:
    """One Chromium page driven over DevTools: calls, and every console problem it reports."""

    def __init__(self, ws: WebSocket):
        self.ws, self.next_id, self.events = ws, 0, []

    def call(self, method: str, **params):
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.next_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            assert time.monotonic() < deadline, f"no {method} within {timeout}s"
            self.events.append(json.loads(self.ws.recv()))
        return next(e for e in self.events if e.get("method") == method)

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def console_errors(self) -> list[str]:
        errors = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                errors.append(json.dumps(p.get("exceptionDetails", {}))[:300])
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append(json.dumps(p.get("args", []))[:300])
            elif m == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(p["entry"].get("text", "")[:300])
        return errors


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium with a fresh profile; yields a function that opens a page."""
    binary = chromium_binary()
    profile = tmp_path_factory.mktemp("chromium-profile")
    proc = subprocess.Popen([binary, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    sockets: list[WebSocket] = []
    try:
        port_file = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not (port_file.is_file() and port_file.read_text().strip()):
            assert proc.poll() is None, f"chromium exited with {proc.returncode}"
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])

        def open_page(url: str) -> Page:
            req = urllib.request.Request(f"http://127.0.0.1:{port}/json/new?about:blank",
                                         method="PUT")
            with urllib.request.urlopen(req, timeout=30) as resp:
                target = json.loads(resp.read())
            ws = WebSocket(target["webSocketDebuggerUrl"])
            sockets.append(ws)
            page = Page(ws)
            for domain in ("Page", "Runtime", "Log"):
                page.call(f"{domain}.enable")
            page.call("Page.navigate", url=url)
            page.wait_for("Page.loadEventFired")
            time.sleep(0.3)  # let late console messages arrive
            page.call("Runtime.evaluate", expression="1")  # drains events queued meanwhile
            return page

        yield open_page
    finally:
        for ws in sockets:
            ws.close()
        os.killpg(proc.pid, 9)
        proc.wait(timeout=30)


def test_harness_sees_console_errors(browser, tmp_path):
    """The console check can fail: a page that logs an error and breaks its policy is caught."""
    page_path = tmp_path / "bad.html"
    page_path.write_text(
        "<!DOCTYPE html><html><head><meta http-equiv=\"Content-Security-Policy\" "
        "content=\"default-src 'none'; script-src 'unsafe-inline'\"></head><body>"
        "<script>console.error('deliberate')</script><img src=\"https://example.invalid/x.png\">"
        "</body></html>")
    errors = browser(page_path.as_uri()).console_errors()
    assert any("deliberate" in e for e in errors), errors
    assert len(errors) >= 2, errors  # the blocked image is reported too


def test_report_html_in_headless_chromium(real_run, browser):
    run_dir = real_run["run_dir"]
    page = browser((run_dir / "report.html").as_uri())
    shot = base64.b64decode(page.call("Page.captureScreenshot", format="png")["data"])
    (run_dir / "report-screenshot.png").write_bytes(shot)
    assert shot.startswith(b"\x89PNG")
    pixels = matplotlib.image.imread(io.BytesIO(shot))
    assert pixels.shape[1] == 1280
    assert (pixels[..., :3].mean(axis=2) < 0.5).mean() > 0.005  # text and plots, not a blank page
    assert page.console_errors() == []
    assert page.evaluate("document.title") == "sleuth report real"  # the subject's script never ran
    assert page.evaluate("document.querySelectorAll('script').length") == 0
    # The findings table: one row per finding, the culprit first with its subject as text.
    cells = page.evaluate("Array.from(document.querySelectorAll('#findings tbody tr:first-child td'))"
                          ".map(td => td.textContent)")
    assert cells[2] == real_run["culprit"][:12]
    assert EVIL_SUBJECT in cells[-1]
    subject = page.evaluate("document.querySelector('#finding-1 .subject').textContent")
    assert subject == EVIL_SUBJECT
    assert page.evaluate("document.querySelectorAll('#finding-1 .subject *').length") == 0
    # Every plot is an embedded PNG the browser decoded.
    plots = page.evaluate("Array.from(document.images).map(i => [i.closest('figure').id,"
                          " i.src.slice(0, 22), i.complete && i.naturalWidth > 100])")
    ids = {p[0] for p in plots}
    assert {"plot-distributions", "plot-posterior", "plot-phases", "plot-timeline"} <= ids
    assert all(p[1] == "data:image/png;base64," and p[2] for p in plots), plots
