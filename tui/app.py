"""`gpuwatch tui`: one node in depth, or a fleet at a glance.

Data comes from the daemons' JSON API through a NodeFeed, polled in workers (never on the UI's
own path); table rows are keyed (GPU index, node URL) and updated in place."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from gpuwatch.tui.data import NodeFeed, NodeSnapshot, keep_last_good
from gpuwatch.tui.fleet_table import FleetTable
from gpuwatch.tui.node_screen import NodeScreen
from gpuwatch.tui.rows import (
    FLEET_COLUMNS,
    fleet_cells,
)
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
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
        self, source: NodeFeed, urls: Sequence[str], refresh: float, detail: NodeFeed | None = None
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
        source: NodeFeed,
        urls: Sequence[str],
        refresh: float = 1.0,
        fleet: bool | None = None,
        detail: NodeFeed | None = None,
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

    def action_help_quit(self) -> None:
        """Ctrl-C quits, as in every other terminal program (Textual's own would only say
        to press ctrl+q): the dashboard has no text to copy with it."""
        self.exit()

    async def on_unmount(self) -> None:
        for source in (self.source, self.detail):
            close = getattr(source, "close", None)
            if close is not None:
                await close()

    def action_cursor(self, direction: str) -> None:
        focused = self.focused
        if isinstance(focused, DataTable):
            (focused.action_cursor_down if direction == "down" else focused.action_cursor_up)()
