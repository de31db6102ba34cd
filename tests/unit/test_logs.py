"""The daemon's log lines: logfmt or JSON, and a burst of one error cut short."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from gpuwatch import logs


@pytest.fixture(autouse=True)
def root_logger_restored() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:], root.level = handlers, level


def test_a_burst_of_one_error_is_cut_short_and_counted() -> None:
    out = io.StringIO()
    logs.setup("info", "logfmt", out)
    log = logging.getLogger("gpuwatch.test")
    for i in range(10_000):
        log.error("receiver=%s not delivered (attempt %d)", "slack", i)
    log.warning("something else")
    lines = out.getvalue().splitlines()
    assert len(lines) == 6  # five of the burst, then the other message
    assert 'msg="receiver=slack not delivered (attempt 4)"' in lines[4]
    # A minute later the same message gets through again, saying how many were dropped.
    template = "receiver=%s not delivered (attempt %d)"
    record = logging.LogRecord(
        "gpuwatch.test", logging.ERROR, __file__, 1, template, ("slack", 10_000), None
    )
    record.created += 61
    handler = logging.getLogger().handlers[0]
    handler.handle(record)
    last = out.getvalue().splitlines()[-1]
    assert "attempt 10000) [9995 more like this were not logged]" in last


def test_json_lines_carry_level_logger_and_message() -> None:
    out = io.StringIO()
    logs.setup("warning", "json", out)
    logging.getLogger("gpuwatch.test").info("not shown at warning")
    logging.getLogger("gpuwatch.test").warning("GPU %d lost", 3)
    [line] = out.getvalue().splitlines()
    assert json.loads(line) | {"ts": 0} == {
        "ts": 0, "level": "warning", "logger": "gpuwatch.test", "msg": "GPU 3 lost"
    }  # fmt: skip
