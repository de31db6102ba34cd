"""The push socket's HTTP/1.1 server: `POST /api/v1/push` and nothing else, on an asyncio
protocol over httptools' parser (llhttp). A push, once a second from every rank, is the request
the daemon answers most; through aiohttp, which served every socket then, each cost about twice
the CPU (a task, a request, a stream reader and a response per push). Checks, limits and
answers are push/http.py's, as on the control socket and the listener (gpuwatch.web's server).

Bounds: a request not whole within REQUEST_TIMEOUT_S of its first byte is answered 408; a head
over MAX_HEAD_BYTES 431, a body over push.max_body_bytes 413, each then closed; a connection
idle (or not reading) for KEEPALIVE_S is closed; past MAX_CONNECTIONS the oldest idle ones
are. A body over PARSE_ON_LOOP_BYTES is parsed on a thread, later requests answered after it.
What each local user (the kernel names it) may open and cost is pushgate.py's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from gpuwatch.push.http import Stamp
from gpuwatch.push.jobs import JobInputs
from gpuwatch.serve.connlimit import widen_backlog
from gpuwatch.serve.pushconn import PushProtocol
from gpuwatch.serve.pushgate import PushGate
from gpuwatch.serve.pushtake import PushTaker
from gpuwatch.web.server import wind_down

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0
KEEPALIVE_S = 75.0  # aiohttp's, which served this socket before
MAX_CONNECTIONS = 512  # the unit's LimitNOFILE leaves room for these and the listener's
SWEEP_EVERY_S = 5.0
STOP_WAIT_S = 1.0  # as the other sockets' shutdown timeout


class PushServer:
    """Serves the push socket (and the socket made again when its file is removed): the
    protocols' shared state, the jobs pushed into and the open connections."""

    def __init__(self, jobs: JobInputs, clock_now: Callable[[], float], stamp: Stamp) -> None:
        self.jobs = jobs
        self.take = PushTaker(jobs, clock_now, stamp)
        self.gate = PushGate()  # what each user may open and cost
        self.connections: dict[PushProtocol, None] = {}  # oldest first
        self.evicted = 0
        self._servers: list[asyncio.Server] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._sweeper: asyncio.Task[None] | None = None

    async def listen(self, path: str) -> None:
        loop = asyncio.get_running_loop()
        server = await loop.create_unix_server(lambda: PushProtocol(self), path)
        widen_backlog(server.sockets)  # a burst of connects waits in the kernel, not refused
        self._servers.append(server)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep_loop(), name="push socket sweeper")

    async def stop(self) -> None:
        for server in self._servers:
            server.close()
        for connection in list(self.connections):
            connection.evict()  # at once: a client that does not read never holds up a stop
        tasks = [*self._tasks, *([self._sweeper] if self._sweeper else [])]
        await wind_down(self._servers, tasks, STOP_WAIT_S)

    def spawn(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_EVERY_S)
            self.sweep(self.now())

    @staticmethod
    def now() -> float:
        return asyncio.get_running_loop().time()

    def opened(self, connection: PushProtocol) -> None:
        self.connections[connection] = None
        if len(self.connections) <= MAX_CONNECTIONS:
            return
        keep = MAX_CONNECTIONS * 7 // 8  # a batch at once: a burst of connects stays linear
        idle = [
            c
            for c in self.connections
            if c is not connection and c.started is None and not c.pending and not c.busy
        ]
        victims = idle[: len(self.connections) - keep]
        if len(self.connections) - len(victims) > MAX_CONNECTIONS:
            victims.append(connection)  # every other one has a request underway: not this one
        for victim in victims:
            victim.evict()
        self.evicted += len(victims)
        log.warning(
            "push socket: %d connections open, the most it keeps; closed %d (the oldest idle%s)",
            MAX_CONNECTIONS,
            len(victims),
            ", and the newest" if connection in victims else "",
        )

    def sweep(self, now: float) -> None:
        """Close what has waited too long: a request not complete within REQUEST_TIMEOUT_S of
        its first byte (answered 408), a connection idle for KEEPALIVE_S."""
        for c in list(self.connections):
            if c.busy:
                continue
            if c.started is not None and not c.closing and now - c.started > REQUEST_TIMEOUT_S:
                c.fail(408, f"request not received within {REQUEST_TIMEOUT_S:.0f} s")
            elif now - c.last_active > KEEPALIVE_S and (c.started is None or c.closing):
                # Idle, or answered and closing but not reading what it was sent.
                c.evict()
