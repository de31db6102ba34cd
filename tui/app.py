"""`gpuwatch tui`: one node in depth, or a fleet at a glance.

Data comes from the daemons' JSON API through a Source, polled in workers (never on the UI's
own path); table rows are keyed (GPU index, node URL) and updated in place."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

import aiohttp
from gpuwatch.tui.data import NodeSnapshot, Source, keep_last_good
from gpuwatch.tui.fleet_table import FleetTable
from gpuwatch.tui.rows import (
    ALERT_COLUMNS,
    EVENT_COLUMNS,
    FLEET_COLUMNS,
    GPU_COLUMNS,
    PROCESS_COLUMNS,
    alert_cells,
    alert_text,
    by_severity,
    event_cells,
    fleet_cells,
    gpu_cells,
    health,
    mig_rows,
    process_cells,
)
from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.coordinate import Coordinate
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Input, Static

HELP = """\
[b]gpuwatch tui[/b]

  q          quit                    ?        this help
  ↑ ↓ j k    move                    Tab      next pane
  Enter      open the node (fleet),  Escape   back to the fleet
             an alert in full (node)
  /          filter nodes (fleet)    s        change the sort (fleet)

Data refreshes every second; a node that does not answer is marked
UNREACHABLE and keeps its last good data, dimmed.
"""


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,question_mark", "dismiss", "close")]

    def compose(self) -> ComposeResult:
        yield Static(HELP, id="help")


class AlertScreen(ModalScreen[None]):
    """One alert in full."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape,q,enter", "dismiss", "close")]
    DEFAULT_CSS = """
    AlertScreen { align: center middle; }
    AlertScreen #alert { width: 90%; height: auto; max-height: 90%; padding: 1 2;
                         border: round $accent; background: $surface; }
    """

    def __init__(self, text: Text) -> None:
        super().__init__()
        self.text = text

    def compose(self) -> ComposeResult:
        yield Static(self.text, id="alert")


def _alert_key(alert: dict[str, Any], index: int) -> str:
    return f"{alert['labels'].get('alertname')}/{alert['labels'].get('gpu', '')}/{index}"


def _table(id_: str, columns: Sequence[str]) -> DataTable[Any]:
    table: DataTable[Any] = DataTable(id=id_, cursor_type="row", zebra_stripes=True)
    for column in columns:
        table.add_column(column, key=column)
    return table


def _keyed_update(table: DataTable[Any], rows: dict[str, tuple[Any, ...]]) -> None:
    """Rows keyed and updated in place, in the order of `rows`: the cursor and scroll stay
    where the user left them. A new row that belongs above others (a MIG instance created on
    a GPU above the last one) rebuilds the table, the cursor kept on its row."""
    keys = [str(c.key.value) for c in table.columns.values()]
    shown = [str(k.value) for k in table.rows]  # in the order they are shown
    present = set(shown)
    kept = [k for k in rows if k in present]
    cursor: str | None = None
    if kept != [k for k in shown if k in rows] or kept != list(rows)[: len(kept)]:
        if table.row_count:
            at = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0))
            cursor = str(at.row_key.value)
        table.clear()
        present = set()
    else:
        for key in present - rows.keys():
            table.remove_row(key)
    for key, row in rows.items():
        cells = [c if isinstance(c, Text) else Text(c) for c in row]  # a str would be markup
        if key in present:
            for column, cell in zip(keys, cells, strict=True):
                if table.get_cell(key, column) != cell:
                    table.update_cell(key, column, cell, update_width=True)
        else:
            table.add_row(*cells, key=key)
    if cursor is not None and cursor in rows:
        table.move_cursor(row=table.get_row_index(cursor), animate=False)


