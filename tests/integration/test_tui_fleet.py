"""The dashboard against real daemons: three of them, one stopped mid-run, and
a fleet of 500 simulated nodes served by a test server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from pathlib import Path
from typing import Any

from aiohttp import web
from gpuwatch.tui.app import FleetScreen, GpuwatchApp
from gpuwatch.tui.data import HttpFeed
from gpuwatch.tui.fleet_table import FleetTable
from gpuwatch.tui.node_screen import NodeScreen
from gpuwatch.tui.prometheus import PrometheusFeed
from textual.widgets import DataTable

from gpuwatch.serve.payloads import summarize_gpus
from tests.conftest import start_daemon, stop_daemon
from tests.prometheus_server import needs_prometheus, start_prometheus
from tests.tui_fixtures import captured

REFRESH = 1.0


def row_of(table: DataTable[Any] | FleetTable, url: str) -> list[str]:
    return [str(getattr(c, "plain", c)) for c in table.get_row(url)]


async def test_a_stopped_daemon_is_marked_unreachable_within_two_refreshes(tmp_path: Path) -> None:
    daemons = [start_daemon(tmp_path / f"d{i}", "--simulate", "healthy") for i in range(3)]
    urls = [d.url for d in daemons]
    app = GpuwatchApp(HttpFeed(), urls, refresh=REFRESH)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            table = screen.query_one(FleetTable)
            deadline = time.monotonic() + 20
            while not all(screen.snapshots.get(u) and screen.snapshots[u].node for u in urls):
                assert time.monotonic() < deadline, "the daemons never showed"
                await pilot.pause(0.1)
            before = {u: screen.snapshots[u].fetched_at for u in urls}
            assert stop_daemon(daemons[2]) == 0
            stopped = time.monotonic()
            while row_of(table, urls[2])[1] != "UNREACHABLE":
                await pilot.pause(0.05)
                assert time.monotonic() - stopped < 2 * REFRESH + 0.5, "not marked in two refreshes"
            assert row_of(table, urls[2])[2] == "8/8"  # its last good data, dimmed
            await pilot.pause(2 * REFRESH)
            for url in urls[:2]:
                assert screen.snapshots[url].fetched_at > before[url] + REFRESH  # still updating
                assert row_of(table, url)[1] == "healthy"
    finally:
        for daemon in daemons[:2]:
            assert stop_daemon(daemon) == 0


class FleetServer:
    """A test server answering as `nodes` daemons, each at its own path, from the capture. It
    runs on a thread and loop of its own, as 500 real nodes would be elsewhere: served on the
    dashboard's own loop, the fleet's answers would be the dashboard's cost, and their delay
    its timeouts. Each node's answer is rendered once."""

    def __init__(self, nodes: int) -> None:
        data = captured()
        self.bodies: dict[str, bytes] = {}
        for i in range(nodes):
            payload = dict(data["node"], node=f"gpu-{i:03d}")
            payload["gpus"] = summarize_gpus(payload["gpus"])  # as the daemon answers ?gpus=summary
            self.bodies[f"{i:03d}"] = json.dumps({"status": "success", "data": payload}).encode()
        self.loop = asyncio.new_event_loop()
        self.started = threading.Event()
        self.port = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.started.wait(30), "the fleet server did not start"
        self.urls = [f"http://127.0.0.1:{self.port}/n/{n}" for n in self.bodies]

    async def _node(self, request: web.Request) -> web.Response:
        assert request.query.get("gpus") == "summary"  # what the fleet view asks for
        return web.Response(
            body=self.bodies[request.match_info["n"]], content_type="application/json"
        )

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        app = web.Application()
        app.router.add_get("/n/{n}/api/v1/node", self._node)
        self.runner = web.AppRunner(app, access_log=None)
        self.loop.run_until_complete(self.runner.setup())
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        self.loop.run_until_complete(site.start())
        self.port = self.runner.addresses[0][1]
        self.started.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.runner.cleanup())
        self.loop.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(30)


async def test_a_fleet_of_500_nodes_fills_the_table() -> None:
    fleet = FleetServer(500)
    urls = fleet.urls
    # How fast is bench/tui_refresh.py's question; here, that every node is read. The fleet
    # server shares this process's interpreter, so on a busy machine its 500 answers can take
    # longer than a node's 2 s deadline, which would be the test machine's load, not a fault.
    app = GpuwatchApp(HttpFeed(timeout=30.0), urls, refresh=3600)
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            table = screen.query_one(FleetTable)
            deadline = time.monotonic() + 30
            while table.row_count < 500:
                assert time.monotonic() < deadline, f"{table.row_count} rows"
                await pilot.pause(0.1)
            errors = {u: s.error for u, s in screen.snapshots.items() if s.error}
            assert errors == {}
            assert row_of(table, urls[0])[1] == "UNHEALTHY"
    finally:
        fleet.stop()


@needs_prometheus
async def test_the_fleet_as_a_real_prometheus_sees_it(tmp_path: Path) -> None:
    daemons = [
        start_daemon(tmp_path / "ok", "--simulate", "healthy"),
        start_daemon(tmp_path / "lost", "--simulate", "fall_off_bus"),  # GPU 1 at 10 s
    ]
    prom = start_prometheus(tmp_path, [d.url.removeprefix("http://") for d in daemons])
    app = GpuwatchApp(PrometheusFeed(prom.url), [], REFRESH, fleet=True, detail=HttpFeed())
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, FleetScreen)
            table = screen.query_one(FleetTable)
            lost = daemons[1].url

            def shown() -> bool:
                return (
                    table.row_count == 2
                    and lost in screen.snapshots
                    and row_of(table, lost)[5] == "GpuFellOffBus"
                )

            deadline = time.monotonic() + 60
            while not shown():
                assert time.monotonic() < deadline, prom.log()
                await pilot.pause(0.2)
            assert row_of(table, lost)[1:3] == ["UNHEALTHY", "7/8"]
            assert row_of(table, daemons[0].url)[1:3] == ["healthy", "8/8"]
            table.move_cursor(row=table.get_row_index(lost))
            await pilot.press("enter")  # the node view talks to the daemon itself
            node_screen = app.screen
            assert isinstance(node_screen, NodeScreen) and node_screen.url == lost
            events = node_screen.query_one("#events", DataTable)
            deadline = time.monotonic() + 10
            while events.row_count == 0:  # what only the daemon has: its journal
                assert time.monotonic() < deadline
                await pilot.pause(0.1)
            assert "xid" in {str(events.get_row_at(i)[1]) for i in range(events.row_count)}
            assert node_screen.query_one("#gpus", DataTable).row_count == 8
    finally:
        prom.stop()
        for daemon in daemons:
            assert stop_daemon(daemon) == 0


async def test_the_node_view_updates_at_once_on_an_event_from_the_stream(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, "--simulate", "fall_off_bus")  # GPU 1 at 10 s
    app = GpuwatchApp(HttpFeed(), [daemon.url], refresh=3600)  # no polling to speak of
    try:
        async with app.run_test(size=(160, 50)) as pilot:
            screen = app.screen
            assert isinstance(screen, NodeScreen)
            gpus = screen.query_one("#gpus", DataTable)
            deadline = time.monotonic() + 30
            while gpus.row_count < 8 or row_of(gpus, "1")[3] != " LOST ":
                assert time.monotonic() < deadline, "the stream never brought the fault"
                await pilot.pause(0.2)
            events = screen.query_one("#events", DataTable)
            kinds = {str(events.get_row_at(i)[1]) for i in range(events.row_count)}
            assert {"xid", "gpu_lost"} <= kinds
    finally:
        assert stop_daemon(daemon) == 0
