"""The simulated node's Fabric Manager: a listening socket on loopback, as its command port,
closed while a `fabric_manager_down` fault lasts.

Connections are accepted and closed at once, so the daemon's checks never fill the backlog.
"""

from __future__ import annotations

import socket

from gpuwatch.sim.faults import fabric_manager_down
from gpuwatch.sim.node import SimNode


class SimFabricManager:
    def __init__(self, node: SimNode) -> None:
        self._node = node
        self._sock: socket.socket | None = None
        self._listen(0)
        assert self._sock is not None
        self.port: int = self._sock.getsockname()[1]

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _listen(self, port: int) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(16)
        sock.setblocking(False)
        self._sock = sock

    def update(self, now: float) -> None:
        """Up or down as the scenario says at `now`; what connected since is let go."""
        down = fabric_manager_down(self._node.scenario.faults, now - self._node.start)
        if down and self._sock is not None:
            self.close()
        elif not down and self._sock is None:
            try:
                self._listen(self.port)
            except OSError:  # the port is busy a moment more; the next update tries again
                return
        while self._sock is not None:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # nothing waiting (or closed under us)
                break
            conn.close()

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
