"""The client side of the control socket, for commands that change a running daemon
(`gpuwatch ack`, `gpuwatch silence`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuwatch.clients.exits import ControlError
from gpuwatch.state.paths import SOCKET_NAME, default_state_dir, socket_path
from gpuwatch.web.plainhttp import NotHttpError, UnsendableError, over_unix_socket

SYSTEMD_SOCKET = Path("/run/gpuwatch") / SOCKET_NAME  # RuntimeDirectory=gpuwatch
TIMEOUT_S = 10.0


def default_socket(state_dir: str | None) -> Path:
    """The socket of the daemon with this state dir; without one, the systemd unit's socket if
    it exists, else the default state dir's."""
    if state_dir is not None:
        return Path(state_dir) / SOCKET_NAME
    if SYSTEMD_SOCKET.exists():
        return SYSTEMD_SOCKET
    return socket_path(default_state_dir())


def request(
    path: Path, method: str, url: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    """(HTTP status, JSON reply) of one request to the daemon's control socket."""
    payload = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    try:
        response = over_unix_socket(
            str(path), method, url, headers, body=payload, timeout=TIMEOUT_S
        )
        reply = json.loads(response.read() or b"{}")
    except OSError as exc:
        raise ControlError(f"cannot reach the daemon on {path}: {_why(exc)}") from exc
    except NotHttpError as exc:
        raise ControlError(f"the daemon on {path} did not answer in HTTP: {exc}") from exc
    except UnsendableError as exc:
        raise ControlError(f"cannot ask the daemon on {path}: {exc}") from exc
    except ValueError as exc:
        raise ControlError(f"the daemon on {path} answered something that is not JSON") from exc
    return response.status, reply if isinstance(reply, dict) else {}


def _why(exc: OSError) -> str:
    """What an operator does about it, not only the errno."""
    if isinstance(exc, FileNotFoundError):
        return "no socket there; is the daemon running, on this state directory?"
    if isinstance(exc, ConnectionRefusedError):
        return "nothing listens on it; the daemon has stopped"
    if isinstance(exc, PermissionError):
        return "permission denied; run as root or as the daemon's user"
    return exc.strerror or str(exc)
