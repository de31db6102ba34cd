"""One connection to the push socket: httptools' parser callbacks, the request's bounds, and
its answers in the order the requests came (gpuwatch.serve.pushserver says what is bounded)."""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from typing import TYPE_CHECKING, Any, cast

import httptools

from gpuwatch.push.http import PARSE_ON_LOOP_BYTES, error_body, peer_creds, peer_text
from gpuwatch.serve.pushgate import MAX_CONNECTIONS_PER_UID
from gpuwatch.serve.pushwire import RefusedError, Request, answer, our_fault

if TYPE_CHECKING:
    from gpuwatch.serve.pushserver import PushServer

PATH = b"/api/v1/push"
MAX_HEAD_BYTES = 16 * 1024


class PushProtocol(asyncio.Protocol):
    """One connection. httptools calls the on_* methods from within feed_data."""

    def __init__(self, server: PushServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpRequestParser(self)
        self.started: float | None = None  # loop time of a request's first byte, while underway
        self.last_active = 0.0
        self.pending: deque[Request] = deque()  # complete, not yet answered
        self.busy = False  # a large body is being parsed on a thread
        self.writing_paused = False
        # (status, message, Retry-After): to answer once the pending are answered
        self.failure: tuple[int, str, float | None] | None = None
        self.closing = False
        self.pid: int | None = None
        self.uid = -1
        self.counted = False  # among its user's open connections
        self.holds_large = False  # one of its user's places for a large body
        self._new_request()

    def _new_request(self) -> None:
        self.target = b""
        self.in_head = True
        self.head_bytes = 0
        self.wire_bytes = 0  # of this request as sent: its head, body and chunk framing
        self.content_type = "application/octet-stream"  # aiohttp's, with no Content-Type
        self.content_length: int | None = None
        self.expect = False
        self.body = bytearray()  # one buffer: a body sent in 2-byte chunks costs its size
        self.refusal: tuple[int, str] | None = None

    # -- asyncio -----------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport; uvloop's have asyncio.Transport's methods but not its class.
        self.transport = cast(asyncio.Transport, transport)
        self.last_active = self.server.now()
        # The kernel's word for who is there, fixed for the connection's life.
        creds = peer_creds(transport.get_extra_info("socket"))
        self.pid, self.uid = creds if creds is not None else (None, -1)
        if not self.server.gate.connect(self.uid):
            self.closing = True
            message = f"uid {self.uid} has {MAX_CONNECTIONS_PER_UID} connections open already"
            self.transport.write(answer(429, error_body(message), close=True, retry_after=1))
            self.transport.close()
            return
        self.counted = True
        self.server.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.pop(self, None)
        # The parser holds this protocol's methods, a cycle only the collector frees: what a
        # client sent before it went (up to push.max_body_bytes) is dropped now, not then.
        self.body = bytearray()
        if self.counted:
            self.counted = False
            self.server.gate.disconnect(self.uid)
        if not self.busy:  # a parse under way gives its place back when it ends
            self._release_large()

    def data_received(self, data: bytes) -> None:
        self.last_active = self.server.now()
        # Counted before parsing: httptools keeps a header line (or a trailer) it has not seen
        # the end of, so a line that never ends is bounded here, not by a callback.
        self.wire_bytes += len(data)
        limit = self.server.jobs.pushed.limits.max_body_bytes
        try:
            if self.wire_bytes > MAX_HEAD_BYTES + 2 * limit + len(data):
                raise RefusedError(413, f"request over {limit} bytes (push.max_body_bytes)")
            self.parser.feed_data(data)
            if self.in_head and self.wire_bytes > MAX_HEAD_BYTES:
                raise RefusedError(431, f"request head over {MAX_HEAD_BYTES} bytes")
        except RefusedError as refusal:
            self.fail(*refusal.args)
        except httptools.HttpParserError as exc:
            self._failed(exc)

    def _failed(self, exc: httptools.HttpParserError) -> None:
        """Answer what stopped the parser. A method of its own: a local naming the cause in
        data_received would hold the cause's traceback, its frame and the chunk read (256 KiB)
        in a cycle until the collector's next pass, and a flood of refused pushes grew the
        daemon by hundreds of MiB."""
        cause = exc.__context__
        if isinstance(cause, RefusedError):
            self.fail(*cause.args)
        elif isinstance(cause, Exception):  # our bug, not the client's
            fault = our_fault(cause)
            self.fail(fault.status, str(fault))
        else:
            self.fail(400, f"not valid HTTP/1.1: {exc}")

    def pause_writing(self) -> None:  # the client sends and does not read its answers
        self.writing_paused = True
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_writing(self) -> None:
        self.writing_paused = False
        self._resume_reading()

    def _resume_reading(self) -> None:
        if self.transport is not None and not (self.busy or self.writing_paused or self.closing):
            self.transport.resume_reading()

    # -- httptools ---------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.started = self.last_active

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        self.target += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self.in_head:
            raise RefusedError(400, "trailers are not taken: send the body's headers first")
        self._count(len(name) + len(value) + 4)
        lower = name.lower()
        if lower == b"content-type":
            self.content_type = value.partition(b";")[0].strip().lower().decode("latin-1")
        elif lower == b"content-length" and value.strip().isdigit():  # llhttp checked it
            self.content_length = int(value)
        elif lower == b"expect" and value.strip().lower() == b"100-continue":
            self.expect = True

    def _count(self, size: int) -> None:
        """A head that arrived whole in one read is bounded here (one still arriving, in
        data_received)."""
        self.head_bytes += size
        if self.head_bytes > MAX_HEAD_BYTES:
            raise RefusedError(431, f"request head over {MAX_HEAD_BYTES} bytes")

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self.parser.should_upgrade():  # llhttp would take the body for the new protocol's
            raise RefusedError(400, "protocol upgrades are not served here: plain HTTP/1.1")
        method = self.parser.get_method()
        path = self.target.partition(b"?")[0]
        limit = self.server.jobs.pushed.limits.max_body_bytes
        if path != PATH:
            shown = path[:200].decode("latin-1")
            self.refusal = (404, f"{shown!r} not found: this socket takes POST /api/v1/push only")
        elif method != b"POST":
            self.refusal = (405, f"method {method.decode('latin-1')} not allowed: POST only")
        elif self.content_length is not None and self.content_length > limit:
            raise RefusedError(
                413,
                f"body of {self.content_length} bytes; the limit is {limit} (push.max_body_bytes)",
            )
        elif over := self.server.gate.refusal(self.uid):
            # Refused before its body is read: a user over its budget costs a header's read.
            raise RefusedError(429, over.message, over.retry_after)
        elif (self.content_length or 0) > PARSE_ON_LOOP_BYTES:
            self._hold_large()
        elif self.expect and self.transport is not None and not self.pending and not self.busy:
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        if self.refusal is not None:
            return  # read and dropped: the answer does not depend on it
        limit = self.server.jobs.pushed.limits.max_body_bytes
        if len(self.body) + len(chunk) > limit:
            raise RefusedError(413, f"body over {limit} bytes (push.max_body_bytes)")
        if len(self.body) + len(chunk) > PARSE_ON_LOOP_BYTES and not self.holds_large:
            self._hold_large()  # chunked: large once it has grown so
        self.body += chunk

    def on_message_complete(self) -> None:
        keep_alive = self.parser.should_keep_alive()
        request = Request(
            self.target, self.content_type, bytes(self.body), keep_alive, self.refusal
        )
        self.pending.append(request)
        self._new_request()
        self.started = None
        if not self.busy:
            self._answer_pending()

    def _hold_large(self) -> None:
        """One of the user's places for a large body, held until it is parsed (a request
        pipelined behind it shares it: reading stops while the first is parsed)."""
        if self.holds_large:
            return
        if over := self.server.gate.hold_large(self.uid):
            raise RefusedError(429, over.message, over.retry_after)
        self.holds_large = True

    def _release_large(self) -> None:
        if self.holds_large:
            self.holds_large = False
            self.server.gate.release_large(self.uid)

    # -- answers -----------------------------------------------------------------------------
    def _answer_pending(self) -> None:
        while self.pending and self.transport is not None and not self.transport.is_closing():
            request = self.pending[0]
            large = len(request.body) > PARSE_ON_LOOP_BYTES
            if request.refusal is not None:
                status, message = request.refusal
                self._write(request, status, error_body(message), allow=status == 405)
            elif (over := self.server.gate.refusal(self.uid)) is not None:
                self._release_large()
                self._write(request, 429, error_body(over.message), retry=over.retry_after)
            elif large:
                self.busy = True  # the event loop keeps answering while it is parsed
                self.transport.pause_reading()
                self.server.spawn(self._answer_large(request))
                return
            else:
                parse = functools.partial(self.server.take.parse, request)
                parsed = self.server.gate.parse_here(self.uid, parse)
                self._write(request, *self.server.take.apply(request, parsed, self.peer, self.pid))
            self.pending.popleft()
        if self.failure is not None and not self.pending:
            failure, self.failure = self.failure, None
            self.fail(*failure)

    async def _answer_large(self, request: Request) -> None:
        try:
            parse = functools.partial(self.server.take.parse, request)
            parsed = await self.server.gate.parse_large(self.uid, parse)
            self._write(request, *self.server.take.apply(request, parsed, self.peer, self.pid))
        finally:
            self._release_large()
            self.pending.popleft()
            self.busy = False
            self._resume_reading()
            self._answer_pending()

    def _write(
        self,
        request: Request,
        status: int,
        payload: dict[str, Any],
        allow: bool = False,
        retry: float | None = None,
    ) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        close = not request.keep_alive
        self.transport.write(answer(status, payload, close=close, allow=allow, retry_after=retry))
        self.last_active = self.server.now()
        if close:
            self.closing = True
            self.transport.close()  # after what is written has gone

    def fail(self, status: int, message: str, retry: float | None = None) -> None:
        """Answer and close, after the requests before it: what else this connection sent is
        not read."""
        if self.transport is None or self.transport.is_closing():
            return
        if self.pending or self.busy:  # answered after the requests before it
            self.failure = (status, message, retry)
            self.closing = True  # read no more
            self.transport.pause_reading()
            return
        self.closing = True
        self.transport.write(answer(status, error_body(message), close=True, retry_after=retry))
        self.transport.close()

    def evict(self) -> None:
        """Close at once, with whatever it had not sent yet, and stop counting it."""
        self.closing = True
        self.server.connections.pop(self, None)
        if self.transport is not None:
            self.transport.abort()

    def peer(self) -> str:
        return peer_text(None if self.pid is None else (self.pid, self.uid))
