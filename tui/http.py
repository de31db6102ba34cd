"""JSON over HTTP/1.1 GET with keep-alive, for the dashboard's polling.

A fleet refresh is one GET per node, 500 of them a second at 500 nodes. aiohttp's client costs
about 0.17 ms of CPU a request here; this one about 0.1 ms (bench/tui_refresh.py), which is what
brings a 500-node refresh under 100 ms. It does only what polling a JSON API needs: GET, a
Content-Length or chunked body, keep-alive with a pool per host, TLS, basic auth from the URL's
user:password@, and one deadline per request. The event stream stays on aiohttp (tui/data.py)."""

from __future__ import annotations

import asyncio
import json
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast
from urllib.parse import urlsplit

from gpuwatch.compat import timeout_at
from gpuwatch.text.printable import printable_json
from gpuwatch.web.plainhttp import basic_auth, host_and_port

MAX_BODY = 16 * 1024 * 1024  # a node's JSON is a few KB; anything this big is not a daemon
MAX_HEAD = 64 * 1024


class HttpError(Exception):
    """An answer other than 2xx; `str()` is what the dashboard shows ("HTTP 503")."""

    def __init__(self, status: int) -> None:
        super().__init__(f"HTTP {status}")
        self.status = status


class MalformedResponseError(ValueError):
    """Something that is not an HTTP/1.x response."""


@dataclass(frozen=True)
class Target:
    host: str
    port: int
    tls: bool
    request: bytes  # the whole GET, headers included

    @property
    def pool_key(self) -> tuple[str, int, bool]:
        return (self.host, self.port, self.tls)


