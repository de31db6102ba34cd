"""One node in depth: its GPUs, their processes and MIG instances, its alerts and events; a
selected alert opens in full."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any, ClassVar

import aiohttp
from gpuwatch.tui.data import NodeFeed, NodeSnapshot, keep_last_good
from gpuwatch.tui.rows import (
    ALERT_COLUMNS,
    EVENT_COLUMNS,
    GPU_COLUMNS,
    PROCESS_COLUMNS,
    alert_cells,
    alert_text,
    by_severity,
    event_cells,
    gpu_cells,
    health,
    mig_rows,
    process_cells,
)
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.coordinate import Coordinate
from textual.css.query import NoMatches
from textual.screen import ModalScreen, Screen
from textual.widgets import DataTable, Footer, Static


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


class NodePanel(Vertical):
    """One node: verdict, GPUs, the selected GPU's processes, alerts and recent events."""

    DEFAULT_CSS = """
    NodePanel #header { height: auto; padding: 0 1; }
    NodePanel #gpus { height: auto; max-height: 20; }
    NodePanel #lower { height: 1fr; }
    NodePanel #processes { width: 1fr; }
    NodePanel #alerts { width: 2fr; }
    NodePanel #events { height: 10; }
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
            history = snap.history.get(str(g["index"]), [])
            rows[str(g["index"])] = gpu_cells(g, history, snap.alerts)
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
            found = [
                i for i in selected.get("mig_instances") or [] if str(i.get("gpu_i_id")) == instance
            ]
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
        self, source: NodeFeed, url: str, refresh: float, *, from_fleet: bool = False
    ) -> None:
        super().__init__()
        self.source, self.url, self.refresh_s, self.from_fleet = source, url, refresh, from_fleet

    def compose(self) -> ComposeResult:
        yield NodePanel()
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
            except (aiohttp.ClientError, TimeoutError, asyncio.TimeoutError, OSError):
                pass
            await asyncio.sleep(self.refresh_s * 5)

    @work(exclusive=True, group="node")
    async def poll(self) -> None:
        snap = await self.source.fetch(self.url, detail=True)
        try:
            self.query_one(NodePanel).show(snap)
        except NoMatches:  # the screen closed while the fetch was out: nothing to show it on
            return

    def action_back(self) -> None:
        if self.from_fleet:
            self.app.pop_screen()