class NodeView(Vertical):
    """One node: verdict, GPUs, the selected GPU's processes, alerts and recent events."""

    DEFAULT_CSS = """
    NodeView #header { height: auto; padding: 0 1; }
    NodeView #gpus { height: auto; max-height: 20; }
    NodeView #lower { height: 1fr; }
    NodeView #processes { width: 1fr; }
    NodeView #alerts { width: 2fr; }
    NodeView #events { height: 10; }
    """

    def __init__(self) -> None:
        super().__init__()
        self.snapshot: NodeSnapshot | None = None

    def compose(self) -> ComposeResult:
        yield Static("connecting…", id="header")
        gpus = _table("gpus", GPU_COLUMNS)
        yield gpus
        with Horizontal(id="lower"):
            yield _table("processes", PROCESS_COLUMNS)
            yield _table("alerts", ALERT_COLUMNS)
        yield _table("events", EVENT_COLUMNS)

    def show(self, snap: NodeSnapshot) -> None:
        snap = keep_last_good(self.snapshot, snap)
        self.snapshot = snap
        node = snap.node
        header = Text()
        header.append(snap.name, style="bold")
        header.append(f"  {snap.url}", style="dim")  # which daemon: a second demo's port
        if snap.error:
            header.append("  UNREACHABLE: ", style="bold white on red")
            header.append(snap.error, style="red")
        backend = node.get("backend", {})
        gpus = node.get("gpus", [])
        header.append(f"   driver {backend.get('driver_version') or '?'}   {len(gpus)} GPUs   ")
        header.append_text(health(str(node.get("verdict", "unknown"))))
        for reason in node.get("reasons", [])[:4]:
            header.append(f"\n  - {reason}", style="dim" if snap.error else "")
        self.query_one("#header", Static).update(header)
        table = self.query_one("#gpus", DataTable)
        rows: dict[str, tuple[Text | str, ...]] = {}
        for g in gpus:
            rows[str(g["index"])] = gpu_cells(g, snap.history.get(str(g["index"]), []))
            rows.update(mig_rows(g))
        _keyed_update(table, rows)
        self._show_processes()
        _keyed_update(
            self.query_one("#alerts", DataTable),
            {_alert_key(a, i): alert_cells(a) for i, a in enumerate(by_severity(snap.alerts))},
        )
        _keyed_update(
            self.query_one("#events", DataTable),
            {f"{e['time']}/{i}": event_cells(e) for i, e in enumerate(reversed(snap.events[-50:]))},
        )

    def _show_processes(self) -> None:
        """The processes of the GPU under the cursor; on a MIG instance's row, the
        instance's."""
        if self.snapshot is None:
            return
        gpus = self.snapshot.node.get("gpus", [])
        table = self.query_one("#gpus", DataTable)
        key, instance = "", ""
        if gpus and table.row_count:
            cell = table.coordinate_to_cell_key(Coordinate(table.cursor_row, 0))
            key, _, instance = str(cell.row_key.value).partition("/gi")
        selected: dict[str, Any] = next((g for g in gpus if str(g["index"]) == key), {})
        processes = selected.get("processes", [])
        if instance:
            found = [i for i in selected.get("mig_instances") or []
                     if str(i.get("gpu_i_id")) == instance]  # fmt: skip
            pids = set(found[0].get("pids") or []) if found else set()
            processes = [p for p in processes if p["pid"] in pids]
        _keyed_update(
            self.query_one("#processes", DataTable),
            {
                str(p["pid"]): process_cells(p, f"{key}/{instance}" if instance else key)
                for p in processes
            },
        )

    def on_data_table_row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.data_table.id == "gpus":
            self._show_processes()

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        """Enter on an alert: the whole of it, which the table's Action column cuts short."""
        if event.data_table.id != "alerts" or self.snapshot is None:
            return
        key = str(event.row_key.value)
        for i, alert in enumerate(by_severity(self.snapshot.alerts)):
            if _alert_key(alert, i) == key:
                self.app.push_screen(AlertScreen(alert_text(alert)))
                return


class NodeScreen(Screen[None]):
    AUTO_FOCUS = "#gpus"
    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "back", "fleet", show=False)]

    def __init__(
        self, source: Source, url: str, refresh: float, *, from_fleet: bool = False
    ) -> None:
        super().__init__()
        self.source, self.url, self.refresh_s, self.from_fleet = source, url, refresh, from_fleet

    def compose(self) -> ComposeResult:
        yield NodeView()
        yield Footer()

    def on_mount(self) -> None:
        self.poll()
        self.set_interval(self.refresh_s, self.poll)
        if hasattr(self.source, "watch"):
            self.follow()

    @work(group="stream")
    async def follow(self) -> None:
        """Refresh at once when the daemon reports an event (an XID, a lost GPU, an alert),
        not at the next poll; reconnect after a pause when the stream breaks."""
        while True:
            try:
                async for kind in self.source.watch(self.url):  # type: ignore[attr-defined]
                    if kind != "cycle":
                        self.poll()
            except (aiohttp.ClientError, TimeoutError, OSError):
                pass
            await asyncio.sleep(self.refresh_s * 5)

    @work(exclusive=True, group="node")
    async def poll(self) -> None:
        snap = await self.source.fetch(self.url, detail=True)
        self.query_one(NodeView).show(snap)

    def action_back(self) -> None:
        if self.from_fleet:
            self.app.pop_screen()


SORTS = ("verdict", "node", "hottest", "busiest")
_SEVERITY = {"unhealthy": 0, "degraded": 1, "unknown": 2, "healthy": 3}


