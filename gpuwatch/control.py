"""The write side of the API, served on a unix socket (DESIGN §6): reload, and later silences
and job metric pushes. File permissions (0660) are the access control."""

from __future__ import annotations

import contextlib
import logging
import os
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


def _clear_stale_socket(path: Path) -> None:
    if path.is_socket():
        path.unlink()  # left behind by a daemon that did not stop cleanly


async def start_control(api: ControlApi, path: Path) -> web.AppRunner:
    _clear_stale_socket(path)
    runner = web.AppRunner(api.app(), access_log=None)
    await runner.setup()
    site = web.UnixSite(runner, str(path))
    await site.start()
    with contextlib.suppress(OSError):
        os.chmod(path, 0o660)
    log.info("control socket on %s", path)
    return runner
