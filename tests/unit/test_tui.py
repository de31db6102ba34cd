"""The dashboard driven as a user would (Textual's Pilot), on fixed data, and its SVG snapshots."""

from __future__ import annotations

from typing import Any

from gpuwatch.tui.app import FleetScreen, GpuwatchApp, HelpScreen
from gpuwatch.tui.fleet_table import FleetTable
from gpuwatch.tui.node_screen import AlertScreen, NodeScreen
from gpuwatch.tui.rows import GPU_COLUMNS, by_severity, gpu_cells, process_cells
from textual.widgets import DataTable, Static

from tests.tui_fixtures import FixedFeed, healthy, snapshot

SIZE = (160, 50)
NODE = "http://node-a:10040"


def cells(table: DataTable[Any] | FleetTable, row: int) -> list[str]:
    return [str(getattr(c, "plain", c)) for c in table.get_row_at(row)]


async def test_the_node_view_shows_every_gpu_the_verdict_and_the_firing_alert() -> None:
    app = GpuwatchApp(FixedFeed({NODE: snapshot(NODE)}), [NODE], refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        header = str(screen.query_one("#header", Static).render())
        assert "UNHEALTHY" in header and "GPU 1 is lost" in header
        gpus = screen.query_one("#gpus", DataTable)
        assert gpus.row_count == 8
        assert cells(gpus, 1)[2:4] == ["UNHEALTHY", " LOST "]
        alerts = screen.query_one("#alerts", DataTable)
        assert cells(alerts, 0)[:3] == ["critical", "GpuFellOffBus", "1"]
        processes = screen.query_one("#processes", DataTable)
        assert cells(processes, 0)[0] == "0"  # the GPU under the cursor
        assert cells(processes, 0)[5].startswith("Slurm job 81234 of ")
        assert NODE in header  # which daemon this is, a second demo's port included
        # Enter on an alert: the whole of it, which the Action column cuts short.
        alerts.focus()
        await pilot.press("enter")
        assert isinstance(app.screen, AlertScreen)
        whole = str(app.screen.query_one("#alert", Static).render())
        assert "GpuFellOffBus" in whole and "action: " in whole and "uuid=" in whole
        await pilot.press("escape")
        assert isinstance(app.screen, NodeScreen)
        await pilot.press("question_mark")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.press("q")
    assert app.return_code == 0


async def test_the_fleet_view_sorts_filters_and_drills_into_a_node() -> None:
    urls = ["http://a:10040", "http://b:10040", "http://c:10040"]
    source = FixedFeed(
        {
            urls[0]: healthy(urls[0], "gpu-a", hottest=60),
            urls[1]: snapshot(urls[1], "gpu-b"),
            urls[2]: healthy(urls[2], "gpu-c", hottest=80),
        }
    )
    app = GpuwatchApp(source, urls, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        table = screen.query_one(FleetTable)
        assert [cells(table, i)[0] for i in range(3)] == ["gpu-b", "gpu-a", "gpu-c"]  # worst first
        assert cells(table, 0)[1:3] == ["UNHEALTHY", "7/8"]
        assert cells(table, 0)[5] == "GpuFellOffBus"
        await pilot.press("s", "s")  # verdict -> node -> hottest
        assert [cells(table, i)[0] for i in range(3)] == ["gpu-c", "gpu-b", "gpu-a"]
        await pilot.press("slash", "g", "p", "u", "-", "a", "enter")
        assert table.row_count == 1 and cells(table, 0)[0] == "gpu-a"
        await pilot.press("escape")
        assert table.row_count == 3
        assert table.cursor_key == urls[0]  # the cursor stays on the node the filter found
        await pilot.press("k", "enter")  # up to gpu-b, and open it
        assert isinstance(app.screen, NodeScreen) and app.screen.url == urls[1]
        await pilot.pause()
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)
        # The mouse: a click moves the cursor to the row, a second click opens it.
        await pilot.click(FleetTable, offset=(3, 3))  # line 0 is the header: row 2, gpu-a
        assert table.cursor_key == urls[0]
        await pilot.click(FleetTable, offset=(3, 3))
        assert isinstance(app.screen, NodeScreen) and app.screen.url == urls[0]
        await pilot.pause()
        await pilot.press("escape")
        assert isinstance(app.screen, FleetScreen)


async def test_an_unreachable_node_is_marked_and_keeps_its_last_data_dimmed() -> None:
    urls = ["http://a:10040", "http://b:10040"]
    source = FixedFeed({urls[0]: healthy(urls[0], "gpu-a"), urls[1]: healthy(urls[1], "gpu-b")})
    app = GpuwatchApp(source, urls, refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, FleetScreen)
        source.down[urls[1]] = "Cannot connect to host b:10040"
        screen.poll()
        await pilot.pause()
        table = screen.query_one(FleetTable)
        row = next(cells(table, i) for i in range(2) if cells(table, i)[0] == "gpu-b")
        assert row[1] == "UNREACHABLE" and row[2] == "8/8"  # the last good data, kept
        assert row[6] == "Cannot connect to host b:10040"


async def test_mig_instances_created_later_are_shown_under_their_gpu() -> None:
    source = FixedFeed({NODE: snapshot(NODE)})
    app = GpuwatchApp(source, [NODE], refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, NodeScreen)
        gpus = screen.query_one("#gpus", DataTable)
        for _ in range(5):
            await pilot.press("down")
        assert gpus.cursor_row == 5
        source.snapshots[NODE].node["gpus"][2]["mig_instances"] = [
            {
                "gpu_i_id": 1,
                "gpu_i_profile": "4g.40gb",
                "memory_used_bytes": 2**30,
                "memory_total_bytes": 40 * 2**30,
                "pids": [4242],
            },
            {
                "gpu_i_id": 5,
                "gpu_i_profile": "3g.40gb",
                "memory_used_bytes": 0,
                "memory_total_bytes": 40 * 2**30,
                "pids": [],
            },
        ]
        screen.poll()
        await app.workers.wait_for_complete()
        await pilot.pause()
        order = [str(k.value) for k in gpus.rows]
        assert order == ["0", "1", "2", "2/gi1", "2/gi5", "3", "4", "5", "6", "7"]
        assert cells(gpus, 3)[:2] == ["  └ 1", "MIG 4g.40gb"]
        assert cells(gpus, gpus.cursor_row)[0] == cells(gpus, 7)[0]  # still on GPU 5


async def settled(pilot: Any) -> None:
    """Wait until the first refresh has filled the screen, and its layout has settled."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause()
    await pilot.pause()


def test_node_view_snapshot(snap_compare: Any) -> None:
    app = GpuwatchApp(FixedFeed({NODE: snapshot(NODE)}), [NODE], refresh=3600)
    assert snap_compare(app, terminal_size=SIZE, run_before=settled)


def fleet_of_twelve() -> GpuwatchApp:
    urls = [f"http://gpu-{i:02d}:10040" for i in range(12)]
    snaps = {u: healthy(u, f"gpu-{i:02d}", hottest=60 + i) for i, u in enumerate(urls)}
    snaps[urls[3]] = snapshot(urls[3], "gpu-03")
    source = FixedFeed(snaps)
    source.down[urls[7]] = "no answer in time"
    return GpuwatchApp(source, urls, refresh=3600)


def test_fleet_view_snapshot(snap_compare: Any) -> None:
    assert snap_compare(fleet_of_twelve(), terminal_size=SIZE, run_before=settled)


def test_fleet_view_in_the_light_theme_snapshot(snap_compare: Any) -> None:
    async def light(pilot: Any) -> None:
        pilot.app.theme = "textual-light"
        await settled(pilot)

    assert snap_compare(fleet_of_twelve(), terminal_size=SIZE, run_before=light)


def test_power_without_a_known_limit_shows_the_watts() -> None:
    """dcgm-exporter's default fields have no power limit: the draw is still shown."""
    gpu = {"index": 0, "status": "ok", "metrics": {"power_watts": 612.3}}
    cells = gpu_cells(gpu, [])
    assert str(cells[GPU_COLUMNS.index("Power")]) == "612W"
    with_limit = gpu_cells(
        {**gpu, "metrics": {"power_watts": 350.0, "power_limit_watts": 700.0}}, []
    )
    assert str(with_limit[GPU_COLUMNS.index("Power")]).endswith(" 350/700W")


def test_a_pod_from_dcgm_exporter_has_no_pid_to_show() -> None:
    pod = {"pid": 0, "name": "trainer", "user": "ml-research", "gpu_memory_bytes": None,
           "job": "Kubernetes pod llama-0 of ml-research"}  # fmt: skip
    assert process_cells(pod, "3")[:3] == ("3", "-", "trainer")
    assert process_cells({**pod, "pid": 4242}, "3/gi1")[:2] == ("3/gi1", "4242")


def styles(text: Any) -> set[str]:
    return {str(span.style) for span in text.spans} | ({str(text.style)} if text.style else set())


def test_a_busy_healthy_gpu_is_calm_and_a_fault_is_loud() -> None:
    busy = {"index": 0, "status": "ok", "health": "healthy", "metrics": {
        "utilization_ratio": 0.99, "memory_used_bytes": 79e9, "memory_total_bytes": 80e9,
        "power_watts": 690.0, "power_limit_watts": 700.0, "temperature_celsius": 70.0,
    }}  # fmt: skip
    cells = gpu_cells(busy, [])
    for column in ("Util", "Memory", "Power"):
        assert not styles(cells[GPU_COLUMNS.index(column)]) & {"red", "yellow"}, column
    # XIDs by class: a fatal one red, a warning or an unknown one yellow, an application's plain.
    xids = {"13": 2, "48": 1, "54": 1, "180": 1, "²": 1}
    metrics = {**busy["metrics"], "xid_errors": xids}
    faults = gpu_cells({**busy, "metrics": metrics}, [])[GPU_COLUMNS.index("ECC/XID")]
    assert faults.plain == "XID 13 x2, 48 x1, 54 x1, 180 x1, ² x1"
    colour = {faults.plain[s.start : s.end].split()[0]: str(s.style) for s in faults.spans}
    assert colour == {"48": "bold red", "54": "yellow", "180": "yellow", "²": "yellow"}  # 13 plain


def test_a_temperature_is_coloured_by_the_rules_not_by_a_number_of_the_dashboards() -> None:
    hot = {"index": 0, "uuid": "GPU-a", "status": "ok", "health": "healthy",
           "metrics": {"temperature_celsius": 87.0}}  # fmt: skip
    temp = GPU_COLUMNS.index("Temp")
    assert not styles(gpu_cells(hot, [])[temp])  # 87 °C with no alert: an H100 runs there

    def alert(name: str, severity: str, state: str = "firing", uuid: str = "GPU-a") -> Any:
        labels = {"alertname": name, "severity": severity, "uuid": uuid}
        return {"labels": labels, "state": state}

    high = [alert("GpuTemperatureHigh", "warning")]
    assert styles(gpu_cells(hot, [], high)[temp]) == {"yellow"}
    assert not styles(gpu_cells(hot, [], [alert("GpuTemperatureHigh", "warning", "pending")])[temp])
    assert not styles(gpu_cells(hot, [], [alert("GpuTemperatureHigh", "warning", uuid="b")])[temp])
    assert not styles(gpu_cells(hot, [], [alert("GpuPowerBrake", "critical")])[temp])
    assert styles(gpu_cells(hot, [], [alert("GpuTemperatureAtSlowdown", "critical")])[temp]) == {
        "red"
    }
    slowing = {**hot, "health_causes": [{"key": "thermal-slowdown", "state": "unhealthy"}]}
    assert styles(gpu_cells(slowing, [])[temp]) == {"red"}


def test_alerts_are_listed_critical_first_then_firing_before_pending() -> None:
    def alert(name: str, severity: str, state: str, at: str) -> dict[str, Any]:
        return {"labels": {"alertname": name, "severity": severity}, "state": state, "activeAt": at}

    listed = by_severity([
        alert("GpuXidApplication", "warning", "firing", "2026-11-25T04:00:00Z"),
        alert("GpuUnresponsive", "critical", "pending", "2026-11-25T04:00:01Z"),
        alert("GpuFellOffBus", "critical", "firing", "2026-11-25T04:00:02Z"),
        alert("Custom", "", "firing", "2026-11-25T03:00:00Z"),
    ])  # fmt: skip
    assert [a["labels"]["alertname"] for a in listed] == [
        "GpuFellOffBus",
        "GpuUnresponsive",
        "GpuXidApplication",
        "Custom",
    ]


async def test_ctrl_c_quits_as_in_any_terminal_program() -> None:
    app = GpuwatchApp(FixedFeed({NODE: snapshot(NODE)}), [NODE], refresh=60)
    async with app.run_test(size=SIZE) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert not app.is_running
    assert app.return_code == 0
