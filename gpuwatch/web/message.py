"""A request as the server hands it to a handler, and the answers a handler gives back: a whole
response, or a stream written as it goes (server-sent events)."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.parse
from collections.abc import Iterable, Mapping
from functools import cached_property
from http import HTTPStatus
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from gpuwatch.web.connection import HttpConnection


class Headers(dict[str, str]):
    """A request's header fields, names lower-cased; asked by name in any case. A field sent
    twice keeps its values joined by ", ", as HTTP allows for a list."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name.lower() if isinstance(name, str) else name)


class Request:
    """One request, its body read whole (up to its route's limit) before a handler sees it."""

    def __init__(
        self,
        connection: HttpConnection,
        method: str,
        target: str,
        headers: Headers,
    ) -> None:
        self.connection = connection
        self.method = method
        self.target = target
        self.headers = headers
        self.body = b""
        self.too_large = False  # the body passed its route's limit: not read, answered 413
        self.refusal: Response | None = None  # its route refused it from its head alone
        self.version = "1.1"
        self.match_info: dict[str, str] = {}
        raw_path, _, self.query_string = target.partition("?")
        self.path = urllib.parse.unquote(raw_path)

    @cached_property
    def query(self) -> dict[str, str]:
        """The query's fields, the first of a name sent twice (as aiohttp's `get` gave)."""
        fields: dict[str, str] = {}
        for name, value in urllib.parse.parse_qsl(self.query_string, keep_blank_values=True):
            fields.setdefault(name, value)
        return fields

    @property
    def content_type(self) -> str:
        given = self.headers.get("content-type", "")
        return given.partition(";")[0].strip().lower() or "application/octet-stream"

    @property
    def content_length(self) -> int | None:
        given = self.headers.get("content-length")
        return int(given) if given is not None and given.isdigit() else None

    @property
    def transport(self) -> asyncio.Transport | None:
        return self.connection.transport

    @property
    def remote(self) -> str | None:
        """The client's address on TCP; None on a unix socket (the kernel names its user)."""
        transport = self.connection.transport
        peer = transport.get_extra_info("peername") if transport is not None else None
        return str(peer[0]) if isinstance(peer, tuple) and peer else None

    async def json(self) -> Any:
        return json.loads(self.body)


class Response:
    """A whole answer: status, headers and body."""

    def __init__(
        self,
        *,
        status: int = 200,
        body: bytes = b"",
        text: str | None = None,
        content_type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.status = status
        self.headers: dict[str, str] = {}
        if text is not None:
            body = text.encode()
            self.headers["Content-Type"] = f"{content_type or 'text/plain'}; charset=utf-8"
        elif content_type is not None:
            self.headers["Content-Type"] = content_type
        elif body:
            self.headers["Content-Type"] = "application/octet-stream"
        self.body = body
        if headers:
            self.headers.update(headers)


def json_response(
    data: Any, status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    return Response(
        status=status,
        body=json.dumps(data).encode(),
        content_type="application/json; charset=utf-8",
        headers=headers,
    )


class StreamResponse:
    """An answer written while the handler runs (chunked): `prepare` sends the head, each
    `write` a chunk, waiting while the client has not read what was sent before."""

    def __init__(self, *, headers: Mapping[str, str] | None = None) -> None:
        self.status = 200
        self.headers: dict[str, str] = dict(headers or {})
        self.chunked = True
        self._connection: HttpConnection | None = None

    async def prepare(self, request: Request) -> None:
        """Send the head. HTTP/1.0 has no chunks: the stream runs to the connection's close."""
        self._connection = request.connection
        self.chunked = request.version != "1.0"
        fields = {**self.headers, **({"Transfer-Encoding": "chunked"} if self.chunked else {})}
        request.connection.send(head(self.status, fields.items(), close=not self.chunked))
        if not self.chunked:
            request.connection.close_after = True

    async def write(self, data: bytes) -> None:
        connection = self._connection
        assert connection is not None, "prepare() first"
        if connection.closing:
            raise ConnectionResetError("the client went away")
        connection.send(b"%x\r\n%s\r\n" % (len(data), data) if self.chunked else data)
        await connection.drained()


Answer = Response | StreamResponse


def error_text(status: int) -> Response:
    """A bare error's body, as "404: Not Found"."""
    return Response(status=status, text=f"{status}: {HTTPStatus(status).phrase}")


def head(status: int, fields: Iterable[tuple[str, str]], *, close: bool) -> bytes:
    lines = [f"HTTP/1.1 {status} {_phrase(status)}", f"Date: {_date()}"]
    lines += [f"{name}: {value}" for name, value in fields]
    if close:
        lines.append("Connection: close")
    # UTF-8, as aiohttp wrote them: an operator's header text outside latin-1 still goes out.
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


_dated: list[Any] = [0, ""]  # (the second, its Date text): one strftime a second


def _date() -> str:
    now = int(time.time())
    if _dated[0] != now:
        _dated[:] = [now, time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(now))]
    return cast(str, _dated[1])
