"""Where the client commands print their tables: the terminal's width on a terminal; piped
into a file, grep or a ticket, one line per row however long (Rich's default 80 columns
would cut a reason or an action in the middle of a word onto the next line)."""

from __future__ import annotations

import os
import sys

from rich.console import Console

PIPED_WIDTH = 1000


def stdout_console() -> Console:
    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=PIPED_WIDTH)
