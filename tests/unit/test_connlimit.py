"""The listener under a burst: the kernel queues connects the loop has not accepted yet, each
connection is closed at most once to make room, and the work per connect stays flat however
many are already closing."""

from __future__ import annotations

import socket
from typing import Any

from gpuwatch.serve.connlimit import ConnectionCap, widen_backlog


class Connection:
    """A connection as the cap sees it: answering a request or not, closed or not."""

    def __init__(self) -> None:
        self.force_closed = 0
        self.handling = False
        self.queue: list[object] = []

    def force_close(self) -> None:
        self.force_closed += 1


class Server:
    """The server's side of the cap: connections oldest first, made and lost."""

    def __init__(self, cap: ConnectionCap) -> None:
        self.cap = cap
        self.connections: dict[Any, None] = {}

    def made(self, connection: Connection) -> None:
        self.connections[connection] = None
        self.cap.opened(connection, self.connections)  # type: ignore[arg-type]

    def lost(self, connection: Connection) -> None:
        self.connections.pop(connection, None)
        self.cap.lost(connection)  # type: ignore[arg-type]


def test_a_burst_closes_each_old_connection_once_and_keeps_the_new_ones() -> None:
    cap = ConnectionCap(max_connections=64)
    server = Server(cap)
    connections = [Connection() for _ in range(1000)]
    for c in connections:  # one burst: none of the closed ones is gone yet
        server.made(c)
        assert len(server.connections) - len(cap.closing) <= 64
    assert all(c.force_closed <= 1 for c in connections)
    assert all(c.force_closed == 0 for c in connections[-56:])  # the newest stay open
    assert cap.evicted == sum(c.force_closed for c in connections) == len(cap.closing) >= 1000 - 64
    for c in list(cap.closing):  # the loop gets round to them
        server.lost(c)  # type: ignore[arg-type]
    assert not cap.closing and len(server.connections) <= 64


def test_answering_and_streaming_connections_are_never_the_ones_closed() -> None:
    cap = ConnectionCap(max_connections=8)
    server = Server(cap)
    scrape, stream, queued = Connection(), Connection(), Connection()
    for c in (scrape, stream, queued):
        server.made(c)
    scrape.handling = True
    queued.queue.append(object())
    cap.streams.add(stream)  # type: ignore[arg-type]
    for _ in range(100):
        server.made(Connection())
    assert scrape.force_closed == 0 and stream.force_closed == 0 and queued.force_closed == 0


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
