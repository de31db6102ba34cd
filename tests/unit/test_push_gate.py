"""What one local user may cost through the push socket: connections, parsing time, large
bodies, and memory a refusal must not keep. The user is the kernel's (SO_PEERCRED)."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from pathlib import Path

import pytest

from gpuwatch.push.http import MAX_LABEL_PAIRS, parser_for
from gpuwatch.push.parse import PushError
from gpuwatch.push.registry import PushLimits
from gpuwatch.serve import pushgate
from gpuwatch.serve.pushgate import MAX_CONNECTIONS_PER_UID, SHARE, WINDOW_S, PushGate
from gpuwatch.serve.pushserver import PushServer
from tests.unit.test_push_socket import PUSH, connect, post, served, turns_until

__all__ = ["served"]  # the fixture, shared


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_users_connections_are_bounded_and_another_user_still_gets_in() -> None:
    gate = PushGate()
    assert all(gate.connect(1000) for _ in range(MAX_CONNECTIONS_PER_UID))
    assert not gate.connect(1000)
    assert gate.connect(1001)
    gate.disconnect(1000)
    assert gate.connect(1000)


async def test_the_connection_past_a_users_bound_is_answered_429_and_closed(
    served: tuple[PushServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(pushgate, "MAX_CONNECTIONS_PER_UID", 3)
    monkeypatch.setattr("gpuwatch.serve.pushconn.MAX_CONNECTIONS_PER_UID", 3)
    server, path = served
    held = [await connect(path) for _ in range(3)]
    for client in held:  # each trickles a request it never finishes
        await client.send(post(PUSH)[:40])
    await turns_until(lambda: server.gate.open.get(os.getuid()) == 3)
    late = await connect(path)
    status, headers, body = await late.answer()
    assert status == 429 and headers["retry-after"] == "1"
    assert f"uid {os.getuid()} has 3 connections open already".encode() in body
    assert await late.closed()
    held[0].sock.close()  # one of them goes: the user may open one again
    await turns_until(lambda: server.gate.open.get(os.getuid()) == 2)
    again = await connect(path)
    await again.send(post(PUSH))
    assert (await again.answer())[0] == 200


def test_a_user_past_its_share_of_parsing_waits_and_others_do_not() -> None:
    clock = Clock()
    gate = PushGate(clock)
    gate.charge(1000, SHARE * WINDOW_S + 0.1)
    refusal = gate.refusal(1000)
    assert refusal is not None and refusal.retry_after == pytest.approx(WINDOW_S)
    assert "uid 1000 used 2.6 s" in refusal.message
    assert gate.refusal(1001) is None
    clock.now += WINDOW_S + 0.01
    assert gate.refusal(1000) is None


def test_a_user_has_two_places_for_large_bodies() -> None:
    gate = PushGate()
    assert gate.hold_large(1000) is None and gate.hold_large(1000) is None
    assert gate.hold_large(1000) is not None
    assert gate.hold_large(1001) is None
    gate.release_large(1000)
    assert gate.hold_large(1000) is None


async def test_large_bodies_are_parsed_one_at_a_time_whoever_sent_them() -> None:
    gate = PushGate()
    running, most = 0, 0
    lock = threading.Lock()

    def work() -> int:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        sum(range(300_000))  # a parse's work, holding its thread a few milliseconds
        with lock:
            running -= 1
        return 1

    done = await asyncio.gather(*(gate.parse_large(uid, work) for uid in (1, 2, 3, 1)))
    assert done == [1, 1, 1, 1] and most == 1


@pytest.mark.parametrize(
    ("label", "series", "per_series"),
    [
        ('l{i}="v{i}"', 1000, 100),  # 1000 series of 100 labels: 3 MB, 0.6 s to parse
        ('l{i}= "v"', 1000, 100),  # the parser takes `= "` too
        ('l{i} ="v"', 1, 330_000),  # one series: 330,000 labels took 49 s to parse
        ('l{i}="v"', 640, 31),  # under 32 a series, over 20,000 in all
    ],
)
def test_a_push_of_too_many_labels_is_refused_before_it_is_parsed(
    label: str, series: int, per_series: int
) -> None:
    labels = ",".join(label.format(i=i) for i in range(per_series))
    body = "".join(f'flood{{{labels},s="{s}"}} 1\n' for s in range(series)).encode()
    started = time.process_time()
    with pytest.raises(PushError, match=f"a push may have {MAX_LABEL_PAIRS} label pairs") as no:
        parser_for(body, "text/plain", "flood", PushLimits())
    assert no.value.status == 422
    assert time.process_time() - started < 0.1  # counted, not parsed


def test_a_series_of_more_labels_than_it_may_have_is_refused() -> None:
    wide = ",".join(f'l{i}="v"' for i in range(33))
    with pytest.raises(PushError, match="33 labels; a series may have 32"):
        parser_for(f"x{{{wide}}} 1\n".encode(), "text/plain", "j", PushLimits())()
