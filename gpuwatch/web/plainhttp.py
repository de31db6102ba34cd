"""One request over plain HTTP/1.1 on a socket: what the commands use to ask a daemon at an
http:// address (most of them on the node itself) or on its control socket.

http.client imports the email package to parse headers, and ssl, whether or not the URL is
https: 20 ms of the 65 a `gpuwatch health` took, in a command Slurm runs before every job and
at every health-check interval. A daemon answers a GET with a status line, a few headers and
a body of Content-Length bytes (or chunked, or up to the close, as a proxy may send it): that
is all this reads, each step bounded, the whole exchange within the timeout.
"""

from __future__ import annotations

import base64
import socket
import time
from types import TracebackType
from urllib.parse import SplitResult, unquote

MAX_HEAD = 64 * 1024  # bytes of status line and headers
MAX_BODY = 64 * 1024 * 1024  # a 64-GPU node's payload is a few hundred KB


class NotHttpError(ValueError):
    """The answer does not begin as HTTP does."""


class HungUpError(ConnectionResetError):
    """The server closed the connection without a word: what a TLS listener does to plain
    HTTP (http.client's RemoteDisconnected, under the name the commands check)."""


class Response:
    """The answer: its status, reason, headers (names lower-cased) and body, read whole."""

    def __init__(self, status: int, reason: str, headers: dict[str, str], body: bytes) -> None:
        self.status = status
        self.reason = reason
        self.msg = headers
        self._body = body
        self._at = 0

    def getheader(self, name: str, default: str | None = None) -> str | None:
        return self.msg.get(name.lower(), default)

    def read(self, size: int = -1) -> bytes:
        end = len(self._body) if size < 0 else min(len(self._body), self._at + size)
        out, self._at = self._body[self._at : end], end
        return out

    def close(self) -> None:
        self._at = len(self._body)

    def __enter__(self) -> Response:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        traceback: TracebackType | None,
        /,
    ) -> None:
        self.close()


class _Reader:
    """Bytes from the socket, every read within what is left of the timeout."""

    def __init__(self, sock: socket.socket, deadline: float, max_body: int) -> None:
        self._sock = sock
        self._deadline = deadline
        self.max_body = max_body
        self.buffer = bytearray()  # grown in place: a large answer costs its size, not its square
        self.closed = False

    def more(self) -> None:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the daemon's answer took longer than the timeout")
        self._sock.settimeout(left)
        chunk = self._sock.recv(65536)
        self.closed = not chunk
        self.buffer += chunk

    def until(self, mark: bytes, limit: int) -> bytes:
        """Up to and without `mark`; what follows stays in the buffer."""
        while (at := self.buffer.find(mark)) < 0:
            if len(self.buffer) > limit:
                raise NotHttpError(f"no end of line within {limit} bytes")
            self.more()
            if self.closed:
                raise ConnectionResetError("the daemon closed the connection mid-answer")
        out = bytes(self.buffer[:at])
        del self.buffer[: at + len(mark)]
        return out

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self.more()
            if self.closed:
                raise ConnectionResetError("the daemon closed the connection mid-answer")
        out = bytes(self.buffer[:size])
        del self.buffer[:size]
        return out

    def to_close(self) -> bytes:
        while not self.closed:
            if len(self.buffer) > self.max_body:
                raise ValueError(f"the answer is over {self.max_body} bytes")
            self.more()
        return bytes(self.buffer)


def get(host: str, port: int, target: str, headers: dict[str, str], timeout: float) -> Response:
    """GET `target` from host:port, on a connection of its own, closed after the answer.
    OSError (TimeoutError among them) when it cannot be sent or the answer does not come in
    time; HungUpError when the server closes without answering; NotHttpError when the
    answer is not HTTP; UnsendableError when the request cannot be written as HTTP."""
    deadline = time.monotonic() + timeout
    request = request_bytes(_host_header(host, port), "GET", target, headers, None)
    with socket.create_connection((host, port), timeout) as sock:
        return exchange(sock, request, deadline)


def over_unix_socket(
    path: str,
    method: str,
    target: str,
    headers: dict[str, str],
    *,
    body: bytes | None,
    timeout: float,
) -> Response:
    """One request on a unix socket (the daemon's control socket), as `get`."""
    deadline = time.monotonic() + timeout
    request = request_bytes("localhost", method, target, headers, body)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        return exchange(sock, request, deadline)


class UnsendableError(ValueError):
    """The request cannot be written as HTTP: a control character, a space or a character
    outside ASCII in its target or a header (what would let a name or an id given on the
    command line split one request into two)."""


