"""One request over plain HTTP/1.1 on a socket: what the commands use to ask a daemon at an
http:// address (most of them on the node itself) or on its control socket.

http.client imports the email package to parse headers, and ssl, whether or not the URL is
https: 20 ms of the 65 a `gpuwatch health` took, in a command Slurm runs before every job and
at every health-check interval. A daemon answers a GET with a status line, a few headers and
a body of Content-Length bytes (or chunked, or up to the close, as a proxy may send it): that
is all this reads, each step bounded, the whole exchange within the timeout.
"""

from __future__ import annotations

import socket
import time
from types import TracebackType

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

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline
        self.buffer = b""
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
        out, self.buffer = self.buffer[:at], self.buffer[at + len(mark) :]
        return out

    def exactly(self, size: int) -> bytes:
        while len(self.buffer) < size:
            self.more()
            if self.closed:
                raise ConnectionResetError("the daemon closed the connection mid-answer")
        out, self.buffer = self.buffer[:size], self.buffer[size:]
        return out

    def to_close(self) -> bytes:
        while not self.closed:
            if len(self.buffer) > MAX_BODY:
                raise ValueError(f"the answer is over {MAX_BODY} bytes")
            self.more()
        return self.buffer


def get(host: str, port: int, target: str, headers: dict[str, str], timeout: float) -> Response:
    """GET `target` from host:port, on a connection of its own, closed after the answer.
    OSError (TimeoutError among them) when it cannot be sent or the answer does not come in
    time; HungUpError when the server closes without answering; NotHttpError when the
    answer is not HTTP."""
    with socket.create_connection((host, port), timeout) as sock:
        host_port = _host_header(host, port)
        return exchange(sock, host_port, "GET", target, headers, body=None, timeout=timeout)


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
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(path)
        return exchange(sock, "localhost", method, target, headers, body=body, timeout=timeout)


def exchange(
    sock: socket.socket,
    host: str,
    method: str,
    target: str,
    headers: dict[str, str],
    *,
    body: bytes | None,
    timeout: float,
) -> Response:
    """Send one request on a connected socket and read its answer, within `timeout` in all."""
    deadline = time.monotonic() + timeout
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers.items() if name != "Connection"]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b""))
    reader = _Reader(sock, deadline)
    reader.more()
    if reader.closed:
        raise HungUpError("Remote end closed connection without response")
    while len(reader.buffer) < 5 and not reader.closed:
        reader.more()
    if not reader.buffer.startswith(b"HTTP/"):  # SSH's banner, a TLS alert...
        raise NotHttpError(f"it begins {reader.buffer[:40]!r}")
    head = reader.until(b"\r\n\r\n", MAX_HEAD).decode("latin-1")
    status, reason, fields = _head(head)
    return Response(status, reason, fields, _body(reader, fields))


def _host_header(host: str, port: int) -> str:
    return (f"[{host}]" if ":" in host else host) + f":{port}"


def _head(head: str) -> tuple[int, str, dict[str, str]]:
    status_line, *rest = head.split("\r\n")
    version, _, after = status_line.partition(" ")
    code, _, reason = after.partition(" ")
    if not version.startswith("HTTP/1.") or not (code.isdigit() and len(code) == 3):
        raise NotHttpError(f"status line {status_line[:80]!r}")
    fields: dict[str, str] = {}
    for line in rest:
        name, colon, value = line.partition(":")
        if not colon:
            raise NotHttpError(f"header line {line[:80]!r}")
        fields[name.strip().lower()] = value.strip()
    return int(code), reason, fields


def _body(reader: _Reader, fields: dict[str, str]) -> bytes:
    if "chunked" in fields.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = reader.until(b"\r\n", 1024).split(b";")[0].strip()
            try:
                size = int(size_line, 16)
            except ValueError:
                raise NotHttpError(f"chunk size {size_line[:20]!r}") from None
            total += size
            if total > MAX_BODY:
                raise ValueError(f"the answer is over {MAX_BODY} bytes")
            if size == 0:
                return b"".join(parts)
            parts.append(reader.exactly(size))
            reader.exactly(2)  # the chunk's CRLF
    length = fields.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > MAX_BODY:
            raise NotHttpError(f"Content-Length {length[:20]!r}")
        return reader.exactly(int(length))
    return reader.to_close()