@lru_cache(maxsize=8192)
def target(url: str) -> Target:
    """What to connect to and what to send for `url` (parsed once per URL, not per request)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise MalformedResponseError(f"not an http(s) URL: {url}")
    tls = parts.scheme == "https"
    port = parts.port or (443 if tls else 80)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host_and_port(parts)}",
        "Accept: application/json",
        "User-Agent: gpuwatch-tui",
    ]
    authorization = basic_auth(parts)
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    return Target(parts.hostname, port, tls, ("\r\n".join(lines) + "\r\n\r\n").encode())


class _Connection(asyncio.Protocol):
    """One keep-alive connection, one response at a time: head, then the body by its
    Content-Length, chunk by chunk, or (without either) until the server closes."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._reset()

    def _reset(self) -> None:
        self._status = 0
        self._length = -1  # -1: not known yet; -2: chunked; -3: until the server closes
        self._body = bytearray()
        self._keep_alive = True
        self.answered = False  # any byte of this request's answer arrived

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's (under `gpuwatch demo`) are not asyncio.Transport's.
        self.transport = cast(asyncio.Transport, transport)

    def send(self, request: bytes, deadline: float) -> asyncio.Future[tuple[int, bytes]]:
        """The answer's status and body; TimeoutError at `deadline` (the loop's clock)."""
        assert self.transport is not None
        loop = asyncio.get_running_loop()
        self._waiter = loop.create_future()
        # One timer a request, cheaper than a task and asyncio.timeout's context each.
        self._timer = loop.call_at(deadline, self.abort, TimeoutError("no answer in time"))
        self._reset()
        self._buffer.clear()  # anything the server sent unasked is not this answer
        self.transport.write(request)
        return self._waiter

    @property
    def reusable(self) -> bool:
        return not self.closed and self._keep_alive

    def data_received(self, data: bytes) -> None:
        self.answered = True
        self._buffer += data
        try:
            self._parse()
        except MalformedResponseError as exc:
            self._fail(exc)

    def eof_received(self) -> bool | None:
        if self._length == -3 and self._status:
            self._finish(bytes(self._buffer))
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._length == -3 and self._status:
            self._finish(bytes(self._buffer))
        self._fail(ConnectionResetError(exc or "the server closed the connection"))

    def abort(self, exc: BaseException) -> None:
        self._fail(exc)
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: BaseException) -> None:
        self.closed = True
        if self._timer is not None:
            self._timer.cancel()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(exc)
        if self.transport is not None:
            self.transport.close()

    def _finish(self, body: bytes) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result((self._status, body))

    def _parse(self) -> None:
        while not self._status:  # more than one head when interim (1xx) answers come first
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD:
                    raise MalformedResponseError("response headers too long")
                return
            self._head(bytes(self._buffer[:end]))
            del self._buffer[: end + 4]
        if self._length >= 0:
            if len(self._buffer) >= self._length:
                body = bytes(self._buffer[: self._length])
                del self._buffer[: self._length]
                self._finish(body)
        elif self._length == -2:
            self._chunks()
        elif len(self._buffer) > MAX_BODY:
            raise MalformedResponseError("response body too large")

    def _head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(b" ", 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise MalformedResponseError(f"not an HTTP/1.x response: {lines[0][:80]!r}")
        try:
            status = int(status_line[1])
        except ValueError:
            raise MalformedResponseError(f"bad status line: {lines[0][:80]!r}") from None
        headers: dict[bytes, bytes] = {}
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers[name.strip().lower()] = value.strip()
        connection = headers.get(b"connection", b"").lower()
        self._keep_alive = (
            connection != b"close" if status_line[0] == b"HTTP/1.1" else connection == b"keep-alive"
        )
        if 100 <= status < 200:  # an interim answer; the real one follows
            return
        self._status = status
        if status in (204, 304):
            self._length = 0
        elif b"chunked" in headers.get(b"transfer-encoding", b"").lower():
            self._length = -2
        elif b"content-length" in headers:
            try:
                self._length = int(headers[b"content-length"])
            except ValueError:
                raise MalformedResponseError("bad Content-Length") from None
            if not 0 <= self._length <= MAX_BODY:
                raise MalformedResponseError("response body too large")
        else:
            self._length, self._keep_alive = -3, False

    def _chunks(self) -> None:
        while True:
            line_end = self._buffer.find(b"\r\n")
            if line_end < 0:
                return
            try:
                size = int(bytes(self._buffer[:line_end]).split(b";", 1)[0], 16)
            except ValueError:
                raise MalformedResponseError("bad chunk size") from None
            if size == 0:  # the last chunk; then trailers, if any, and an empty line
                start = line_end + 2
                if self._buffer[start : start + 2] == b"\r\n":
                    end = start + 2
                else:
                    end = self._buffer.find(b"\r\n\r\n", start)
                    if end < 0:
                        return
                    end += 4
                del self._buffer[:end]
                self._finish(bytes(self._body))
                return
            if len(self._buffer) < line_end + 2 + size + 2:
                return
            self._body += self._buffer[line_end + 2 : line_end + 2 + size]
            del self._buffer[: line_end + 2 + size + 2]
            if len(self._body) > MAX_BODY:
                raise MalformedResponseError("response body too large")


class JsonClient:
    """GET URLs' JSON. Connections are pooled per host and port, so a fleet keeps one open to
    each node between refreshes."""

    def __init__(self, timeout: float, tls: ssl.SSLContext | None = None) -> None:
        self.timeout = timeout
        self._tls = tls
        self._idle: dict[tuple[str, int, bool], list[_Connection]] = {}

    async def get_json(self, url: str) -> Any:
        """The parsed body. Raises HttpError for a non-2xx answer, TimeoutError after the
        client's timeout, OSError when the host cannot be reached, ValueError for an answer
        that is not JSON."""
        (answer,) = await self.get_many([url])
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def get_many(self, urls: Sequence[str]) -> list[Any]:
        """Each URL's parsed body, or the exception that stopped it (as get_json raises it),
        all under one deadline. Requests on open connections go out at once and are awaited
        together, with no task each: this is a fleet refresh's hot path."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        answers: list[Any] = [None] * len(urls)
        sent: list[tuple[int, Target, _Connection, asyncio.Future[tuple[int, bytes]]]] = []
        fresh: list[int] = []  # no open connection to reuse: connect first
        for i, url in enumerate(urls):
            try:
                where = target(url)
            except ValueError as exc:
                answers[i] = exc
                continue
            connection = self._reuse(where)
            if connection is None:
                fresh.append(i)
            else:
                sent.append((i, where, connection, connection.send(where.request, deadline)))
        try:
            await asyncio.gather(*(f for *_, f in sent), return_exceptions=True)
        except BaseException:  # cancelled: connections mid-answer are of no further use
            for *_, connection, _ in sent:
                connection.abort(TimeoutError("cancelled"))
            raise
        for i, where, connection, answer in sent:
            error = answer.exception()
            if isinstance(error, ConnectionResetError) and not connection.answered:
                fresh.append(i)  # the server had closed it as we reused it: a new one
            else:
                answers[i] = self._settle(where, connection, answer)
        if fresh:
            got = await asyncio.gather(
                *(self._connect_and_get(urls[i], deadline) for i in fresh),
                return_exceptions=True,
            )
            for i, outcome in zip(fresh, got, strict=True):
                if isinstance(outcome, BaseException) and not isinstance(outcome, Exception):
                    raise outcome
                answers[i] = outcome
        return answers

    def _reuse(self, where: Target) -> _Connection | None:
        idle = self._idle.get(where.pool_key)
        while idle:
            connection = idle.pop()
            if not connection.closed:
                return connection
        return None

    async def _connect_and_get(self, url: str, deadline: float) -> Any:
        where = target(url)
        loop = asyncio.get_running_loop()
        async with timeout_at(deadline):
            _, connection = await loop.create_connection(
                _Connection, where.host, where.port, ssl=self._tls_for(where)
            )
        answer = connection.send(where.request, deadline)
        try:
            await answer
        except BaseException as exc:
            connection.abort(exc)
            if isinstance(exc, asyncio.CancelledError):
                raise
        result = self._settle(where, connection, answer)
        if isinstance(result, Exception):
            raise result
        return result

    def _settle(
        self, where: Target, connection: _Connection, answer: asyncio.Future[tuple[int, bytes]]
    ) -> Any:
        """The body's JSON, or the exception to report; a connection in good order goes back
        to the pool."""
        error = answer.exception()
        if error is not None:
            connection.abort(error)
            return error
        status, body = answer.result()
        if connection.reusable:
            self._idle.setdefault(where.pool_key, []).append(connection)
        elif connection.transport is not None:
            connection.transport.close()
        if not 200 <= status < 300:
            return HttpError(status)
        try:  # what a daemon sends may hold a process's ESC sequences: shown, never obeyed
            return printable_json(json.loads(body))
        except ValueError as exc:
            return exc

    def _tls_for(self, where: Target) -> ssl.SSLContext | None:
        if not where.tls:
            return None
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def close(self) -> None:
        for connections in self._idle.values():
            for connection in connections:
                if connection.transport is not None:
                    connection.transport.close()
        self._idle.clear()
