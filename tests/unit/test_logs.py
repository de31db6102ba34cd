"""The daemon's log lines: logfmt or JSON, and a burst of one error cut short."""

from __future__ import annotations

import io
import json
import logging
import re
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
        "ts": 0,
        "level": "warning",
        "logger": "gpuwatch.test",
        "msg": "GPU 3 lost",
    }


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_fields_are_fields_and_the_time_is_rfc3339_in_both_formats(fmt: str) -> None:
    out = io.StringIO()
    logs.setup("info", fmt, out)
    log = logging.getLogger("gpuwatch.test")
    uuid = "GPU-6fb9b3e4-0d69-c199-0146-994876534f1d"
    log.warning("XID %d: %s", 79, "fallen off the bus", extra=logs.fields(gpu=3, uuid=uuid, xid=79))
    [line] = out.getvalue().splitlines()
    if fmt == "json":
        record = json.loads(line)
        assert (record["gpu"], record["uuid"], record["xid"]) == ("3", uuid, "79")
        assert record["msg"] == "XID 79: fallen off the bus"
        stamp = record["ts"]
    else:
        assert line.endswith(f'msg="XID 79: fallen off the bus" gpu=3 uuid={uuid} xid=79')
        stamp = line.split()[0].removeprefix("ts=")
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", stamp)


def test_a_storm_on_one_gpu_does_not_hide_the_first_line_of_another() -> None:
    out = io.StringIO()
    logs.setup("info", "logfmt", out)
    log = logging.getLogger("gpuwatch.test")
    for _ in range(100):
        log.error("sampling failed", extra=logs.fields(gpu=1))
    log.error("sampling failed", extra=logs.fields(gpu=2))
    lines = out.getvalue().splitlines()
    assert len(lines) == 6 and lines[-1].endswith("gpu=2")


@pytest.mark.parametrize("fmt", ["logfmt", "json"])
def test_text_from_outside_cannot_forge_or_hide_a_line(fmt: str) -> None:
    out = io.StringIO()
    logs.setup("info", fmt, out)
    hostile = 'a\rts=x level=error msg="forged"\tb\u2028c\x85d\x1b[2Je\x00f\U000e0041z'
    log = logging.getLogger("gpuwatch.test")
    log.warning("process %s", hostile, extra=logs.fields(label=hostile, gpu="0"))
    text = out.getvalue()
    assert text.endswith("\n")
    [line] = text[:-1].splitlines()  # splitlines() breaks at CR, U+2028, U+0085 and more
    assert line.isprintable() and line.isascii() if fmt == "json" else line.isprintable()
    decoded = json.loads(line)["label"] if fmt == "json" else None
    assert decoded in (None, hostile)  # nothing lost: JSON gives the text back whole
    if fmt == "logfmt":
        # The forged "level=error" stays inside the quoted value, escaped.
        escaped = r'msg="process a\rts=x level=error msg=\"forged\"\tb\u2028c\u0085d\u001b'
        assert escaped in line
        assert line.endswith(r'\U000e0041z" gpu=0')  # not \ue0041z, which reads as U+E004 "1z"