class FleetScreen(Screen[None]):
    AUTO_FOCUS = "#fleet"  # not the filter box, which shows only after `/`
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("slash", "filter", "filter"),
        Binding("s", "sort", "sort"),
        Binding("escape", "clear_filter", "clear filter", show=False),
    ]
    DEFAULT_CSS = """
    FleetScreen #summary { height: 1; padding: 0 1; }
    FleetScreen #fleet { height: 1fr; }
    FleetScreen #filter { display: none; }
    FleetScreen #filter.shown { display: block; }
    """

    def __init__(
        self, source: Source, urls: Sequence[str], refresh: float, detail: Source | None = None
    ) -> None:
        super().__init__()
        self.source, self.urls, self.refresh_s = source, list(urls), refresh
        self.detail = detail or source  # where the node view gets its data
        self.snapshots: dict[str, NodeSnapshot] = {}
        self.sort = SORTS[0]
        self.filter = ""

    def compose(self) -> ComposeResult:
        yield Static("", id="summary")
        yield Input(placeholder="filter: part of a node name, verdict or alert", id="filter")
        yield FleetTable(FLEET_COLUMNS, id="fleet")
        yield Footer()

    def on_mount(self) -> None:
        self.poll()
        self.set_interval(self.refresh_s, self.poll)

    @work(exclusive=True, group="fleet")
    async def poll(self) -> None:
        fetched = await self.source.fetch_fleet(self.urls)
        for got in fetched:
            self.snapshots[got.url] = keep_last_good(self.snapshots.get(got.url), got)
        self.render_rows()

    def render_rows(self) -> None:
        snaps = list(self.snapshots.values())
        if self.filter:
            needle = self.filter.lower()
            snaps = [
                s
                for s in snaps
                if needle
                in " ".join(
                    [
                        s.url,
                        s.name,
                        str(s.node.get("verdict", "")),
                        *(a["labels"].get("alertname", "") for a in s.alerts),
                    ]
                ).lower()
            ]
        snaps.sort(key=self._sort_key)
        self.query_one(FleetTable).set_rows(
            {s.url: fleet_cells(s.node or {"node": s.url}, s.alerts, s.error) for s in snaps}
        )
        bad = sum(
            1 for s in self.snapshots.values() if s.node.get("verdict") != "healthy" or s.error
        )
        down = sum(1 for s in self.snapshots.values() if s.error)
        self.query_one("#summary", Static).update(
            f"{len(self.snapshots)} nodes, {bad} not healthy, {down} unreachable   "
            f"sort: {self.sort}" + (f"   filter: {self.filter}" if self.filter else "")
        )

    def _sort_key(self, s: NodeSnapshot) -> tuple[Any, ...]:
        gpus = s.node.get("gpus", [])

        def top(key: str) -> float:
            values = [g.get("metrics", {}).get(key) for g in gpus]
            return -max((v for v in values if isinstance(v, int | float)), default=0.0)

        if self.sort == "node":
            return (s.name,)
        if self.sort == "hottest":
            return (top("temperature_celsius"), s.name)
        if self.sort == "busiest":
            return (top("utilization_ratio"), s.name)
        return (0 if s.error else 1, _SEVERITY.get(str(s.node.get("verdict")), 2), s.name)

    def action_sort(self) -> None:
        self.sort = SORTS[(SORTS.index(self.sort) + 1) % len(SORTS)]
        self.render_rows()

    def action_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.add_class("shown")
        box.focus()

    def action_clear_filter(self) -> None:
        box = self.query_one("#filter", Input)
        box.value, self.filter = "", ""
        box.remove_class("shown")
        self.query_one(FleetTable).focus()
        self.render_rows()

    def on_input_changed(self, event: Input.Changed) -> None:
        self.filter = event.value
        self.render_rows()

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.query_one(FleetTable).focus()

    def on_fleet_table_selected(self, event: FleetTable.Selected) -> None:
        """The node in depth, from the node's own daemon (also when the fleet is Prometheus's)."""
        self.app.push_screen(NodeScreen(self.detail, event.key, self.refresh_s, from_fleet=True))


class GpuwatchApp(App[None]):
    TITLE = "gpuwatch"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("q", "quit", "quit"),
        Binding("question_mark", "help", "help"),
        Binding("j", "cursor('down')", "down", show=False),
        Binding("k", "cursor('up')", "up", show=False),
        Binding("tab", "focus_next", "next pane", show=False),
    ]

    def __init__(
        self,
        source: Source,
        urls: Sequence[str],
        refresh: float = 1.0,
        fleet: bool | None = None,
        detail: Source | None = None,
    ) -> None:
        super().__init__()
        self.source, self.urls, self.refresh_s = source, list(urls), refresh
        self.fleet = len(self.urls) > 1 if fleet is None else fleet  # one URL: the node view
        self.detail = detail  # the node view's source when the fleet's is not a daemon

    def on_mount(self) -> None:
        if not self.fleet:
            self.push_screen(NodeScreen(self.source, self.urls[0], self.refresh_s))
        else:
            self.push_screen(FleetScreen(self.source, self.urls, self.refresh_s, self.detail))

    def action_help(self) -> None:
        self.push_screen(HelpScreen())

    async def on_unmount(self) -> None:
        for source in (self.source, self.detail):
            close = getattr(source, "close", None)
            if close is not None:
                await close()

    def action_cursor(self, direction: str) -> None:
        focused = self.focused
        if isinstance(focused, DataTable):
            (focused.action_cursor_down if direction == "down" else focused.action_cursor_up)()
