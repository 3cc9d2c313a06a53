"""HTTP clients for the server under test, without paying for TLS set-up on each one.

httpx builds a new SSL context (it loads the whole CA bundle: 10-50 ms of CPU) for every
`httpx.get` and every new client, even for a plain `http://` URL. A trial makes dozens of
calls (readiness polls, a metrics scrape before and after every repetition, one client per
repetition), which on the simulated node cost more than the modeled server time. One context,
made on first use and shared by every client of the process, has the same settings httpx would
have made each time (certifi's bundle; `trust_env` off, as every sleuth call has it). The
synchronous calls of a trial go through one `client()` its target holds (`Target.http`), so
they also reuse their connections instead of opening one per call.
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one verifying SSL context (thread-safe to share; made once)."""
    return httpx.create_ssl_context(trust_env=False)


def client(**kwargs) -> httpx.Client:
    """A synchronous client on the shared context; the caller closes it."""
    return httpx.Client(trust_env=False, verify=tls_context(), **kwargs)


def async_client(**kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, verify=tls_context(), **kwargs)
