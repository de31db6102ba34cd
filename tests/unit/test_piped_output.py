"""Tables piped into a file or grep keep each row on one line: an XID's action, or the
node's reason, is found whole by `grep`, not cut at column 80."""

from __future__ import annotations

import pytest

from gpuwatch.cli import main
from gpuwatch.xid.catalog import CATALOG


def test_a_piped_table_keeps_each_row_on_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    assert main(["xid"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  79 ")]
    assert len(rows) == 1
    assert CATALOG[79].meaning in rows[0] and CATALOG[79].action in rows[0]
    assert len(rows[0].rstrip()) > 80  # which an 80-column table would have wrapped