def request_bytes(
    host: str, method: str, target: str, headers: dict[str, str], body: bytes | None
) -> bytes:
    fields = {"Host": host, "Connection": "close", "Accept-Encoding": "identity"}
    fields.update((k, v) for k, v in headers.items() if k not in fields)
    if body is not None:
        fields["Content-Length"] = str(len(body))
    # A value may hold text beyond ASCII (a receiver's name in an idempotency key), written
    # as UTF-8 as aiohttp wrote it; the target and the names may not. Nothing may hold a
    # control character: that is what would split one request into two.
    for part in (target, *fields, *fields.values()):
        if any(c < " " or c == "\x7f" for c in part):
            raise UnsendableError(f"{part[:60]!r} cannot be sent in an HTTP request")
    for part in (target, *fields):
        if not part.isascii():
            raise UnsendableError(f"{part[:60]!r} cannot be sent in an HTTP request")
    if " " in target or not target.startswith("/"):
        raise UnsendableError(f"{target[:60]!r} is not a path to ask for")
    lines = [f"{method} {target} HTTP/1.1", *(f"{k}: {v}" for k, v in fields.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def exchange(
    sock: socket.socket, request: bytes, deadline: float, max_body: int = MAX_BODY
) -> Response:
    """Send a request on a connected socket and read its answer, by `deadline` in all, its
    body up to `max_body` bytes (ValueError past it)."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError("the daemon's answer took longer than the timeout")
    sock.settimeout(left)
    sock.sendall(request)
    reader = _Reader(sock, deadline, max_body)
    reader.more()
    if reader.closed:
        raise HungUpError("Remote end closed connection without response")
    while len(reader.buffer) < 5 and not reader.closed:
        reader.more()
    if not reader.buffer.startswith(b"HTTP/"):  # SSH's banner, a TLS alert...
        raise NotHttpError(f"it begins {bytes(reader.buffer[:40])!r}")
    while True:
        status, reason, fields = _head(reader)
        if not 100 <= status < 200:
            break  # an interim answer (100 Continue) goes before the real one
    if status in (204, 304):  # no body, whatever the headers say
        return Response(status, reason, fields, b"")
    return Response(status, reason, fields, _body(reader, fields))


def basic_auth(parts: SplitResult) -> str | None:
    """The Authorization header for a URL's user:password@, or None without one."""
    if parts.username is None:
        return None
    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
    return "Basic " + base64.b64encode(pair.encode()).decode()


def ascii_host(parts: SplitResult) -> str:
    """The URL's host as the network knows it: a name beyond ASCII in its IDNA form."""
    host = parts.hostname or ""
    return host if host.isascii() else host.encode("idna").decode("ascii")


def host_and_port(parts: SplitResult) -> str:
    """The URL's host[:port], without user:password@ (an IPv6 address in brackets)."""
    host = ascii_host(parts)
    return (f"[{host}]" if ":" in host else host) + (f":{parts.port}" if parts.port else "")


def _host_header(host: str, port: int) -> str:
    return (f"[{host}]" if ":" in host else host) + f":{port}"


def _line(reader: _Reader, limit: int) -> str:
    """One line of the head, its CRLF (or a bare LF, as http.client takes) off."""
    return reader.until(b"\n", limit).removesuffix(b"\r").decode("latin-1")


def _head(reader: _Reader) -> tuple[int, str, dict[str, str]]:
    status_line = _line(reader, MAX_HEAD)
    version, _, after = status_line.partition(" ")
    code, _, reason = after.partition(" ")
    if not version.startswith("HTTP/1.") or not (
        len(code) == 3 and code.isascii() and code.isdigit() and 100 <= int(code) <= 599
    ):
        raise NotHttpError(f"status line {status_line[:80]!r}")
    fields: dict[str, str] = {}
    size = len(status_line)
    while line := _line(reader, MAX_HEAD):
        size += len(line)
        if size > MAX_HEAD:
            raise NotHttpError(f"a head over {MAX_HEAD} bytes")
        name, colon, value = line.partition(":")
        if not colon:
            raise NotHttpError(f"header line {line[:80]!r}")
        key, value = name.strip().lower(), value.strip()
        if key == "content-length" and fields.get(key, value) != value:
            raise NotHttpError("two Content-Lengths that differ")
        fields[key] = value
    return int(code), reason, fields


def _body(reader: _Reader, fields: dict[str, str]) -> bytes:
    if "chunked" in fields.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        total = 0
        while True:
            size_text = _line(reader, 1024).split(";")[0].strip()
            if not size_text or len(size_text) > 16 or any(c not in HEX for c in size_text):
                raise NotHttpError(f"chunk size {size_text[:20]!r}")
            size = int(size_text, 16)
            total += size
            if total > reader.max_body:
                raise ValueError(f"the answer is over {reader.max_body} bytes")
            if size == 0:
                return b"".join(parts)
            parts.append(reader.exactly(size))
            if reader.exactly(2) != b"\r\n":
                raise NotHttpError("a chunk longer than its size")
    length = fields.get("content-length")
    if length is not None:
        if not (length.isascii() and length.isdigit()) or int(length) > reader.max_body:
            raise NotHttpError(f"Content-Length {length[:20]!r}")
        return reader.exactly(int(length))
    return reader.to_close()


HEX = frozenset("0123456789abcdefABCDEF")
