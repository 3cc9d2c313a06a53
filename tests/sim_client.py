"""A test's client of a running sim server: the JSON and streaming calls the tests make.

`orchestrator.targets.sim.launcher.run_sim` starts and kills the server (a scenario's old log
runs one too); what a test asks of it over HTTP lives here, beside the tests.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import time
import urllib.request
from collections.abc import Iterator

from orchestrator.targets.sim import launcher


class SimClient:
    """A running sim (`launcher.SimProcess`: port, log, status, kill) and the calls on it."""

    def __init__(self, sim: launcher.SimProcess) -> None:
        self.sim = sim

    def __getattr__(self, name: str):
        return getattr(self.sim, name)

    def get_json(self, path: str, timeout: float = 5.0) -> object:
        with urllib.request.urlopen(self.sim.base_url + path, timeout=timeout) as resp:
            return json.loads(resp.read())

    def post_json(self, path: str, doc: object, timeout: float = 30.0) -> object:
        req = urllib.request.Request(self.sim.base_url + path, json.dumps(doc).encode(),
                                     {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())

    def iter_stream(self, path: str, doc: object, timeout: float = 30.0
                    ) -> Iterator[tuple[float, dict]]:
        """POST a streaming request; yield (perf_counter at arrival, chunk JSON) until [DONE].

        A read that stalls longer than `timeout` raises TimeoutError; a dropped connection
        raises ConnectionError / http.client.IncompleteRead.
        """
        conn = http.client.HTTPConnection("127.0.0.1", self.sim.port, timeout=timeout)
        try:
            conn.request("POST", path, json.dumps(doc), {"Content-Type": "application/json"})
            resp = conn.getresponse()
            if resp.status != 200:
                raise RuntimeError(f"{path} returned {resp.status}: {resp.read()[:200]!r}")
            for raw in resp:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    resp.read()  # consume the terminating chunk so the connection closes cleanly
                    return
                yield time.perf_counter(), json.loads(data)
        finally:
            conn.close()

    def wait_exit(self, timeout: float = 30.0) -> int:
        return self.sim.process.wait(timeout=timeout)


@contextlib.contextmanager
def run_sim(*args, **kwargs) -> Iterator[SimClient]:
    """`launcher.run_sim` (same arguments), as a client."""
    with launcher.run_sim(*args, **kwargs) as sim:
        yield SimClient(sim)
