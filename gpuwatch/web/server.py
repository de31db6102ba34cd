"""The daemon's HTTP/1.1 server, on an asyncio protocol over httptools' parser (llhttp): the
listener's and the control socket's. aiohttp served them before; it and the libraries it
brings cost the daemon 15 MiB of its resident set for a few routes of JSON and text.

Bounds: a connection idle (before its first request, or after an answer) for idle_timeout is
closed; a request not whole within request_timeout of its first byte is answered 408 and
closed; a head over 16 KiB 431; a body over its route's limit 413, then closed. When the
connections open pass the cap (`Cap`), the oldest idle ones are closed to make room."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable, Coroutine, Iterable
from typing import Any, Protocol

from gpuwatch.web.app import App
from gpuwatch.web.connection import HttpConnection

log = logging.getLogger(__name__)

SWEEP_EVERY_S = 1.0


class Cap(Protocol):
    """What may stay open: told of each connection made, it closes others to make room."""

    def opened(
        self, connection: HttpConnection, connections: dict[HttpConnection, None]
    ) -> None: ...

    def lost(self, connection: HttpConnection) -> None: ...


class HttpServer:
    def __init__(
        self,
        app: App,
        *,
        idle_timeout: float,
        request_timeout: float,
        shutdown_timeout: float,
        cap: Cap | None = None,
    ) -> None:
        self.app = app
        self.idle_timeout = idle_timeout
        self.request_timeout = request_timeout
        self.shutdown_timeout = shutdown_timeout
        self.cap = cap
        self.connections: dict[HttpConnection, None] = {}  # oldest first
        self.stopping = False
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    def factory(self) -> HttpConnection:
        return HttpConnection(self)

    async def serve_socket(self, sock: socket.socket, backlog: int) -> None:
        """Serve on a bound TCP socket."""
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_server(self.factory, sock=sock, backlog=backlog))
        self.start()

    async def listen(self, path: str) -> None:
        """Serve on a unix socket at `path` (again, when its file was removed)."""
        loop = asyncio.get_running_loop()
        self._servers.append(await loop.create_unix_server(self.factory, path))
        self.start()

    def start(self) -> None:
        """Start the timers (serving on a socket starts them; a TLS site, which accepts for
        the server, does not)."""
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="http sweeper")

    def opened(self, connection: HttpConnection) -> None:
        self.connections[connection] = None
        if self.cap is not None:
            self.cap.opened(connection, self.connections)

    def lost(self, connection: HttpConnection) -> None:
        self.connections.pop(connection, None)
        if self.cap is not None:
            self.cap.lost(connection)

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            self.sweep(self.now())

    def sweep(self, now: float) -> None:
        """Close what has waited too long: a request not whole within request_timeout of its
        first byte (answered 408), a connection idle for idle_timeout."""
        for c in list(self.connections):
            if c.linger_until is not None:
                if now > c.linger_until:
                    c.force_close()
                continue
            if c.handling or c.queue:
                continue
            if c.started is not None and not c.closing:
                if now - c.started > self.request_timeout:
                    c.refuse(408, f"request not received within {self.request_timeout:.0f} s")
            elif now - c.last_active > self.idle_timeout:
                c.force_close()  # idle, or answered and closing but not reading the answer

    async def stop(self) -> None:
        """Stop accepting; let requests underway finish for shutdown_timeout (an event stream
        does not), then close every connection."""
        self.stopping = True
        for server in self._servers:
            server.close()
        for c in list(self.connections):
            if not (c.handling or c.queue):
                c.force_close()
        busy = [t for t in self._tasks if not t.done()]
        if busy:
            await asyncio.wait(busy, timeout=self.shutdown_timeout)
        for c in list(self.connections):
            c.force_close()
        tasks = [*self._tasks, *([self._sweeper] if self._sweeper else [])]
        await wind_down(self._servers, tasks, self.shutdown_timeout)
        self._sweeper = None


async def wind_down(
    servers: list[asyncio.Server], tasks: Iterable[asyncio.Task[Any]], wait_s: float
) -> None:
    """The end of a server's stop, once its connections are closed: its tasks cancelled and
    awaited, each listening server given wait_s to finish closing, the list emptied."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.gather(*tasks, return_exceptions=True)
    for server in servers:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), wait_s)
    servers.clear()


Factory = Callable[[], HttpConnection]
