"""The commands' HTTP GET against what can stand between them and a daemon: a reverse proxy's
redirects, a redirect loop, a listener that hangs up without answering (an older gpuwatch's
TLS listener), something that is not HTTP at all, an IPv6 address. Each answer is a line
that says what happened and an exit status a script can read, never a traceback."""

from __future__ import annotations

import contextlib
import http.client
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler
from typing import Any, ClassVar

import pytest

from gpuwatch.cli import main
from tests.conftest import http_server

NODE = {"data": {"verdict": "healthy", "reasons": [], "gpus": [{"index": 0, "status": "ok"}]}}


class Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[dict[str, str]]] = []

    def do_GET(self) -> None:
        Handler.seen.append({"path": self.path, **dict(self.headers)})
        if self.path.startswith("/moved"):  # a proxy's path to the daemon, moved
            self.send_response(302)
            self.send_header("Location", "/gpuwatch/node7/api/v1/node")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if self.path.startswith("/loop"):
            self.send_response(301)
            self.send_header("Location", "/loop/api/v1/node")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = json.dumps(NODE).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.seen = []
    with http_server(Handler) as url:
        yield url


@pytest.fixture
def raw() -> Iterator[tuple[str, list[bytes]]]:
    """A listener that answers each connection with the next of the given bytes, then closes
    (b"": hang up without a word)."""
    answers: list[bytes] = []
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.settimeout(10)

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                if answers:
                    conn.sendall(answers.pop(0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{listener.getsockname()[1]}", answers
    listener.close()


def test_a_redirect_from_a_proxy_in_front_of_the_daemon_is_followed(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["health", f"{server}/moved"]) == 0
    assert capsys.readouterr().out == "healthy: 1 GPUs, nothing wrong\n"
    assert [s["path"] for s in Handler.seen] == [
        "/moved/api/v1/node",
        "/gpuwatch/node7/api/v1/node",
    ]
    assert {s["User-Agent"] for s in Handler.seen} == {"gpuwatch/0.1.0"}


def test_a_redirect_loop_is_an_http_error_not_a_hang(
    server: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["events", f"{server}/loop"]) == 2
    assert "HTTP 301 The HTTP server returned a redirect error" in capsys.readouterr().err
    assert len(Handler.seen) <= 11


def test_a_listener_that_hangs_up_gets_the_tls_hint(
    raw: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, answers = raw
    answers.append(b"")
    assert main(["health", url]) == 3
    out = capsys.readouterr().out
    assert "Remote end closed connection without response" in out
    assert "(if the daemon has a web config with TLS, give an https:// URL)" in out


def test_an_answer_that_is_not_http_is_unreachable_not_a_traceback(
    raw: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, answers = raw
    answers.append(b"SSH-2.0-OpenSSH_9.6\r\n")
    assert main(["health", url]) == 3
    assert capsys.readouterr().out.startswith(f"unreachable: {url}: the answer is not HTTP")


def test_an_ipv6_address_without_a_port_goes_to_port_80(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """http.client alone reads `::1` as host `:` port 1; the command says where it went."""
    dialed: list[tuple[str, int]] = []

    def refuse(address: tuple[str, int], *args: Any, **kwargs: Any) -> socket.socket:
        dialed.append(address)
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(http.client.socket, "create_connection", refuse)
    assert main(["health", "http://[::1]"]) == 3
    assert dialed == [("::1", 80)]
    assert "Connection refused" in capsys.readouterr().out


def _answer(body: bytes, *headers: str) -> bytes:
    head = "\r\n".join(["HTTP/1.1 200 OK", "Content-Type: application/json", *headers])
    return head.encode() + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    "answer",
    [
        _answer(json.dumps(NODE).encode(), f"Content-Length: {len(json.dumps(NODE))}"),
        # chunked, as a proxy may re-frame it, with a chunk extension
        _answer(
            b"".join(
                b"%x;ext=1\r\n%s\r\n" % (len(part), part)
                for part in (json.dumps(NODE).encode()[:10], json.dumps(NODE).encode()[10:])
            )
            + b"0\r\n\r\n",
            "Transfer-Encoding: chunked",
        ),
        _answer(json.dumps(NODE).encode()),  # neither: the body runs to the close
    ],
    ids=["content-length", "chunked", "to-close"],
)
def test_each_way_an_answer_can_be_framed_reads_the_same(
    raw: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str], answer: bytes
) -> None:
    url, answers = raw
    answers.append(answer)
    assert main(["health", url]) == 0
    assert capsys.readouterr().out == "healthy: 1 GPUs, nothing wrong\n"


@contextlib.contextmanager
def one_connection(answer: Callable[[socket.socket, threading.Event], None]) -> Iterator[int]:
    """A listener on loopback whose first connection `answer(conn, done)` serves after the
    request has come; `done` is set as the test ends. Yields its port."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    done = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            answer(conn, done)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        thread.join(5)
        listener.close()


def test_an_answer_that_drips_in_is_cut_off_at_the_timeout() -> None:
    """A byte a tenth of a second: each read is quick, the whole is not. The GET gives up
    once its timeout has passed in all, not per read."""
    from gpuwatch.web.plainhttp import get

    def drip(conn: socket.socket, done: threading.Event) -> None:
        for byte in b"HTTP/1.1 200 OK\r\n" + b"X: " + b"a" * 1000:
            if done.wait(0.1):
                return
            conn.sendall(bytes([byte]))

    with one_connection(drip) as port:
        started = time.monotonic()
        with pytest.raises(TimeoutError):
            get("127.0.0.1", port, "/", {}, timeout=1.0)
        assert time.monotonic() - started < 5.0


@pytest.mark.parametrize(
    ("answer", "status", "said"),
    [
        # an interim answer before the real one, as http.client skips it
        (b"HTTP/1.1 100 Continue\r\n\r\n" + _answer(b'{"data": {"verdict": "healthy"}}'), 0, ""),
        # bare LFs, which http.client takes
        (b'HTTP/1.1 200 OK\nContent-Length: 32\n\n{"data": {"verdict": "healthy"}}', 0, ""),
        (_answer(b"{}").replace(b"200 OK", b"000 OK"), 3, "status line"),
        (_answer(b"{}", "Content-Length: 2", "Content-Length: 1"), 3, "two Content-Lengths"),
        (_answer(b"-40\r\n" + b"a" * 100, "Transfer-Encoding: chunked"), 3, "chunk size '-40'"),
        (_answer(b"2\r\n{}XX0\r\n\r\n", "Transfer-Encoding: chunked"), 3, "longer than its size"),
        (_answer(b"[]", "Content-Length: 2"), 3, "not a gpuwatch daemon's node"),
        (_answer(b"{}", "Content-Length: 99999999999"), 3, "Content-Length '99999999999'"),
        (_answer(b"zz\r\n", "Transfer-Encoding: chunked"), 3, "chunk size 'zz'"),
        (b"HTTP/1.1 200 OK\r\n" + b"X-Filler: " + b"a" * 70000, 3, "no end of line within"),
        (_answer(b'{"data": {"verd', "Content-Length: 40"), 3, "closed the connection mid-answer"),
    ],
    ids=["100-continue", "bare-lf", "status-000", "two-lengths", "negative-chunk",
         "overlong-chunk", "a-list", "huge-length", "bad-chunk", "endless-head", "cut-short"],
)  # fmt: skip
def test_answers_http_client_took_or_refused_are_taken_or_refused_alike(
    raw: tuple[str, list[bytes]],
    capsys: pytest.CaptureFixture[str],
    answer: bytes,
    status: int,
    said: str,
) -> None:
    url, answers = raw
    answers.append(answer)
    assert main(["health", url]) == status
    out = capsys.readouterr().out
    assert said in out, out
    if status == 3:  # a line that says what happened, never a traceback
        assert out.startswith(f"unreachable: {url}: "), out


def test_a_no_content_answer_on_a_connection_left_open_does_not_wait_for_the_close() -> None:
    from gpuwatch.web.plainhttp import get

    def no_content(conn: socket.socket, done: threading.Event) -> None:
        conn.sendall(b"HTTP/1.1 204 No Content\r\n\r\n")
        done.wait(10)  # open until the test ends

    with one_connection(no_content) as port:
        started = time.monotonic()
        response = get("127.0.0.1", port, "/", {}, timeout=5.0)
        assert (response.status, response.read()) == (204, b"")
        assert time.monotonic() - started < 4.0


@pytest.mark.parametrize(
    "target", ["/api/v1/silence/x HTTP/1.1\r\nHost: x\r\n\r\nDELETE /y", "/a b", "/é", "/a\x0bb"]
)
def test_a_request_that_would_split_or_bend_is_never_sent(target: str) -> None:
    """A silence id or a redirect's Location with a line break, a space or a control
    character would make one request two: refused before anything is written."""
    from gpuwatch.web.plainhttp import UnsendableError, request_bytes

    with pytest.raises(UnsendableError):
        request_bytes("localhost", "DELETE", target, {}, None)


def test_a_redirect_to_a_path_that_cannot_be_sent_is_unreachable(
    raw: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, answers = raw
    answers.append(b"HTTP/1.1 302 Found\r\nLocation: /a b\x0bc\r\nContent-Length: 0\r\n\r\n")
    assert main(["health", url]) == 3
    assert "cannot be sent in an HTTP request" in capsys.readouterr().out
