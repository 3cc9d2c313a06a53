"""Attach to the running server: `live=PID` or `live=URL`, read as it is.

From a PID: its command line, environment and working directory (what a fresh start of the
same command needs), its workers, when it started, its memory, its log file, the port it
listens on (its `--port` flag, else what /proc shows it listening on). From a URL on this
machine: the process listening on that port, then the same. From a URL elsewhere: only what
it answers over HTTP; such a server can be measured but not restarted. Either way it must
answer `/server_info` (SGLang's, `/get_server_info` on old releases): a live measurement of
something that does not is refused (one line, exit 2), before anything is written.

The environment is kept in memory, whole, to start the same command again; only its redacted
form is ever written (`orchestrator/system/redact.py`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from orchestrator.errors import UserError
from orchestrator.live import proc
from orchestrator.util.process import read_environ

DEFAULT_PORT = 30000  # SGLang's default `--port`


@dataclass(frozen=True)
class LiveServer:
    """The running server as attached."""

    spec: str  # as given: a PID or a URL
    url: str
    pid: int | None  # None: not on this machine (or not found): measured, never restarted
    argv: tuple[str, ...] = ()
    cwd: str | None = None
    env: Mapping[str, str] = field(default_factory=dict, repr=False)  # whole: never written
    pids: tuple[int, ...] = ()  # the server and its workers
    started_at: float | None = None
    attached_at: float = 0.0
    rss_bytes: int | None = None
    log_path: str | None = None
    info: Mapping = field(default_factory=dict)  # what /server_info answered

    @property
    def uptime_s(self) -> float | None:
        return None if self.started_at is None else self.attached_at - self.started_at

    @property
    def restartable(self) -> bool:
        return self.pid is not None and bool(self.argv) and self.cwd is not None

    def flag(self, name: str) -> str | None:
        """The value of `--name` in its command line (`--name V` or `--name=V`)."""
        return flag_value(self.argv, name)


def flag_value(argv: Sequence[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _server_info(client: httpx.Client, url: str) -> dict | None:
    for path in ("/server_info", "/get_server_info"):
        try:
            r = client.get(url + path, timeout=10.0)
        except httpx.HTTPError:
            return None
        if r.status_code == 200:
            try:
                doc = r.json()
            except ValueError:
                return None
            return doc if isinstance(doc, dict) else None
    return None


def attach(spec: str) -> LiveServer:
    """The running server `spec` names (a PID or an http URL); UserError when it is not one."""
    spec = str(spec).strip()
    if spec.isdigit():
        pid = int(spec)
        if not proc.exists(pid):
            raise UserError(f"live={spec}: no such process on this machine")
        url = None
    else:
        parsed = urlparse(spec if "://" in spec else f"http://{spec}")
        if parsed.scheme not in ("http", "https") or not parsed.hostname:
            raise UserError(f"live={spec}: give the server's PID or its URL"
                            " (http://HOST:PORT)")
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        url = f"{parsed.scheme}://{parsed.hostname}:{port}"
        pid = proc.pid_on_port(port) if proc.is_local(parsed.hostname) else None
    return _read(spec, pid, url)


def _read(spec: str, pid: int | None, url: str | None) -> LiveServer:
    argv: list[str] = []
    env: dict[str, str] = {}
    cwd = log = None
    pids: list[int] = []
    started = rss = None
    if pid is not None:
        try:
            argv = proc.cmdline(pid)
            env = read_environ(pid)
        except PermissionError:
            raise UserError(f"live={spec}: pid {pid} belongs to another user: run sleuth as the"
                            " server's user (its environment is what a fresh start needs)"
                            ) from None
        except OSError as exc:
            raise UserError(f"live={spec}: pid {pid} cannot be read ({exc})") from exc
        cwd = proc.cwd(pid)
        pids = [pid, *proc.descendants(pid)]
        started = proc.started_at(pid)
        rss = proc.rss_bytes(pids)
        log = proc.output_file(pid)
        if url is None:
            url = _url_of(argv, pids)
    assert url is not None
    with httpx.Client() as client:
        info = _server_info(client, url)
    if info is None:
        where = f"pid {pid} at {url}" if pid is not None else url
        raise UserError(f"live={spec}: no SGLang server answers /server_info at {where}")
    return LiveServer(spec, url, pid, tuple(argv), cwd, env, tuple(pids), started, proc.now(),
                      rss, log, info)


def _url_of(argv: Sequence[str], pids: Sequence[int]) -> str:
    """Where the server listens: its `--host`/`--port` flags, else the first port its
    processes listen on; a wildcard host is reached on loopback."""
    host = flag_value(argv, "--host") or "127.0.0.1"
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    port_text = flag_value(argv, "--port")
    listening = proc.listening_ports(pids)
    port = int(port_text) if port_text and port_text.isdigit() else None
    if port is None or (listening and port not in listening):
        port = listening[0] if listening else (port or DEFAULT_PORT)
    return f"http://{host}:{port}"


def describe(server: LiveServer) -> list[str]:
    """What was read of it, as the run prints it (the environment by count only)."""
    where = f"pid {server.pid}" if server.pid is not None else "a server on another machine"
    head = f"live server: {where} at {server.url}, up {proc.uptime_text(server.uptime_s)}"
    if server.rss_bytes is not None:
        head += f", resident memory {server.rss_bytes / 2**30:.2f} GiB"
    lines = [head]
    if server.argv:
        from orchestrator.system.redact import redact_argv

        lines.append("  command: " + " ".join(redact_argv(list(server.argv)))[:400])
        lines.append(f"  environment: {len(server.env)} variables; working directory"
                     f" {server.cwd}; log {server.log_path or 'not a file'}")
    version = server.info.get("version")
    if version:
        lines.append(f"  /server_info: SGLang {version}")
    return lines
