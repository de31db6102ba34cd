"""The push socket's own HTTP server, spoken to as clients do (curl, http.client, a job's
reporter) over a real unix socket: what it takes, what it refuses and how, and its bounds on
slow, large and many connections. Time is stepped by calling its sweep with a later time."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from gpuwatch.push.http import PARSE_ON_LOOP_BYTES, unstamped
from gpuwatch.push.jobs import JobInputs
from gpuwatch.push.registry import PushLimits
from gpuwatch.serve import pushserver
from gpuwatch.serve.pushserver import PushServer

PUSH = json.dumps(
    {"job": "llama", "labels": {"rank": "0"}, "metrics": {"train_step": 7, "train_loss": "NaN"}}
).encode()


def post(body: bytes, *, target: str = "/api/v1/push", extra: str = "") -> bytes:
    return (
        f"POST {target} HTTP/1.1\r\nHost: gpuwatch\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n{extra}\r\n"
    ).encode() + body


def large_push() -> bytes:
    """A text push of 900 series, job "big": a body parsed on a thread."""
    text = "".join(f'train_step{{rank="{r}",pad="{"p" * 80}"}} {r}\n' for r in range(900))
    body = text.encode()
    assert len(body) > PARSE_ON_LOOP_BYTES
    head = f"POST /api/v1/push?job=big HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


class Client:
    """A raw socket: what the server wrote stays readable after it closed, even when this
    side's send failed for it (a stream reader would drop it for the send's error)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    async def send(self, data: bytes) -> None:
        """As an HTTP client must: the server may answer, and close, before all is sent."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    async def _more(self) -> bytes:
        chunk = await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, 65536), 10)
        self.buffer += chunk
        return chunk

    async def until(self, end: bytes) -> bytes:
        while end not in self.buffer:
            if not await self._more():
                raise EOFError(self.buffer)
        head, _, self.buffer = self.buffer.partition(end)
        return head + end

    async def answer(self) -> tuple[int, dict[str, str], bytes]:
        head = await self.until(b"\r\n\r\n")
        status_line, *lines = head.decode().rstrip("\r\n").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
        size = int(headers.get("content-length", "0"))
        while len(self.buffer) < size:
            if not await self._more():
                raise EOFError(self.buffer)
        body, self.buffer = self.buffer[:size], self.buffer[size:]
        return int(status_line.split()[1]), headers, body

    async def closed(self) -> bool:
        return self.buffer == b"" and await self._more() == b""


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[tuple[PushServer, Path]]:
    jobs = JobInputs(PushLimits(max_body_bytes=200_000), None)
    server = PushServer(jobs, lambda: 1000.0, unstamped)
    path = tmp_path / "push.sock"
    await server.listen(str(path))
    yield server, path
    await server.stop()


async def connect(path: Path) -> Client:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, str(path))
    return Client(sock)


async def turns_until(condition: Callable[[], bool]) -> None:
    """Turns of the event loop until the server has done what the test waits for."""
    for _ in range(100_000):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("the server never got there")


def series(server: PushServer) -> dict[str, float]:
    return {f"{s.name}{dict(s.labels)}": s.value for s in server.jobs.pushed.samples(1000.0)}


async def test_a_json_push_is_taken_and_answered_as_the_api_answers(
    served: tuple[PushServer, Path],
) -> None:
    server, path = served
    client = await connect(path)
    await client.send(post(PUSH))
    status, headers, body = await client.answer()
    assert status == 200
    assert headers["content-type"] == "application/json; charset=utf-8"
    assert json.loads(body) == {"status": "success", "data": {"job": "llama", "series": 2}}
    taken = series(server)
    assert taken["train_step{'job': 'llama', 'rank': '0'}"] == 7.0
    assert math.isnan(taken["train_loss{'job': 'llama', 'rank': '0'}"])


async def test_one_connection_carries_pipelined_chunked_and_text_pushes_in_order(
    served: tuple[PushServer, Path],
) -> None:
    server, path = served
    client = await connect(path)
    text = b'train_step{rank="1"} 11\n'
    chunked = (
        b"POST /api/v1/push?job=bert HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{len(text):x}\r\n".encode()
        + text
        + b"\r\n0\r\n\r\n"
    )
    bad = json.dumps({"job": "llama", "metrics": {"gpuwatch_up": 1}}).encode()
    await client.send(post(PUSH) + chunked + post(bad))  # three requests in one write
    answers = [await client.answer() for _ in range(3)]
    assert [a[0] for a in answers] == [200, 200, 400]
    assert json.loads(answers[1][2])["data"] == {"job": "bert", "series": 1}
    assert "names starting with gpuwatch_" in json.loads(answers[2][2])["error"]
    assert series(server)["train_step{'job': 'bert', 'rank': '1'}"] == 11.0
    await client.send(post(PUSH))  # the connection stays open after a refused push
    assert (await client.answer())[0] == 200


async def test_expect_100_continue_is_answered_before_the_body(
    served: tuple[PushServer, Path],
) -> None:
    _, path = served
    client = await connect(path)
    head = post(PUSH, extra="Expect: 100-continue\r\n")[: -len(PUSH)]
    await client.send(head)
    interim = await client.until(b"\r\n\r\n")
    assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
    await client.send(PUSH)
    assert (await client.answer())[0] == 200


async def test_other_paths_and_methods_are_refused_and_the_connection_kept(
    served: tuple[PushServer, Path],
) -> None:
    _, path = served
    client = await connect(path)
    await client.send(post(b"{}", target="/api/v1/ack"))
    status, _, body = await client.answer()
    assert status == 404 and "takes POST /api/v1/push only" in json.loads(body)["error"]
    await client.send(b"GET /api/v1/push HTTP/1.1\r\nHost: x\r\n\r\n")
    status, headers, _ = await client.answer()
    assert status == 405 and headers["allow"] == "POST"
    await client.send(post(PUSH))
    assert (await client.answer())[0] == 200


@pytest.mark.parametrize(
    ("request_bytes", "status", "says"),
    [
        (
            post(b"x" * 10, extra="").replace(b"Content-Length: 10", b"Content-Length: 300000"),
            413,
            "body of 300000 bytes; the limit is 200000",
        ),
        (
            b"POST /api/v1/push?job=a HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            + (b"8000\r\n" + b"#" * 0x8000 + b"\r\n") * 7,
            413,
            "body over 200000 bytes",
        ),
        (
            b"POST /api/v1/push HTTP/1.1\r\nX-Pad: " + b"a" * 20_000 + b"\r\n\r\n",
            431,
            "request head over 16384 bytes",
        ),
        (b"NOT HTTP AT ALL\r\n\r\n", 400, "not valid HTTP/1.1"),
        # as `curl --http2` asks over plain HTTP
        (
            post(PUSH, extra="Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"),
            400,
            "protocol upgrades are not served here",
        ),
        (
            b"POST /api/v1/push HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"0\r\nX-Late: 1\r\n\r\n",
            400,
            "trailers are not taken",
        ),
        (
            b"POST /api/v1/push HTTP/1.1\r\nContent-Length: 9\r\nX-Pad: " + b"a" * 300_000,
            431,
            "request head over 16384 bytes",
        ),
    ],
)
async def test_what_cannot_be_served_is_answered_and_closed(
    served: tuple[PushServer, Path], request_bytes: bytes, status: int, says: str
) -> None:
    server, path = served
    client = await connect(path)
    await client.send(request_bytes)
    got, headers, body = await client.answer()
    assert (got, headers["connection"]) == (status, "close")
    assert says in json.loads(body)["error"]
    assert await client.closed()
    assert series(server) == {}


async def test_a_large_body_is_parsed_off_the_loop_and_answered_in_its_turn(
    served: tuple[PushServer, Path],
) -> None:
    _, path = served
    client = await connect(path)
    await client.send(large_push() + post(PUSH))
    first, second = await client.answer(), await client.answer()
    assert json.loads(first[2])["data"] == {"job": "big", "series": 900}
    assert json.loads(second[2])["data"] == {"job": "llama", "series": 2}


async def test_a_slow_request_is_answered_408_and_an_idle_connection_closed(
    served: tuple[PushServer, Path],
) -> None:
    server, path = served
    slow, idle, fresh = await connect(path), await connect(path), await connect(path)
    await slow.send(post(PUSH)[:40])  # the head, begun and never finished
    await idle.send(post(PUSH))
    assert (await idle.answer())[0] == 200
    await turns_until(lambda: len(server.connections) == 3)  # the third is accepted
    now = pushserver.PushServer.now()
    server.sweep(now + pushserver.REQUEST_TIMEOUT_S - 1)
    assert len(server.connections) == 3  # nothing has waited too long yet
    server.sweep(now + pushserver.REQUEST_TIMEOUT_S + 1)
    status, _, body = await slow.answer()
    assert status == 408 and "not received within 30 s" in json.loads(body)["error"]
    assert await slow.closed()
    server.sweep(now + pushserver.KEEPALIVE_S + 1)
    assert await idle.closed() and await fresh.closed()


async def test_past_the_most_connections_the_oldest_idle_ones_are_closed(
    served: tuple[PushServer, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(pushserver, "MAX_CONNECTIONS", 8)
    server, path = served
    busy = await connect(path)
    await busy.send(post(PUSH)[:40])  # a request underway is never the one closed
    await turns_until(lambda: any(c.started for c in server.connections))  # its bytes read
    idle = [await connect(path) for _ in range(8)]
    with caplog.at_level(logging.WARNING):
        await turns_until(lambda: len(server.connections) + server.evicted == 9)
    assert server.evicted == 2  # down to seven eighths of 8
    assert await idle[0].closed() and await idle[1].closed()
    assert "8 connections open, the most it keeps; closed 2 (the oldest idle)" in caplog.text
    await busy.send(post(PUSH)[40:])
    assert (await busy.answer())[0] == 200
    await idle[2].send(post(PUSH))
    assert (await idle[2].answer())[0] == 200


async def test_a_refused_push_is_logged_with_the_kernels_word_for_the_sender(
    served: tuple[PushServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _, path = served
    client = await connect(path)
    with caplog.at_level(logging.INFO, logger="gpuwatch.push.http"):
        await client.send(
            b"POST /api/v1/push?job=ok HTTP/1.1\r\nContent-Length: 11\r\n\r\nbad-name 1\n"
        )
        status, _, body = await client.answer()
    assert status == 400 and "not valid Prometheus text format" in json.loads(body)["error"]
    record = next(r for r in caplog.records if r.getMessage().startswith("push refused (400)"))
    assert "for job 'ok'" in record.getMessage()
    assert record.__dict__["fields"]["peer"].startswith("uid ")


async def test_a_bad_request_behind_a_large_push_is_answered_after_it(
    served: tuple[PushServer, Path],
) -> None:
    _, path = served
    client = await connect(path)
    await client.send(large_push() + b"GARBAGE\r\n\r\n")
    first, second = await client.answer(), await client.answer()
    assert (first[0], second[0]) == (200, 400)
    assert await client.closed()


async def test_a_request_pipelined_behind_an_answered_one_is_timed_too(
    served: tuple[PushServer, Path],
) -> None:
    server, path = served
    client = await connect(path)
    await client.send(post(PUSH) + post(PUSH)[:30])
    assert (await client.answer())[0] == 200
    await turns_until(lambda: any(c.started for c in server.connections))
    server.sweep(pushserver.PushServer.now() + pushserver.REQUEST_TIMEOUT_S + 1)
    assert (await client.answer())[0] == 408


async def test_a_fault_of_the_daemons_own_is_answered_500_and_logged(
    served: tuple[PushServer, Path],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server, path = served

    def broken(*_: object) -> int:
        raise RuntimeError("a bug")

    monkeypatch.setattr(server.jobs.pushed, "apply", broken)
    client = await connect(path)
    with caplog.at_level(logging.ERROR):
        await client.send(post(PUSH))
        status, _, body = await client.answer()
    assert status == 500 and "RuntimeError" in json.loads(body)["error"]
    assert "a bug" in caplog.text


async def test_with_every_connection_busy_a_new_one_is_turned_away(
    served: tuple[PushServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pushserver, "MAX_CONNECTIONS", 4)
    server, path = served
    busy = []
    for n in range(4):
        client = await connect(path)
        await client.send(post(PUSH)[:40])  # each with a request underway
        await turns_until(lambda n=n: sum(1 for c in server.connections if c.started) == n + 1)
        busy.append(client)
    late = await connect(path)
    assert await late.closed()
    assert len(server.connections) == 4 and server.evicted == 1
    await busy[0].send(post(PUSH)[40:])
    assert (await busy[0].answer())[0] == 200


async def test_a_refusal_quoting_a_huge_line_is_cut_short_in_the_reply_and_the_log(
    served: tuple[PushServer, Path], caplog: pytest.LogCaptureFixture
) -> None:
    _, path = served
    client = await connect(path)
    body = b"x " + b"a" * 150_000 + b"\n"  # the text parser's message quotes the value
    head = f"POST /api/v1/push?job=big HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n"
    with caplog.at_level(logging.INFO, logger="gpuwatch.push.http"):
        await client.send(head.encode() + body)
        status, _, reply = await client.answer()
    reason = json.loads(reply)["error"]
    assert status == 400 and reason.startswith("not valid Prometheus text format")
    assert len(reason) < 600 and reason.endswith(" characters)")
    assert max(len(r.getMessage()) for r in caplog.records) < 700
