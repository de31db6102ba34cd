"""The command line's help, as wide as the terminal."""

from __future__ import annotations

import io
import sys

import pytest

from gpuwatch.clients import parser


def test_help_wraps_at_columns_as_argparse_would(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "50")
    text = parser.build_parser().format_help()
    assert max(len(line) for line in text.splitlines()) <= 48
    monkeypatch.setenv("COLUMNS", "200")
    wide = parser.build_parser().format_help()
    assert max(len(line) for line in wide.splitlines()) > 48


@pytest.mark.parametrize("value", ["", "0", "-3", "wide"])
def test_without_a_usable_columns_a_stream_that_is_no_terminal_is_80_wide(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("COLUMNS", value)
    monkeypatch.setattr(sys, "__stdout__", io.StringIO())  # no file descriptor: no terminal
    assert parser._columns() == 80
