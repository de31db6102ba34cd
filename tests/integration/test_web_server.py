"""The daemon's HTTP server (gpuwatch.web) on a unix socket, asked with raw bytes: what a
client may send that a library would not (pipelined requests, a half close, a body past the
limit still arriving, a head that never ends, both framings at once), and what it must get
back. Every exchange is bounded in time."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gpuwatch.web.app import App
from gpuwatch.web.message import Answer, Request, Response, StreamResponse, json_response
from gpuwatch.web.server import HttpServer

LIMIT = 1024


async def echo(request: Request) -> Answer:
    return json_response({"path": request.path, "query": request.query, "size": len(request.body)})


async def broken(request: Request) -> Answer:
    raise RuntimeError("a handler's bug")


async def sized(request: Request) -> Answer:
    if request.too_large:
        return Response(status=413, text=f"over {LIMIT} bytes, its own way")
    return Response(text=str(len(request.body)))


def token_check(request: Request) -> Response | None:
    if request.headers.get("authorization") == "Bearer right":
        return None
    return Response(status=401, text="no token")


async def big(request: Request) -> Answer:
    return Response(body=b"x" * (4 << 20))


async def ticks(request: Request) -> Answer:
    response = StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for i in range(3):
        await response.write(b"data: %d\n\n" % i)
    return response


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[str]:
    app = App(client_max_size=LIMIT)
    app.add_get("/big", big)
    app.add_get("/ticks", ticks)
    app.add_post("/guarded", sized, lambda: 64 * 1024 * 1024, token_check)
    app.add_get("/echo", echo)
    app.add_get("/jobs/{job}/report", echo)
    app.add_post("/echo", echo)
    app.add_get("/broken", broken)
    app.add_post("/own", sized, lambda: LIMIT)
    server = HttpServer(app, idle_timeout=1.5, request_timeout=1.5, shutdown_timeout=0.5)
    path = str(tmp_path / "http.sock")
    await server.listen(path)
    try:
        yield path
    finally:
        await server.stop()


async def exchange(path: str, *sends: bytes, pause: float = 0.0, timeout: float = 10) -> bytes:
    """Send each part (the last followed by a half close when it is b""), read to the close."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        for part in sends:
            if part == b"":
                writer.write_eof()
                continue
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause)
        return await asyncio.wait_for(reader.read(), timeout)
    finally:
        writer.close()


def statuses(data: bytes) -> list[int]:
    """Each answer's status, in order (the bodies here never hold a status line)."""
    return [int(code) for code in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)]


