"""One connection to the daemon's HTTP server: httptools' parser callbacks, each request's
bounds (head size, its route's body limit), and the answers, one request at a time in the
order they came. What the server bounds across connections is server.py's."""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from typing import TYPE_CHECKING, cast

import httptools

from gpuwatch.web.app import Found
from gpuwatch.web.message import Answer, Headers, Request, Response, StreamResponse, head

if TYPE_CHECKING:
    from gpuwatch.web.server import HttpServer

log = logging.getLogger(__name__)

MAX_HEAD_BYTES = 16 * 1024
# Requests sent ahead of their answers, at most: one chunk read can hold thousands, and each
# costs a request object and a turn of the loop before the first is answered.
MAX_PIPELINED = 16
# After answering a request whose body was not read (413, 431, 400), what the client still
# sends is read and dropped for this long: closing with it unread would reset the connection,
# and the client would lose the answer that says why.
LINGER_S = 5.0


class _RefusedError(Exception):
    """(status, message): raised in a parser callback to answer at once and close."""


class HttpConnection(asyncio.Protocol):
    """httptools calls the on_* methods from within feed_data."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.closing = False
        self.handling = False  # a handler is answering one of its requests
        self.started: float | None = None  # loop time of a request's first byte, until whole
        self.last_active = 0.0
        self.linger_until: float | None = None  # answered and half-closed: read until then
        self.queue: deque[tuple[Request, Found, bool]] = deque()  # whole, not yet answered
        self._task: asyncio.Task[None] | None = None
        self._writing_paused = False
        self._eof = False  # the client has sent all it will send
        self.close_after = False  # an answer said it ends at the close (HTTP/1.0's stream)
        # Answered without reading on (a body past its limit, a refusal, an upgrade): what
        # the client sends after is dropped, and the connection closes after the answers.
        self._done = False
        self._head_wire = 0  # bytes read while a head was arriving, its unfinished line too
        self._drain: asyncio.Future[None] | None = None
        self._new_request()

    def _new_request(self) -> None:
        self._url = bytearray()
        self._fields: list[tuple[str, str]] = []
        self._head_bytes = 0  # of the head's URL and fields, as parsed
        self._in_head = True
        self._request: Request | None = None
        self._found: Found | None = None
        self._body = bytearray()

    # -- asyncio -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's have asyncio.Transport's methods but not its class.
        self.transport = cast(asyncio.Transport, transport)
        self.last_active = self.server.now()
        self.server.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.lost(self)
        self._body = bytearray()  # the parser holds this protocol: a cycle the collector frees
        self._wake(ConnectionResetError("the client went away"))

    def eof_received(self) -> bool | None:
        """A client that half-closes after its request still gets the answer."""
        self._eof = True
        return True if self.handling or self.queue else None

    def data_received(self, data: bytes) -> None:
        # Not the time of last activity: bytes that begin no request (bare line ends, which
        # HTTP lets a server skip) must not keep a connection open for ever.
        if self._done or self.closing:
            return
        if self._in_head:
            # Counted before parsing: httptools keeps a line it has not seen the end of.
            self._head_wire += len(data)
        try:
            self.parser.feed_data(data)
            if self._in_head and self._head_wire > MAX_HEAD_BYTES + len(data):
                raise _RefusedError(431, f"request head over {MAX_HEAD_BYTES} bytes")
        except _RefusedError as refusal:
            self.refuse(*refusal.args)
        except httptools.HttpParserUpgrade:
            # The request was answered as plain HTTP (a server may ignore an Upgrade); what
            # follows it is another protocol's: not read, and the connection closes.
            self._done = self._eof = True
            if not (self.handling or self.queue):
                self._close()
        except httptools.HttpParserError as exc:
            self._failed(exc)

    def _failed(self, exc: httptools.HttpParserError) -> None:
        """A method of its own, so that no local holds the traceback (and the chunk read)."""
        cause = exc.__context__
        if isinstance(cause, _RefusedError):
            self.refuse(*cause.args)
        else:
            self.refuse(400, f"not valid HTTP/1.1: {exc}")

    def pause_writing(self) -> None:  # the client does not read what it was sent
        self._writing_paused = True

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._wake(None)

    def _wake(self, exc: Exception | None) -> None:
        drain, self._drain = self._drain, None
        if drain is not None and not drain.done():
            if exc is None:
                drain.set_result(None)
            else:
                drain.set_exception(exc)

    async def drained(self) -> None:
        """Return once the client has read enough of what it was sent."""
        if self.closing:
            raise ConnectionResetError("the client went away")
        if not self._writing_paused:
            return
        self._drain = asyncio.get_running_loop().create_future()
        await self._drain

    # -- httptools ---------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._new_request()
        self.started = self.last_active = self.server.now()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._in_head:  # trailers after a chunked body are not kept
            self._count(len(name) + len(value) + 4)
            self._fields.append((name.decode("latin-1").lower(), value.decode("latin-1")))

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > 2 * MAX_HEAD_BYTES:
            raise _RefusedError(431, f"request head over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_wire = 0
        headers = Headers()
        for name, value in self._fields:
            headers[name] = f"{headers[name]}, {value}" if name in headers else value
        method = self.parser.get_method().decode("latin-1")
        request = Request(self, method, self._url.decode("latin-1"), headers)
        request.version = self.parser.get_http_version()
        found = self.server.app.resolve(method, self._url.partition(b"?")[0].decode("latin-1"))
        request.match_info = found.match_info
        self._request, self._found = request, found
        length = request.content_length
        if found.head_check is not None and (refusal := found.head_check(request)) is not None:
            request.refusal = refusal  # answered from its head: its body is never read
            self._done = True
            self._dispatch(request, found, keep_alive=False)
        elif length is not None and length > found.max_body:
            self._too_large()
        elif headers.get("expect", "").lower() == "100-continue" and not (
            self.handling or self.queue
        ):
            self.send(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        if self._done or self._found is None:
            return
        if len(self._body) + len(chunk) > self._found.max_body:
            self._too_large()
            return
        self._body += chunk

    def on_message_complete(self) -> None:
        if self._done or self._request is None or self._found is None:
            return
        self._request.body = bytes(self._body)
        self._dispatch(self._request, self._found, self.parser.should_keep_alive())
        self._new_request()

    def _too_large(self) -> None:
        """Answered without its body (the handler says why); the connection then closes."""
        assert self._request is not None and self._found is not None
        self._request.too_large = True
        self._done = True
        self._dispatch(self._request, self._found, keep_alive=False)

    # -- answers -----------------------------------------------------------------------------
    def _dispatch(self, request: Request, found: Found, keep_alive: bool) -> None:
        self.started = None
        if len(self.queue) >= MAX_PIPELINED:
            raise _RefusedError(429, f"more than {MAX_PIPELINED} requests sent ahead of answers")
        self.queue.append((request, found, keep_alive))
        if self.transport is not None:
            self.transport.pause_reading()  # one request at a time
        if self._task is None:
            self._task = self.server.spawn(self._answer_queue())

    async def _answer_queue(self) -> None:
        try:
            while self.queue and not self.closing:
                request, found, keep_alive = self.queue.popleft()
                self.handling = True
                try:
                    if found is _CLOSE:  # what could not be read: past every middleware
                        answer = await found.handler(request)
                    else:
                        answer = await self.server.app.handle(request, found)
                except Exception:  # a handler's bug answers 500; the server keeps serving
                    log.exception("request failed path=%s", request.path)
                    answer = Response(status=500, text="500: Internal Server Error")
                finally:
                    self.handling = False
                self.last_active = self.server.now()
                close = not keep_alive or self._eof or self.close_after or self.server.stopping
                try:
                    self._write(request, answer, close)
                except Exception:  # an answer that cannot be written (a bad header)
                    log.exception("answer to path=%s could not be written", request.path)
                    if not isinstance(answer, StreamResponse):
                        fault = Response(status=500, text="500: Internal Server Error")
                        self._write(request, fault, close=True)
                    close = True
                if close:
                    self._close()
                    return
                if self.queue:  # more to answer: a client that reads none of it is let go
                    try:
                        await asyncio.wait_for(self.drained(), self.server.idle_timeout)
                    except asyncio.TimeoutError:
                        self.force_close()
                        return
                else:
                    await self.drained()  # then idle: the sweep closes it in time
        except ConnectionResetError:
            pass
        finally:
            self._task = None
            if not self.closing and self.transport is not None:
                self.transport.resume_reading()

    def _write(self, request: Request, answer: Answer, close: bool) -> None:
        if isinstance(answer, StreamResponse):
            if answer.chunked:
                self.send(b"0\r\n\r\n")  # the stream's last chunk
            return
        fields = answer.headers
        if "Content-Length" not in fields:
            fields["Content-Length"] = str(len(answer.body))
        if request.version == "1.0" and not close:  # it keeps a connection only when told so
            fields["Connection"] = "keep-alive"
        body = b"" if request.method == "HEAD" else answer.body
        self.send(head(answer.status, fields.items(), close=close) + body)

    def send(self, data: bytes) -> None:
        if self.transport is not None and not self.closing:
            self.transport.write(data)

    def refuse(self, status: int, message: str) -> None:
        """Answer what could not be read as a request, and close (after the answers before)."""
        self._done = True
        self.started = None
        if self.handling or self.queue:  # the requests before it are answered first
            self.queue.append((_refusal(self, status, message), _CLOSE, False))
            return
        self.send(head(status, [("Content-Length", str(len(message) + 1))], close=True))
        self.send(message.encode("latin-1", "replace") + b"\n")
        self._close()

    def _close(self) -> None:
        """Close once what was written has gone; with the client's bytes still unread, say
        so (a half close) and drop what it sends for a while first."""
        transport = self.transport
        self.closing = True
        if transport is None:
            return
        if self._done and transport.can_write_eof():
            self.linger_until = self.server.now() + LINGER_S
            transport.write_eof()
            transport.resume_reading()
        else:
            transport.close()

    def force_close(self) -> None:
        """Close at once, whatever it had not sent yet (a client that stopped reading)."""
        self.closing = True
        if self.transport is not None:
            self.transport.abort()


def _refusal(connection: HttpConnection, status: int, message: str) -> Request:
    request = Request(connection, "GET", "/", Headers())
    request.match_info = {"status": str(status), "message": message}
    return request


async def _refused(request: Request) -> Answer:
    return Response(
        status=int(request.match_info["status"]), text=request.match_info["message"] + "\n"
    )


_CLOSE = Found(_refused, {}, 0)
