"""HTTP calls to the server under test, without paying for TLS set-up on each one.

httpx builds a new SSL context (it loads the whole CA bundle: 10-50 ms of CPU) for every
`httpx.get` and every new client, even for a plain `http://` URL. A trial makes dozens of them
(readiness polls, a metrics scrape before and after every repetition, one client per
repetition), which on the simulated node cost more than the modeled server time. One context,
made on first use and shared by every call of the process, has the same settings httpx would
have made each time (certifi's bundle; `trust_env` off, as every sleuth call has it).
"""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls_context() -> ssl.SSLContext:
    """The process's one verifying SSL context (thread-safe to share; made once)."""
    return httpx.create_ssl_context(trust_env=False)


def get(url: str, *, timeout: float) -> httpx.Response:
    return httpx.get(url, timeout=timeout, trust_env=False, verify=tls_context())


def post(url: str, *, timeout: float, **kwargs) -> httpx.Response:
    return httpx.post(url, timeout=timeout, trust_env=False, verify=tls_context(), **kwargs)


def async_client(**kwargs) -> httpx.AsyncClient:
    return httpx.AsyncClient(trust_env=False, verify=tls_context(), **kwargs)
