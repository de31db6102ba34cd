"""What the daemon asks with (gpuwatch.web.fetch), against real servers on loopback: a
receiver that never answers fills only its own lane, a redirect that keeps the method is
followed, a URL as an operator writes it (spaces, accents) is sent encoded."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from typing import ClassVar

import pytest

from gpuwatch.web import fetch as fetch_module
from gpuwatch.web.fetch import fetch
from gpuwatch.web.plainhttp import UnsendableError
from tests.conftest import http_server, silent_listener


class Handler(BaseHTTPRequestHandler):
    seen: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        Handler.seen.append(("POST", self.path, body))
        if self.path.startswith("/moved"):
            self.send_response(308)
            self.send_header("Location", "/final")
        else:
            self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        Handler.seen.append(("GET", self.path, b""))
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    Handler.seen = []
    with http_server(Handler) as url:
        yield url


@pytest.fixture
def silent() -> Iterator[str]:
    with silent_listener("/hook") as url:
        yield url


async def test_a_redirect_keeping_the_method_is_followed_with_the_body(server: str) -> None:
    answer = await fetch("POST", f"{server}/moved", body=b"{}", timeout=5, lane="notify")
    assert answer.status == 200
    assert Handler.seen == [("POST", "/moved", b"{}"), ("POST", "/final", b"{}")]


async def test_a_url_as_written_is_sent_encoded(server: str) -> None:
    answer = await fetch("GET", f"{server}/höok?to=Zoë A", timeout=5, lane="sources")
    assert (answer.status, answer.body) == (200, b"ok")
    assert Handler.seen == [("GET", "/h%C3%B6ok?to=Zo%C3%AB%20A", b"")]


async def test_a_header_value_beyond_ascii_is_sent_as_utf8(server: str) -> None:
    """A receiver's name, in the idempotency key, may be any text; a line break may not."""
    headers = {"Idempotency-Key": "équipe/abc"}
    answer = await fetch("POST", f"{server}/hook", body=b"{}", headers=headers, timeout=5,
                         lane="notify")  # fmt: skip
    assert answer.status == 200
    with pytest.raises(UnsendableError):
        await fetch("POST", f"{server}/hook", headers={"X": "a\r\nB: c"}, timeout=5, lane="notify")


async def test_receivers_that_never_answer_hold_up_only_their_own_lane(
    server: str, silent: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(fetch_module.LANES, "notify", threading.BoundedSemaphore(2))
    loop = asyncio.get_running_loop()
    hung = [
        asyncio.ensure_future(fetch("POST", silent, body=b"{}", timeout=3, lane="notify"))
        for _ in range(4)
    ]
    await asyncio.sleep(0.2)
    started = loop.time()
    answer = await fetch("GET", f"{server}/metrics", timeout=3, lane="sources")
    assert answer.status == 200 and loop.time() - started < 1.0
    # The two waiting for a place in the full lane end by their own deadline, not later.
    outcomes = await asyncio.gather(*hung, return_exceptions=True)
    assert all(isinstance(o, TimeoutError) for o in outcomes), outcomes
    assert loop.time() - started < 4.5
