"""The fleet's table: one line per node, drawn with Textual's Line API.

DataTable renders each visible cell through rich's layout (~0.2 ms a cell) and, when any cell
changes, all of them again: a live 500-node fleet moves a temperature somewhere on every
refresh, so painting alone took 70 ms of each. Here a row is one Text, and only the rows on
screen are rendered, when they are painted: about 1 ms a screen."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from rich.cells import cell_len
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding, BindingType
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

GAP = 2  # columns between cells
WIDEST = 48  # no column but the last is wider; a longer cell ends in …


class FleetTable(ScrollView, can_focus=True):
    """Keyed rows in the order given; the cursor follows its row when the order changes.
    Enter, or a click on the cursor's row, posts `FleetTable.Selected` with the row's key."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("up,k", "move(-1)", "up", show=False),
        Binding("down,j", "move(1)", "down", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "move(-1_000_000)", show=False),
        Binding("end", "move(1_000_000)", show=False),
        Binding("enter", "select", "open node"),
    ]
    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "fleet-table--header",
        "fleet-table--cursor",
        "fleet-table--even-row",
    }
    # DataTable's look, so the fleet and node views match in both themes.
    DEFAULT_CSS = """
    FleetTable {
        background: $surface;
        color: $foreground;
        overflow-x: hidden;
        & > .fleet-table--header { text-style: bold; background: $panel; color: $foreground; }
        & > .fleet-table--even-row { background: $surface-lighten-1 50%; }
        & > .fleet-table--cursor {
            background: $block-cursor-blurred-background;
            color: $block-cursor-blurred-foreground;
            text-style: $block-cursor-blurred-text-style;
        }
        &:focus {
            background-tint: $foreground 5%;
            & > .fleet-table--cursor {
                background: $block-cursor-background;
                color: $block-cursor-foreground;
                text-style: $block-cursor-text-style;
            }
        }
        &:dark > .fleet-table--even-row { background: $surface-darken-1 40%; }
    }
    """

    class Selected(Message):
        def __init__(self, key: str) -> None:
            super().__init__()
            self.key = key

    def __init__(self, columns: Sequence[str], *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.columns = tuple(columns)
        self._keys: list[str] = []
        self._index: dict[str, int] = {}
        self._rows: dict[str, Sequence[Text | str]] = {}
        self._widths = [cell_len(c) for c in self.columns]
        self.cursor_row = 0

    # What the rest of the dashboard (and its tests) read, named as DataTable names them.
    @property
    def row_count(self) -> int:
        return len(self._keys)

    @property
    def row_keys(self) -> list[str]:
        return list(self._keys)

    @property
    def cursor_key(self) -> str | None:
        return self._keys[self.cursor_row] if self._keys else None

    def get_row(self, key: str) -> Sequence[Text | str]:
        return self._rows[key]

    def get_row_at(self, index: int) -> Sequence[Text | str]:
        return self._rows[self._keys[index]]

    def get_row_index(self, key: str) -> int:
        return self._index[key]

    def set_rows(self, rows: dict[str, Sequence[Text | str]]) -> None:
        """Every row, in order. A str cell is shown as it is (no markup)."""
        keep = self.cursor_key
        self._rows = rows
        self._keys = list(rows)
        self._index = {key: i for i, key in enumerate(self._keys)}
        widths = [cell_len(c) for c in self.columns]
        for cells in rows.values():
            for i, cell in enumerate(cells):
                width = _width(cell)
                widths[i] = max(widths[i], width)
        self._widths = [min(w, WIDEST) for w in widths[:-1]] + widths[-1:]
        if keep in self._index:
            self.cursor_row = self._index[keep]
        self.cursor_row = max(0, min(self.cursor_row, len(self._keys) - 1))
        self.virtual_size = Size(self.size.width, len(self._keys) + 1)  # + the header
        self._follow_cursor()
        self.refresh()

    def move_cursor(self, row: int) -> None:
        self.cursor_row = max(0, min(row, len(self._keys) - 1))
        self._follow_cursor()
        self.refresh()

    def action_move(self, by: int) -> None:
        self.move_cursor(self.cursor_row + by)

    def action_page(self, pages: int) -> None:
        self.move_cursor(self.cursor_row + pages * max(self.size.height - 1, 1))

    def action_select(self) -> None:
        if self.cursor_key is not None:
            self.post_message(self.Selected(self.cursor_key))

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None or offset.y == 0:  # the header
            return
        row = offset.y - 1 + self.scroll_offset.y
        if row < len(self._keys):
            if row == self.cursor_row:
                self.action_select()
            self.move_cursor(row)

    def on_resize(self, event: events.Resize) -> None:
        self._follow_cursor()

    def _follow_cursor(self) -> None:
        shown = max(self.size.height - 1, 1)
        top = self.scroll_offset.y
        if self.cursor_row < top:
            self.scroll_to(y=self.cursor_row, animate=False, immediate=True)
        elif self.cursor_row >= top + shown:
            self.scroll_to(y=self.cursor_row - shown + 1, animate=False, immediate=True)

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        if y == 0:
            cells: Sequence[Text | str] = self.columns
            style = self.get_component_rich_style("fleet-table--header")
        else:
            row = y - 1 + self.scroll_offset.y
            if row >= len(self._keys):
                return Strip.blank(width, self.rich_style)
            cells = self._rows[self._keys[row]]
            style = self.rich_style
            if row == self.cursor_row:
                style += self.get_component_rich_style("fleet-table--cursor")
            elif row % 2:
                style += self.get_component_rich_style("fleet-table--even-row")
        return self._strip(cells, style, width)

    def _strip(self, cells: Sequence[Text | str], style: Style, width: int) -> Strip:
        line = Text(" ", no_wrap=True, end="")
        for cell, column_width in zip(cells, self._widths, strict=False):
            shown, part = _width(cell), cell
            if shown > column_width:
                part = cell.copy() if isinstance(cell, Text) else Text(cell)
                part.truncate(column_width, overflow="ellipsis")
                shown = column_width
            line.append(part)
            line.append(" " * (column_width - shown + GAP))
        segments = list(line.render(self.app.console))
        return Strip(segments).crop_extend(0, width, None).apply_style(style)


def _width(cell: Text | str) -> int:
    return cell.cell_len if isinstance(cell, Text) else cell_len(cell)
