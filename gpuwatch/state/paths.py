"""Where a daemon keeps its state and its control socket: what the daemon and the commands
that reach it both need, kept apart from either so a command imports only this."""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_NAME = "gpuwatch.sock"
PUSH_SOCKET_NAME = "push.sock"


def default_state_dir() -> str:
    # systemd's StateDirectory= sets STATE_DIRECTORY; elsewhere the FHS location.
    return os.environ.get("STATE_DIRECTORY", "/var/lib/gpuwatch").split(":")[0]


def socket_path(state_dir: str) -> Path:
    """Under systemd the runtime directory, otherwise the state directory: two daemons with
    two state directories never share a socket."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    base = Path(runtime.split(":")[0]) if runtime else Path(state_dir)
    return base / SOCKET_NAME
