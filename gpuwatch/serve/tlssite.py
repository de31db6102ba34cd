"""The listener with TLS on: a client that speaks plain HTTP to it (`curl http://...`, a
scrape config without `scheme: https`) gets the answer Go's exporters give, a 400 saying so,
instead of a connection closed without a word.

asyncio's TLS server reads the first bytes itself and drops a connection that is not TLS,
so connections are accepted here: each one's first byte is peeked (left unread), and a TLS
handshake record (0x16) goes on to the HTTP server over TLS exactly as a TLS server would have taken
it; anything else is answered and closed. Waiting for that byte is bounded in time and in
how many connections may wait at once, as the listener's other connections are."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import ssl

from gpuwatch.clock import within
from gpuwatch.serve.connlimit import ACCEPT_BACKLOG, IDLE_TIMEOUT_S
from gpuwatch.web.server import Factory

log = logging.getLogger(__name__)

TLS_HANDSHAKE_RECORD = b"\x16"
PLAIN_HTTP_ANSWER = (
    b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\n"
    b"Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n"
)
FIRST_BYTE_TIMEOUT_S = IDLE_TIMEOUT_S  # as long as any connection may stay silent
# Connections not yet past their first byte; one more closes the oldest, so silent
# connections by the hundred displace each other and a client that speaks gets in.
MAX_WAITING = 256
DRAIN_BYTES = 65536  # read before answering, so closing does not reset the answer away


class SniffingTlsSite:
    """A bound socket served over TLS, plain HTTP answered with a 400."""

    def __init__(self, factory: Factory, sock: socket.socket, tls: ssl.SSLContext) -> None:
        self._factory = factory
        self._sock = sock
        self._tls = tls
        self._accepting: asyncio.Task[None] | None = None
        self._waiting: dict[asyncio.Task[None], None] = {}  # oldest first
        host, port = sock.getsockname()[:2]
        self._name = f"https://{host}:{port}"

    @property
    def name(self) -> str:
        return self._name

    async def start(self) -> None:
        self._sock.setblocking(False)
        self._sock.listen(ACCEPT_BACKLOG)
        self._accepting = asyncio.create_task(self._accept(), name=f"accept {self._name}")

    async def stop(self) -> None:
        tasks = [t for t in (self._accepting, *self._waiting) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sock.close()

    async def _accept(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, _ = await loop.sock_accept(self._sock)
            except OSError as exc:  # out of descriptors: the cap frees some, try again
                log.warning("listener %s: cannot accept: %s", self._name, exc.strerror)
                await asyncio.sleep(0.1)
                continue
            if len(self._waiting) >= MAX_WAITING:
                oldest = next(iter(self._waiting))
                del self._waiting[oldest]
                oldest.cancel()
            task = asyncio.create_task(self._sort(conn))
            self._waiting[task] = None
            task.add_done_callback(lambda done: self._waiting.pop(done, None))

    async def _sort(self, conn: socket.socket) -> None:
        """TLS on to the HTTP server; plain HTTP answered; silence or a reset closed."""
        try:
            first = await within(_peek(conn), FIRST_BYTE_TIMEOUT_S)
        except (TimeoutError, OSError):
            conn.close()
            return
        except asyncio.CancelledError:  # displaced by newer ones, or the listener stops
            conn.close()
            raise
        if first != TLS_HANDSHAKE_RECORD:
            _answer_plain(conn, first)
            return
        loop = asyncio.get_running_loop()
        try:
            await loop.connect_accepted_socket(
                self._factory, conn, ssl=self._tls, ssl_handshake_timeout=FIRST_BYTE_TIMEOUT_S
            )
        except (OSError, ssl.SSLError, TimeoutError, asyncio.TimeoutError):
            conn.close()  # a failed handshake: what a TLS server does with it


async def _peek(conn: socket.socket) -> bytes:
    """The first byte the client sent, left for whoever reads next ("" once it hung up)."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()
    fd = conn.fileno()

    def ready() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await readable
    finally:
        loop.remove_reader(fd)
    return conn.recv(1, socket.MSG_PEEK)


def _answer_plain(conn: socket.socket, first: bytes) -> None:
    with contextlib.suppress(OSError):
        if first:
            with contextlib.suppress(BlockingIOError):
                conn.recv(DRAIN_BYTES)  # what it sent: unread, closing would reset the answer
            conn.send(PLAIN_HTTP_ANSWER)
            conn.shutdown(socket.SHUT_WR)
    conn.close()
