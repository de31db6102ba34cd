"""The write side of the API, served on unix sockets (docs/security.md). File permissions are the
access control: the control socket (reload, acknowledgements, silences, pushes) is 0660, for
root and the daemon's group; the push socket takes job metric pushes only, and is open to every
local user by default (0666), so that a training job of any user can report."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuwatch.daemon import AckError
from gpuwatch.health.verdict import Cause
from gpuwatch.notify.silences import Silences, silence_json, silence_request
from gpuwatch.push.http import Stamp, handle_push, unstamped
from gpuwatch.serve.api import healthz_response
from gpuwatch.serve.payloads import node_payload
from gpuwatch.serve.readers import ReaderOptions
from gpuwatch.web.app import App
from gpuwatch.web.message import Request, Response, json_response
from gpuwatch.web.server import HttpServer

log = logging.getLogger(__name__)

CONTROL_MODE = 0o660
MAX_BODY_BYTES = 64 * 1024


NESTED_TOO_DEEPLY = "the body's JSON is nested too deeply"


def _error(message: str, status: int = 400) -> Response:
    return json_response(
        {"status": "error", "errorType": "bad_data", "error": message}, status=status
    )


class ControlApi:
    def __init__(
        self,
        options: ReaderOptions,
        acknowledge: Callable[[str, str, str], tuple[str, Cause]],
        reload: Callable[[], Awaitable[str]],
        silences: Silences | None,
        stamp: Stamp = unstamped,
    ) -> None:
        self.options = options
        self.rules = options.rules
        self._acknowledge = acknowledge  # (gpu, cause, note) -> (uuid, cause); AckError
        self._reload = reload  # empty when the reload applied, else why it did not
        self.silences = silences
        self.stamp = stamp  # the GPU a pushing process may speak for

    def app(self) -> App:
        app = App(client_max_size=MAX_BODY_BYTES)
        app.add_post("/-/reload", self.reload)
        app.add_get("/healthz", self.healthz)
        app.add_get("/api/v1/node", self.node)
        app.add_post("/api/v1/ack", self.ack)
        app.add_post("/api/v1/push", self.push, self._push_limit)
        app.add_get("/api/v1/silences", self.list_silences)
        app.add_post("/api/v1/silences", self.add_silence)
        app.add_delete("/api/v1/silence/{id}", self.expire_silence)
        return app

    async def healthz(self, request: Request) -> Response:
        """As the listener's, for a probe that cannot pass the listener's TLS or password."""
        return healthz_response(self.options.node)

    async def node(self, request: Request) -> Response:
        """The verdict, as the listener's, for the node's own health check (Slurm's)."""
        return json_response({"status": "success", "data": node_payload(self.options)})

    def _push_limit(self) -> int:
        return self.options.jobs.pushed.limits.max_body_bytes

    async def push(self, request: Request) -> Response:
        """Job metrics; the socket's file permissions are the access control."""
        jobs, now = self.options.jobs, self.options.clock.now()
        return await handle_push(request, jobs, now, self.stamp)

    async def list_silences(self, request: Request) -> Response:
        silences = self.silences
        if silences is None:
            return _error("this daemon sends no notifications", 404)
        now = self.options.clock.now()
        return json_response(
            {"status": "success", "data": [silence_json(s, now) for s in silences.all()]}
        )

    async def add_silence(self, request: Request) -> Response:
        """Body: {"matchers": ["alertname=\"X\"", ...], "duration": "2h" or "endsAt":
        RFC 3339, "comment": TEXT, "createdBy": NAME}."""
        silences = self.silences
        if silences is None:
            return _error("this daemon sends no notifications", 404)
        try:
            body = await request.json()
            if not isinstance(body, dict):
                raise ValueError("the body must be a JSON object")
            now = self.options.clock.now()
            silence = silences.add(*silence_request(body, now))
        except ValueError as exc:
            return _error(str(exc))
        except RecursionError:
            return _error(NESTED_TOO_DEEPLY)
        log.info(
            "silence %s added by %s: %s",
            silence.id,
            silence.created_by,
            " ".join(str(m) for m in silence.matchers),
        )
        return json_response({"status": "success", "data": silence_json(silence, now)})

    async def expire_silence(self, request: Request) -> Response:
        silences = self.silences
        if silences is None:
            return _error("this daemon sends no notifications", 404)
        now = self.options.clock.now()
        try:
            silence = silences.expire(request.match_info["id"], now)
        except KeyError:
            return _error(f"no silence {request.match_info['id']!r}", 404)
        log.info("silence %s expired", silence.id)
        return json_response({"status": "success", "data": silence_json(silence, now)})

    async def reload(self, request: Request) -> Response:
        """The config file and the rule files, as SIGHUP reloads them."""
        error = await self._reload()
        if error:
            return _error(error)
        groups = len(self.rules.groups) if self.rules is not None else 0
        return json_response({"status": "success", "data": {"groups": groups}})

    async def ack(self, request: Request) -> Response:
        """Body: {"gpu": "3" | UUID | "node", "cause": KEY, "note": TEXT}."""
        try:
            body = await request.json()
        except (ValueError, RecursionError):
            return _error('the body must be JSON: {"gpu": ..., "cause": ..., "note": ...}')
        if not isinstance(body, dict):
            return _error("the body must be a JSON object")
        gpu, key, note = body.get("gpu"), body.get("cause"), body.get("note", "")
        for name, value in (("gpu", gpu), ("cause", key), ("note", note)):
            if not isinstance(value, str | int) or isinstance(value, bool):
                return _error(f"field {name!r} must be a string")
        try:
            uuid, cause = self._acknowledge(str(gpu), str(key), str(note))
        except AckError as exc:
            return _error(str(exc), exc.status)
        return json_response({"status": "success", "data": {"uuid": uuid, **cause.as_json()}})


def clear_stale_socket(path: Path) -> None:
    """Remove a socket left behind by a daemon that did not stop cleanly; refuse to take one
    that a running daemon still answers on (two daemons on one state directory), and a path
    that is something else (bind would say only "address already in use")."""
    if not path.is_socket():
        if os.path.lexists(path):
            kind = "a directory" if path.is_dir() else "a file"
            raise OSError(f"{path} is {kind}, not a socket: remove it or give another path")
        return
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
            return
    raise OSError(f"another gpuwatch is serving on {path}; give each daemon its own state dir")


class Server(Protocol):
    """What answers on a unix socket: listens on a path (again, on a new one, when the file
    was removed), and stops serving every path."""

    async def listen(self, path: str) -> None: ...

    async def stop(self) -> None: ...


# A command waits on the control socket; a connection left open is closed after this.
CONTROL_IDLE_S = 75.0
CONTROL_REQUEST_S = 30.0


def control_server(app: App) -> HttpServer:
    """The HTTP server for an app on unix sockets."""
    return HttpServer(
        app,
        idle_timeout=CONTROL_IDLE_S,
        request_timeout=CONTROL_REQUEST_S,
        shutdown_timeout=1.0,
    )


@dataclass
class UnixSocket:
    """One unix socket the daemon serves, with the permissions it is created with; made
    again when its file is removed under the daemon."""

    name: str  # "control" or "push", for log lines
    server: Server
    path: Path
    mode: int
    group: int | None = None
    recreating: asyncio.Task[None] | None = None
    inode: int | None = None  # of the file made, so close() never removes another's
    closed: bool = False  # once closing: its file is gone on purpose, not to be made again

    async def close(self) -> None:
        """Stop serving and remove the socket file, if it is still the one made here: a
        stopped daemon leaves no socket behind for a client to find and fail on."""
        self.closed = True
        await self.server.stop()
        try:
            if self.path.is_socket() and os.stat(self.path).st_ino == self.inode:
                self.path.unlink()
        except OSError as exc:
            log.warning("%s socket %s not removed: %s", self.name, self.path, exc.strerror)

    async def listen(self) -> None:
        """Listen on `path` (again, when the socket file was removed under the daemon)."""
        await self.server.listen(str(self.path))
        self.inode = os.stat(self.path).st_ino
        os.chmod(self.path, self.mode)
        if self.group is not None:
            os.chown(self.path, -1, self.group)


async def start_socket(
    name: str, server: Server, path: Path, mode: int, group: int | None = None
) -> UnixSocket:
    clear_stale_socket(path)
    served = UnixSocket(name, server, path, mode, group)
    try:
        await served.listen()
    except OSError as exc:  # a bind, or a chown to a group the daemon is not in
        await server.stop()
        raise OSError(f"{name} socket {path}: {exc.strerror or exc}") from exc
    log.info("%s socket on %s (mode %04o)", name, path, mode)
    return served
