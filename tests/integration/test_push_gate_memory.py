"""Memory a refused or dropped push must not keep, over the push socket's real connections."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path

from gpuwatch.serve.pushserver import PushServer
from tests.unit.test_push_socket import connect, large_push, served

__all__ = ["served"]  # the fixture, shared


async def test_refused_and_dropped_pushes_leave_no_body_for_the_collector(
    served: tuple[PushServer, Path],
) -> None:
    # The daemon runs the collector rarely: a body kept in a reference cycle (a refusal's
    # traceback, a connection closed mid-body) would stay for thousands of pushes.
    _, path = served
    text = "".join(f'bad name{{rank="{r}",pad="{"p" * 80}"}} {r}\n' for r in range(900)).encode()
    bad = f"POST /api/v1/push?job=big HTTP/1.1\r\nContent-Length: {len(text)}\r\n\r\n".encode()
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for _ in range(3):
            client = await connect(path)
            await client.send(bad + text)  # parsed on a thread, and refused
            assert (await client.answer())[0] == 400
            client.sock.close()
            client = await connect(path)
            await client.send(large_push()[:60_000])  # half a body, then gone
            client.sock.close()
            client = await connect(path)
            await client.send(large_push()[:300] + b"\x00" * 300)  # not HTTP: closed at once
            client.sock.close()
        await asyncio.sleep(0.05)  # the server sees them go
        gc.collect()
        # Bytes are no containers: found through what the garbage refers to.
        kept = [
            len(r)
            for o in gc.garbage
            for r in gc.get_referents(o)
            if isinstance(r, bytes | bytearray) and len(r) > 4096
        ]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert kept == []
