"""The listener under a burst: the kernel queues connects the loop has not accepted yet, each
connection is closed at most once to make room, and the work per connect stays flat however
many are already closing."""

from __future__ import annotations

import socket
from typing import Any

from gpuwatch.serve.connlimit import ConnectionCap, widen_backlog


class Transport:
    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


class Handler:
    def __init__(self) -> None:
        self.transport = Transport()
        self.force_closed = 0

    def force_close(self) -> None:
        self.force_closed += 1


class Server:
    """aiohttp's web.Server as the cap sees it: connections oldest first, made and lost."""

    def __init__(self) -> None:
        self._connections: dict[Any, Any] = {}

    @property
    def connections(self) -> list[Any]:
        return list(self._connections)

    def connection_made(self, handler: Any, transport: Any) -> None:
        self._connections[handler] = transport

    def connection_lost(self, handler: Any, exc: BaseException | None = None) -> None:
        self._connections.pop(handler, None)


def test_a_burst_closes_each_old_connection_once_and_keeps_the_new_ones() -> None:
    server = Server()
    cap = ConnectionCap(max_connections=64)
    cap.attach(server)  # type: ignore[arg-type]
    handlers = [Handler() for _ in range(1000)]
    for h in handlers:  # one burst: none of the closed ones is gone yet
        server.connection_made(h, h.transport)
        assert cap.open - len(cap.closing) <= 64
    assert all(h.force_closed <= 1 and h.transport.closed <= 1 for h in handlers)
    assert all(h.force_closed == 0 for h in handlers[-56:])  # the newest stay open
    assert cap.evicted == sum(h.force_closed for h in handlers) == len(cap.closing) >= 1000 - 64
    for h in list(cap.closing):  # the loop gets round to them
        server.connection_lost(h)
    assert cap.open == len(server.connections) and not cap.closing


def test_answering_and_streaming_connections_are_never_the_ones_closed() -> None:
    server = Server()
    cap = ConnectionCap(max_connections=8)
    cap.attach(server)  # type: ignore[arg-type]
    scrape, stream = Handler(), Handler()
    server.connection_made(scrape, scrape.transport)
    server.connection_made(stream, stream.transport)
    cap.busy.add(scrape)  # type: ignore[arg-type]
    cap.streams.add(stream)  # type: ignore[arg-type]
    for _ in range(100):
        h = Handler()
        server.connection_made(h, h.transport)
    assert scrape.force_closed == 0 and stream.force_closed == 0


def test_a_widened_listener_completes_a_burst_of_connects_before_any_is_accepted() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(2)  # as asyncio is told: how many to accept per turn of the loop
        widen_backlog([listener])
        clients: list[socket.socket] = []
        try:
            for _ in range(300):  # past the queue of 2, a connect waits a second and retries
                clients.append(socket.create_connection(listener.getsockname(), timeout=0.5))
        finally:
            for client in clients:
                client.close()
