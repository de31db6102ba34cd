"""Bounds on the listener's connections, so clients that open sockets and send nothing (or
never read) cannot take the file descriptors /metrics and /healthz need.

- A connection that sends no complete request within IDLE_TIMEOUT_S of opening, or of its
  last answer, is closed (the server's idle timer, which also runs before the first request).
- At most MAX_CONNECTIONS are open; one more closes the oldest that are neither answering a
  request nor an event stream, down to seven eighths of the cap, so a new client (a probe, a
  scraper) always gets in and a flood of idle connections only displaces itself. Closing in a
  batch, and counting what is already closing, keeps a burst of a thousand connects linear.
- Event streams are counted apart: at most MAX_STREAMS at once (more are answered 503).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterable
from typing import Any

from gpuwatch.web.connection import HttpConnection

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 15.0
MAX_CONNECTIONS = 512  # the unit's LimitNOFILE leaves room for these, the databases and NVML
MAX_STREAMS = 64
# asyncio uses one number for two things: the kernel's queue of completed connects and how many
# it accepts in one turn of the loop; here they are set apart. The queue: asyncio's 128
# overflows under a burst of a few hundred connects, and a connect past it is dropped and
# retried by the client's kernel a second later, so a probe in the burst took over 1 s (Linux
# caps the queue at net.core.somaxconn, 4096 since 5.4). The turn: accepting a thousand
# connections in one turn held asyncio's loop for 0.9 s, so it stays at 128. uvloop, the loop
# the daemon runs on, takes only the queue from it: libuv accepts every pending connect in a
# turn, and a burst of a thousand held it 6 ms.
ACCEPT_BACKLOG = 1024
ACCEPT_PER_TURN = 128


class ConnectionCap:
    """The listener's cap (gpuwatch.web.server.Cap): connections past it close the oldest
    that are neither answering a request nor an event stream."""

    def __init__(self, max_connections: int = MAX_CONNECTIONS) -> None:
        self.max_connections = max_connections
        self.streams: set[HttpConnection] = set()  # connections serving an event stream
        self.closing: set[HttpConnection] = set()  # closed to make room, not yet gone
        self.evicted = 0

    def opened(self, connection: HttpConnection, connections: dict[HttpConnection, None]) -> None:
        if len(connections) - len(self.closing) > self.max_connections:
            self._evict(connections)

    def lost(self, connection: HttpConnection) -> None:
        self.closing.discard(connection)
        self.streams.discard(connection)

    def _evict(self, connections: dict[HttpConnection, None]) -> None:
        """Close the oldest idle connections, down to seven eighths of the cap."""
        keep = self.max_connections - self.max_connections // 8
        excess = len(connections) - len(self.closing) - keep
        for connection in connections:  # oldest first
            if excess <= 0:
                break
            if connection in self.closing or connection in self.streams:
                continue
            if connection.handling or connection.queue:
                continue
            connection.force_close()
            self.closing.add(connection)
            excess -= 1
            self.evicted += 1
            if self.evicted == 1 or self.evicted % 1000 == 0:
                log.warning(
                    "more than %d connections open: closed the oldest (%d so far)",
                    self.max_connections,
                    self.evicted,
                )


def widen_backlog(sockets: Iterable[Any]) -> None:
    """Give listening sockets (asyncio's TransportSocket wrappers) ACCEPT_BACKLOG in the kernel.
    listen() on a duplicate reaches the same socket; asyncio's loop keeps accepting
    ACCEPT_PER_TURN a turn."""
    for sock in sockets:
        with socket.fromfd(sock.fileno(), sock.family, sock.type) as duplicate:
            duplicate.listen(ACCEPT_BACKLOG)
