"""The fleet view's refresh time for 1, 50 and 500 nodes: fetching every node's
/api/v1/node?gpus=summary concurrently from a loopback test server (answering as N daemons, from the
real capture in tests/fixtures/tui) and updating the table, in a headless Textual app.

The test server runs in a process of its own; on a 2-core machine it competes with the
dashboard for CPU, and it answers 500 "daemons" one request at a time, where a real fleet
answers in parallel. So both are printed: the wall time of a refresh, and the dashboard
process's own CPU time for it. A refresh's repaint of the screen happens while the next one
waits for its answers, so it is counted in that one.

Goal: under 100 ms a refresh at 500 nodes. Run: .venv/bin/python bench/tui_refresh.py
[--client aiohttp]: the dashboard's own HTTP client (tui/http.py), or the same requests
through aiohttp's client, to see what the hand-written one earns.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import platform
import socket
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiohttp
from gpuwatch.tui.app import FleetScreen, GpuwatchApp
from gpuwatch.tui.data import HttpFeed
from gpuwatch.tui.fleet_table import FleetTable

from gpuwatch.gctune import tune_gc
from gpuwatch.serve.payloads import summarize_gpus
from gpuwatch.text.printable import printable_json

CAPTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tui" / "fall_off_bus.json"
REFRESHES = 30
VERSIONS = 4


def _server(port: int, nodes: int, ready: Any) -> None:
    """The fleet's daemons, in a process of their own: their cost is not the dashboard's.
    Each node's answers cycle through versions with other temperatures and utilizations, as
    a live fleet's do, so every refresh has rows to change. One process answers for all the
    nodes, where a real fleet answers in parallel, so the answers are whole HTTP responses
    encoded beforehand, written by a bare asyncio protocol: that keeps the fleet's side of a
    refresh small next to the dashboard's."""
    data = json.loads(CAPTURE.read_text())
    versions: dict[bytes, list[bytes]] = {}
    for n in range(nodes):
        name = f"{n:03d}"
        versions[f"/n/{name}/api/v1/node?gpus=summary".encode()] = answers = []
        for version in range(VERSIONS):
            payload = dict(data["node"], node=f"gpu-{name}")
            payload["gpus"] = summarize_gpus(payload["gpus"])  # as the daemon answers it
            for i, gpu in enumerate(payload["gpus"]):
                if gpu["metrics"]:
                    gpu["metrics"]["temperature_celsius"] = 50.0 + (n + version + i) % 40
                    gpu["metrics"]["utilization_ratio"] = ((n + version * 7 + i) % 100) / 100
            body = json.dumps({"status": "success", "data": payload}).encode()
            head = (
                f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
            )
            answers.append(head.encode() + b"\r\n\r\n" + body)
    missing = b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
    answered = 0

    class Daemons(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport, self.buffer = transport, b""

        def data_received(self, data: bytes) -> None:
            nonlocal answered
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:
                request, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                path = request.split(b" ", 2)[1]
                answered += 1
                node = versions.get(path)
                self.transport.write(node[answered % VERSIONS] if node else missing)

    async def serve_forever() -> None:
        server = await asyncio.get_running_loop().create_server(Daemons, "127.0.0.1", port)
        ready.set()
        await server.serve_forever()

    asyncio.run(serve_forever())


class AiohttpClient:
    """tui/http.py's JsonClient.get_many through aiohttp: one session, a pooled connection
    per node, every request at once under one deadline, the body's JSON made printable."""

    def __init__(self, timeout: float) -> None:
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session: aiohttp.ClientSession | None = None

    async def _get(self, session: aiohttp.ClientSession, url: str) -> Any:
        async with session.get(url, headers={"Accept": "application/json"}) as response:
            if not 200 <= response.status < 300:
                return RuntimeError(f"HTTP {response.status}")
            return printable_json(json.loads(await response.read()))

    async def get_many(self, urls: Sequence[str]) -> list[Any]:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0)
            self._session = aiohttp.ClientSession(connector=connector, timeout=self.timeout)
        session = self._session
        return list(
            await asyncio.gather(*(self._get(session, u) for u in urls), return_exceptions=True)
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()


def serve(nodes: int) -> tuple[multiprocessing.Process, list[str]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_server, args=(port, nodes, ready), daemon=True)
    server.start()
    ready.wait(10)
    time.sleep(0.5)
    return server, [f"http://127.0.0.1:{port}/n/{i:03d}" for i in range(nodes)]


async def measure(nodes: int, client: str) -> tuple[list[float], list[float]]:
    server, urls = serve(nodes)
    source = HttpFeed()
    if client == "aiohttp":
        source.client = AiohttpClient(source.client.timeout)  # type: ignore[assignment]
    app = GpuwatchApp(source, urls, refresh=3600, fleet=True)
    times: list[float] = []
    cpu: list[float] = []
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            while len(screen.snapshots) < nodes:
                await pilot.pause(0.05)
            for _ in range(REFRESHES):
                t0, c0 = time.perf_counter(), time.process_time()
                await screen.poll().wait()
                times.append((time.perf_counter() - t0) * 1000)
                cpu.append((time.process_time() - c0) * 1000)
            errors = {s.error for s in screen.snapshots.values() if s.error}
            assert not errors, errors  # every refresh measured was a whole fleet's data
            assert screen.query_one(FleetTable).row_count == nodes
    finally:
        server.terminate()
    return times, cpu


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--client", choices=("bare", "aiohttp"), default="bare")
    client = parser.parse_args().client
    tune_gc()  # as `gpuwatch tui` does
    print(
        f"machine: {platform.machine()}, Python {platform.python_version()}; {REFRESHES} each; "
        f"client: {client}"
    )
    for nodes in (1, 50, 500):
        times, cpu = asyncio.run(measure(nodes, client))
        print(
            f"{nodes:>4} nodes  wall p50 {statistics.median(times):6.1f} ms  "
            f"mean {statistics.mean(times):6.1f}  max {max(times):6.1f}   "
            f"dashboard CPU p50 {statistics.median(cpu):6.1f} ms  mean {statistics.mean(cpu):6.1f}"
        )


if __name__ == "__main__":
    main()
