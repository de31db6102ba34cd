"""The write side of the API, served on a unix socket (DESIGN §6): reload, and later silences
and job metric pushes. File permissions (0660) are the access control."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from pathlib import Path

from aiohttp import web

from gpuwatch.rules.engine import RuleEngine

log = logging.getLogger(__name__)

SOCKET_NAME = "gpuwatch.sock"
MAX_BODY_BYTES = 64 * 1024


def socket_path(state_dir: str) -> Path:
    """Under systemd the runtime directory, otherwise the state directory: two daemons with
    two state directories never share a socket."""
    runtime = os.environ.get("RUNTIME_DIRECTORY")
    base = Path(runtime.split(":")[0]) if runtime else Path(state_dir)
    return base / SOCKET_NAME


class ControlApi:
    def __init__(self, rules: RuleEngine) -> None:
        self.rules = rules

    def app(self) -> web.Application:
        app = web.Application(client_max_size=MAX_BODY_BYTES)
        app.router.add_post("/-/reload", self.reload)
        return app

    async def reload(self, request: web.Request) -> web.Response:
        error = self.rules.reload()
        if error:
            return web.json_response(
                {"status": "error", "errorType": "bad_data", "error": error}, status=400
            )
        return web.json_response({"status": "success", "data": {"groups": len(self.rules.groups)}})


def clear_stale_socket(path: Path) -> None:
    """Remove a socket left behind by a daemon that did not stop cleanly; refuse to take one
    that a running daemon still answers on (two daemons on one state directory)."""
    if not path.is_socket():
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
            return
    raise OSError(f"another gpuwatch is serving on {path}; give each daemon its own state dir")


async def start_control(api: ControlApi, path: Path) -> web.AppRunner:
    clear_stale_socket(path)
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    site = web.UnixSite(runner, str(path))
    await site.start()
    with contextlib.suppress(OSError):
        os.chmod(path, 0o660)
    log.info("control socket on %s", path)
    return runner
