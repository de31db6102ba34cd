"""The dashboard's HTTP client against real servers on loopback: aiohttp's (what the daemon
runs), and raw sockets for what aiohttp would not send."""

from __future__ import annotations

import asyncio
import base64
import socket
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import trustme
from aiohttp import web
from gpuwatch.tui.http import HttpError, JsonClient

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


async def serve(
    handler: Handler, *, tls: ssl.SSLContext | None = None, keepalive: float = 75.0
) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.router.add_get("/{tail:.*}", handler)
    runner = web.AppRunner(app, keepalive_timeout=keepalive)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"{'https' if tls else 'http'}://127.0.0.1:{port}"


@pytest.fixture
async def client() -> AsyncIterator[JsonClient]:
    c = JsonClient(timeout=1.0)
    yield c
    await c.close()


async def test_keeps_one_connection_per_node_between_requests(client: JsonClient) -> None:
    peers: list[Any] = []

    async def handler(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        return web.json_response({"data": {"path": request.path_qs}})

    runner, url = await serve(handler)
    try:
        for _ in range(3):
            assert await client.get_json(f"{url}/api/v1/node?gpus=summary") == {
                "data": {"path": "/api/v1/node?gpus=summary"}
            }
        assert len(peers) == 3 and len(set(peers)) == 1
    finally:
        await runner.cleanup()


async def test_reads_a_chunked_body_and_honours_connection_close(client: JsonClient) -> None:
    peers: list[Any] = []

    async def chunked(request: web.Request) -> web.StreamResponse:
        peers.append(request.transport.get_extra_info("peername") if request.transport else None)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        response.enable_chunked_encoding()
        if request.path == "/close":
            response.force_close()
        await response.prepare(request)
        for part in (b'{"data": ', b"[1, 2, ", b"3]}"):
            await response.write(part)
            await asyncio.sleep(0.01)
        await response.write_eof()
        return response

    runner, url = await serve(chunked)
    try:
        assert await client.get_json(f"{url}/close") == {"data": [1, 2, 3]}
        assert await client.get_json(f"{url}/again") == {"data": [1, 2, 3]}
        assert len(set(peers)) == 2  # the server said close: a new connection
    finally:
        await runner.cleanup()


async def test_a_connection_the_server_closed_while_idle_is_replaced(client: JsonClient) -> None:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    runner, url = await serve(handler, keepalive=0.1)
    try:
        assert await client.get_json(url) == {"ok": True}
        await asyncio.sleep(0.4)  # the server has closed the idle connection by now
        assert await client.get_json(url) == {"ok": True}
    finally:
        await runner.cleanup()


async def test_each_failure_is_its_own_and_none_waits_past_the_timeout() -> None:
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        if request.path == "/slow":
            await release.wait()
        if request.path == "/broken":
            return web.Response(status=503)
        if request.path == "/text":
            return web.Response(text="<html>not json</html>")
        return web.json_response({"ok": True})

    runner, url = await serve(handler)
    with socket.socket() as s:  # a port bound and closed again: nothing listens there
        s.bind(("127.0.0.1", 0))
        refused = f"http://127.0.0.1:{s.getsockname()[1]}/"
    client = JsonClient(timeout=0.5)
    try:
        await client.get_json(url)  # one open connection to reuse; the others are new
        started = time.monotonic()
        answers = await client.get_many(
            [url, f"{url}/slow", f"{url}/broken", f"{url}/text", refused, "ftp://x/"]
        )
        took = time.monotonic() - started
    finally:
        release.set()
        await client.close()
        await runner.cleanup()
    assert answers[0] == {"ok": True}
    assert isinstance(answers[1], TimeoutError)
    assert isinstance(answers[2], HttpError) and str(answers[2]) == "HTTP 503"
    assert isinstance(answers[3], ValueError)
    assert isinstance(answers[4], ConnectionRefusedError)
    assert isinstance(answers[5], ValueError) and "not an http(s) URL" in str(answers[5])
    assert 0.4 < took < 1.5


async def test_basic_auth_comes_from_the_url(client: JsonClient) -> None:
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization", ""))
        return web.json_response({"ok": True})

    runner, url = await serve(handler)
    try:
        await client.get_json(url.replace("://", "://ops:s%40cret@") + "/api/v1/node")
    finally:
        await runner.cleanup()
    assert seen == ["Basic " + base64.b64encode(b"ops:s@cret").decode()]


async def test_https_with_the_fleet_ca() -> None:
    ca = trustme.CA()
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(server_tls)
    client_tls = ssl.create_default_context()
    ca.configure_trust(client_tls)

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"secure": request.secure})

    runner, url = await serve(handler, tls=server_tls)
    client = JsonClient(timeout=2.0, tls=client_tls)
    untrusting = JsonClient(timeout=2.0)  # the system's CAs do not know this one
    try:
        assert await client.get_json(url) == {"secure": True}
        with pytest.raises(ssl.SSLCertVerificationError):
            await untrusting.get_json(url)
    finally:
        await client.close()
        await untrusting.close()
        await runner.cleanup()


async def test_a_response_without_a_length_is_read_until_the_server_closes() -> None:
    async def http10(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b'HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{"old": ')
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"true}")
        writer.close()

    server = await asyncio.start_server(http10, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    client = JsonClient(timeout=1.0)
    try:
        assert await client.get_json(f"http://127.0.0.1:{port}/") == {"old": True}
    finally:
        await client.close()
        server.close()
        await server.wait_closed()