async def test_pipelined_requests_are_answered_in_order_and_head_has_no_body(served: str) -> None:
    data = await exchange(
        served,
        b"GET /echo?a=1&a=2 HTTP/1.1\r\nHost: x\r\n\r\n"
        b"HEAD /echo HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /jobs/llama%2F7/report HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert statuses(data) == [200, 200, 200]
    first, head_answer, last = re.split(rb"(?=HTTP/1\.1 )", data)[1:]
    assert first.endswith(b'{"path": "/echo", "query": {"a": "1"}, "size": 0}')
    # The HEAD's answer has the GET's Content-Length (41 bytes of JSON) and no body.
    assert b"Content-Length: 41\r\n" in head_answer and head_answer.endswith(b"\r\n\r\n")
    assert b'"path": "/jobs/llama/7/report"' in last  # the segment decoded, matched as one


async def test_unknown_paths_and_methods_and_a_handlers_bug(served: str) -> None:
    data = await exchange(
        served,
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n"
        b"DELETE /echo HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /broken HTTP/1.1\r\nHost: x\r\n\r\n"
        b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    )
    assert statuses(data) == [404, 405, 500, 200]
    assert b"Allow: GET, POST\r\n" in data


async def test_a_body_past_the_limit_is_answered_413_while_it_still_arrives(served: str) -> None:
    head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000000\r\n\r\n"
    # The client goes on sending after the answer: it must still read the 413, not a reset.
    data = await exchange(served, head, b"a" * 65536, b"a" * 65536, pause=0.05)
    assert statuses(data) == [413]
    chunked = b"POST /own HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    data = await exchange(served, chunked, b"400\r\n" + b"b" * 1024 + b"\r\n", b"1\r\nb\r\n")
    assert statuses(data) == [413] and data.endswith(b"its own way")


async def test_expect_continue_and_a_half_closed_client_get_their_answers(served: str) -> None:
    data = await exchange(
        served,
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nExpect: 100-continue\r\n\r\n",
        b"abc",
        b"",
    )
    assert statuses(data) == [100, 200] and data.endswith(b'"size": 3}')


async def test_a_head_that_never_ends_is_answered_408_and_closed(served: str) -> None:
    loop = asyncio.get_running_loop()
    started = loop.time()
    data = await exchange(served, b"GET /echo HTTP/1.1\r\nHost: x\r\n", timeout=10)
    assert statuses(data) == [408]
    assert 1.4 < loop.time() - started < 8
    started = loop.time()
    assert await exchange(served, timeout=10) == b""  # silent: closed without a word
    assert 1.4 < loop.time() - started < 8


@pytest.mark.parametrize(
    "request_bytes",
    [
        # Both framings: a front proxy and the daemon could disagree on where it ends.
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /broken HTTP/1.1\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nHost: x\r\n" + b"X-Long: " + b"a" * 40000 + b"\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",
    ],
    ids=["smuggle", "huge header", "tls"],
)
async def test_what_is_not_one_plain_request_is_refused_and_closed(
    served: str, request_bytes: bytes
) -> None:
    data = await exchange(served, request_bytes)
    assert statuses(data)[:1] in ([400], [431]), data[:200]
    assert 500 not in statuses(data)


async def test_an_upgrade_is_answered_as_plain_http_and_then_closed(served: str) -> None:
    data = await exchange(
        served,
        b"GET /echo HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n"
        b"\x81\x05hello",  # what it would send on, in the protocol it asked for
    )
    assert statuses(data) == [200]


async def test_a_refusal_from_the_head_never_reads_the_body(served: str) -> None:
    """Without the token, a 64 MiB body announced is answered at once, none of it held."""
    head = b"POST /guarded HTTP/1.1\r\nHost: x\r\nContent-Length: 67108864\r\n\r\n"
    data = await exchange(served, head, b"a" * 65536)
    assert statuses(data) == [401] and data.endswith(b"no token")
    right = head.replace(b"Host: x", b"Host: x\r\nAuthorization: Bearer right")
    small = right.replace(b"67108864", b"3") + b"abc"
    assert statuses(await exchange(served, small, b"")) == [200]


async def test_a_flood_of_pipelined_requests_is_cut_off(served: str) -> None:
    flood = b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n" * 5000
    data = await exchange(served, flood)
    found = statuses(data)
    assert found[-1] == 429 and 1 <= found.count(200) <= 16, found[-3:]


async def test_bare_line_ends_do_not_keep_a_connection_open(served: str) -> None:
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_unix_connection(served)
    started = loop.time()
    try:
        while not reader.at_eof() and loop.time() - started < 8:
            writer.write(b"\r\n")
            with contextlib.suppress(ConnectionError):
                await writer.drain()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(reader.read(100), 0.3)
    finally:
        writer.close()
    assert reader.at_eof() and loop.time() - started < 8


async def test_http_1_0_keep_alive_is_said_back(served: str) -> None:
    data = await exchange(
        served,
        b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\nGET /echo HTTP/1.0\r\n\r\n",
    )
    assert statuses(data) == [200, 200]
    assert data.count(b"Connection: keep-alive\r\n") == 1


async def test_a_client_that_pipelines_and_never_reads_is_let_go(served: str) -> None:
    """Three 4 MiB answers asked for at once and none read: the connection is closed after
    the idle timeout, not held (with its answers) for as long as the client stays."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_unix_connection(served)
    writer.write(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n" * 3)
    started = loop.time()
    await asyncio.sleep(5)  # nothing read meanwhile
    got = 0
    with contextlib.suppress(ConnectionError):
        while chunk := await asyncio.wait_for(reader.read(1 << 20), 10):
            got += len(chunk)
    writer.close()
    assert got < 3 * (4 << 20), got  # cut off before the third answer was whole
    assert loop.time() - started < 15


async def test_a_stream_is_chunked_for_http_1_1_and_runs_to_the_close_for_1_0(
    served: str,
) -> None:
    data = await exchange(served, b"GET /ticks HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert b"Transfer-Encoding: chunked" in data and data.endswith(b"0\r\n\r\n")
    data = await exchange(served, b"GET /ticks HTTP/1.0\r\n\r\n")
    assert b"Transfer-Encoding" not in data and b"Connection: close" in data
    assert data.endswith(b"\r\n\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\n")


async def test_stop_closes_what_is_open(tmp_path: Path) -> None:
    app = App()
    app.add_get("/echo", echo)
    server = HttpServer(app, idle_timeout=60, request_timeout=60, shutdown_timeout=0.5)
    path = str(tmp_path / "s.sock")
    await server.listen(path)
    with socket.socket(socket.AF_UNIX) as idle:
        idle.connect(path)
        await asyncio.sleep(0.1)
        assert len(server.connections) == 1
        await asyncio.wait_for(server.stop(), 5)
        idle.settimeout(5)
        assert await asyncio.get_running_loop().run_in_executor(None, idle.recv, 10) == b""
