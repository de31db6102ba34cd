"""Asking an HTTP server from the daemon: a receiver (chat, PagerDuty, a webhook,
Alertmanager), dcgm-exporter, a cloud's metadata service.

Each request is plainhttp's exchange (one connection, closed after the answer, every step
bounded, the whole within the timeout) on a thread of a small pool of its own. These asks
come a few a second at most, so a thread each costs nothing that matters, and the parsing
that the commands' client has had tested against real servers and crafted answers is the
daemon's too. The event loop never waits on the network; a request whose caller has gone
still ends by its deadline.
"""

from __future__ import annotations

import asyncio
import base64
import os
import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from gpuwatch.web import plainhttp

MAX_AT_ONCE = 8  # requests underway at once; more wait for a thread
_pool: list[ThreadPoolExecutor] = []


class CannotConnectError(OSError):
    """No connection to host:port; `why` says what the system said."""

    def __init__(self, host: str, port: int, error: OSError) -> None:
        self.host, self.port = host, port
        self.why = os.strerror(error.errno) if error.errno else str(error) or type(error).__name__
        super().__init__(f"cannot connect to {host}:{port}: {self.why}")
        self.errno = error.errno


@dataclass(frozen=True)
class Answer:
    status: int
    reason: str
    headers: dict[str, str]  # names lower-cased
    body: bytes


async def fetch(
    method: str,
    url: str,
    *,
    timeout: float,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    tls: ssl.SSLContext | None = None,
) -> Answer:
    """One request to an http:// or https:// URL (user:password@ in it is sent as basic
    auth). Raises CannotConnectError, TimeoutError past `timeout`, plainhttp.HungUpError
    when the server closes without an answer, ValueError for an answer that is not HTTP or
    a URL that cannot be asked, OSError for the rest."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http(s) URL")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    fields = dict(headers or {})
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        fields.setdefault("Authorization", "Basic " + base64.b64encode(pair).decode())
    target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.netloc.rpartition("@")[2]
    request = plainhttp.request_bytes(host_header, method, target, fields, body)
    context = None
    if parts.scheme == "https":
        context = tls if tls is not None else _default_tls()
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(
        _threads(), _exchange, parts.hostname, port, context, request, timeout
    )


def _exchange(
    host: str, port: int, tls: ssl.SSLContext | None, request: bytes, timeout: float
) -> Answer:
    deadline = time.monotonic() + timeout
    try:
        sock = socket.create_connection((host, port), timeout)
    except TimeoutError:
        raise
    except OSError as exc:
        raise CannotConnectError(host, port, exc) from None
    try:
        if tls is not None:
            sock = tls.wrap_socket(sock, server_hostname=host)  # the handshake, in time too
        answer = plainhttp.exchange(sock, request, deadline)
    finally:
        sock.close()
    return Answer(answer.status, answer.reason, answer.msg, answer.read())


def _threads() -> ThreadPoolExecutor:
    if not _pool:
        _pool.append(ThreadPoolExecutor(MAX_AT_ONCE, thread_name_prefix="http-client"))
    return _pool[0]


_tls: list[ssl.SSLContext] = []


def _default_tls() -> ssl.SSLContext:
    """The system's trust store, loaded once (it takes milliseconds and a few hundred KB)."""
    if not _tls:
        _tls.append(ssl.create_default_context())
    return _tls[0]
