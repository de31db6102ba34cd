"""Asking an HTTP server from the daemon: a receiver (chat, PagerDuty, a webhook,
Alertmanager), dcgm-exporter, a cloud's metadata service.

Each request is plainhttp's exchange (one connection, closed after the answer, every step
bounded) on a thread of its own. These asks come a few a second at most, so a thread each
costs nothing that matters, and the parsing the commands' client has had tested against real
servers and crafted answers is the daemon's too. The event loop never waits on the network.

Each purpose has its own lane, a bound on its requests underway at once: receivers that take
their connections and never answer fill the notifications' lane, never the one dcgm-exporter
is scraped on. The timeout counts from the call, time waiting for a place in the lane
included; the caller has its answer or TimeoutError by then, even while a name lookup still
hangs in the thread. The threads are daemon threads: a stopping daemon never waits for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Literal
from urllib.parse import quote, urljoin, urlsplit

from gpuwatch.web import plainhttp

Lane = Literal["notify", "sources"]
LANES: dict[str, threading.BoundedSemaphore] = {
    "notify": threading.BoundedSemaphore(8),
    "sources": threading.BoundedSemaphore(4),
}
MAX_REDIRECTS = 3
# What a path or query keeps as written: RFC 3986's reserved and unreserved characters, and
# '%' (already percent-encoded). Anything else (a space, a non-ASCII letter) is encoded.
SAFE = "/?#[]@!$&'()*+,;=:-._~%"


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
    lane: Lane,
    headers: dict[str, str] | None = None,
    body: bytes | None = None,
    tls: ssl.SSLContext | None = None,
    max_body: int = plainhttp.MAX_BODY,
    follow_redirects: bool = True,
) -> Answer:
    """One request to an http:// or https:// URL (user:password@ in it is sent as basic
    auth); a 307 or 308 is followed (the method and body kept), up to MAX_REDIRECTS times.
    Raises CannotConnectError, TimeoutError past `timeout`, plainhttp.HungUpError when the
    server closes without an answer, ValueError for an answer that is not HTTP, over
    `max_body`, or a URL that cannot be asked, OSError for the rest."""
    loop = asyncio.get_running_loop()
    deadline = time.monotonic() + timeout
    for _ in range(MAX_REDIRECTS + 1):
        ask = _Ask(method, url, headers or {}, body, tls, max_body, deadline)
        done: asyncio.Future[Answer] = loop.create_future()
        thread = threading.Thread(
            target=ask.run, args=(LANES[lane], loop, done), name=f"http-{lane}", daemon=True
        )
        thread.start()
        try:
            answer = await asyncio.wait_for(asyncio.shield(done), timeout + 0.5)
        except asyncio.TimeoutError:  # a name lookup still hanging: the thread ends later
            done.cancel()  # what it settles later is dropped
            raise TimeoutError(f"no answer within {timeout:g}s") from None
        location = answer.headers.get("location")
        if answer.status not in (307, 308) or not location or not follow_redirects:
            return answer
        url = urljoin(url, location)
    raise ValueError(f"more than {MAX_REDIRECTS} redirects")


@dataclass(frozen=True)
class _Ask:
    method: str
    url: str
    headers: dict[str, str]
    body: bytes | None
    tls: ssl.SSLContext | None
    max_body: int
    deadline: float

    def run(
        self,
        lane: threading.BoundedSemaphore,
        loop: asyncio.AbstractEventLoop,
        done: asyncio.Future[Answer],
    ) -> None:
        try:
            if not lane.acquire(timeout=max(0.0, self.deadline - time.monotonic())):
                raise TimeoutError("no free place to ask from within the timeout")
            try:
                result: Answer | BaseException = self._exchange()
            finally:
                lane.release()
        except Exception as exc:
            result = exc
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody waits any more
            loop.call_soon_threadsafe(_settle, done, result)

    def _exchange(self) -> Answer:
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("not an http(s) URL")
        host, address = parts.hostname, plainhttp.ascii_host(parts)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        fields = dict(self.headers)
        authorization = plainhttp.basic_auth(parts)
        if authorization is not None:
            fields.setdefault("Authorization", authorization)
        target = quote(parts.path or "/", safe=SAFE)
        if parts.query:
            target += "?" + quote(parts.query, safe=SAFE)
        host_header = plainhttp.host_and_port(parts)
        request = plainhttp.request_bytes(host_header, self.method, target, fields, self.body)
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("no time left to connect")
        try:
            sock = socket.create_connection((address, port), left)
        except TimeoutError:
            raise
        except OSError as exc:
            raise CannotConnectError(host, port, exc) from None
        try:
            if parts.scheme == "https":
                context = self.tls if self.tls is not None else _default_tls()
                sock = context.wrap_socket(sock, server_hostname=address)
            answer = plainhttp.exchange(sock, request, self.deadline, self.max_body)
        finally:
            sock.close()
        return Answer(answer.status, answer.reason, answer.msg, answer.read())


def _settle(done: asyncio.Future[Answer], result: Answer | BaseException) -> None:
    if done.done():
        return
    if isinstance(result, BaseException):
        done.set_exception(result)
    else:
        done.set_result(result)


_tls: list[ssl.SSLContext] = []
_tls_lock = threading.Lock()


def _default_tls() -> ssl.SSLContext:
    """The system's trust store, loaded once (it takes milliseconds and a few hundred KB)."""
    with _tls_lock:
        if not _tls:
            _tls.append(ssl.create_default_context())
        return _tls[0]
