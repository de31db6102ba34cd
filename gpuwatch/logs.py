"""Logging to stderr for journald: one line per record, logfmt or JSON, and a burst of the
same message cut short rather than repeated thousands of times."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any, TextIO


def fields(**values: object) -> dict[str, Any]:
    """A record's own fields (gpu, uuid, xid, receiver), for `extra=`: written as key=value in
    logfmt and as keys in JSON, so that a log tool filters on them instead of on the text.

        log.warning("XID %d: %s", code, meaning, extra=fields(gpu=1, uuid=uuid, xid=code))
    """
    return {"fields": {k: v for k, v in values.items() if v is not None}}


RECORD_KEYS = frozenset({"ts", "level", "logger", "msg", "exc"})  # no field may take these


def _fields_of(record: logging.LogRecord) -> dict[str, object]:
    found = getattr(record, "fields", None)
    return found if isinstance(found, dict) else {}


def _timestamp(record: logging.LogRecord) -> str:
    """RFC 3339 in UTC with milliseconds, the same in both formats."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
    return f"{stamp}.{int(record.msecs):03d}Z"


_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(c: str) -> str:
    if c in _ESCAPES or c.isprintable():
        return _ESCAPES.get(c, c)
    code = ord(c)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def logfmt_value(value: str) -> str:
    """A value as logfmt writes it: bare when it can be, else quoted with every control
    character escaped. A label or a process name is text someone else chose; a raw CR, a
    U+2028 or an escape sequence in it would forge or hide a line in the journal."""
    if value and value.isprintable() and all(c not in value for c in ' ="'):
        return value
    return '"' + "".join(map(_escaped, value)) + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line = (
            f"ts={_timestamp(record)} level={record.levelname.lower()} "
            f"logger={record.name} msg={logfmt_value(record.getMessage())}"
        )
        for key, value in _fields_of(record).items():
            line += f" {key}={logfmt_value(str(value))}"
        if record.exc_info:
            line += " exc=" + logfmt_value(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": _timestamp(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        # Strings, as labels are: `.gpu == "3"` finds a GPU's lines whether a sampler (an int)
        # or an alert (a label) wrote them.
        for key, value in _fields_of(record).items():
            out.setdefault(key, str(value))
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class BurstFilter(logging.Filter):
    """Lets `burst` records of one message (logger, level, format string and fields, whatever
    the arguments) through per `window` seconds and drops the rest; the first one through after
    a window in which some were dropped says how many."""

    def __init__(self, burst: int = 5, window: float = 60.0) -> None:
        super().__init__()
        self.burst, self.window = burst, window
        # key -> (window start, records seen in it, dropped since the last one let through)
        self._seen: dict[tuple[object, ...], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        # One GPU's or receiver's storm must not hide another's first line: its fields count.
        identity = tuple(sorted((k, str(v)) for k, v in _fields_of(record).items()))
        key = (record.name, record.levelno, str(record.msg), identity)
        start, count, dropped = self._seen.get(key, (record.created, 0, 0))
        if record.created - start >= self.window:
            start, count = record.created, 0
        count += 1
        if count > self.burst:
            self._seen[key] = (start, count, dropped + 1)
            return False
        if dropped:
            record.msg = f"{record.msg} [{dropped} more like this were not logged]"
        self._seen[key] = (start, count, 0)
        if len(self._seen) > 10_000:  # messages are templates: this only grows on a bug
            self._seen.clear()
        return True


def setup(level: str, fmt: str, stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else LogfmtFormatter())
    handler.addFilter(BurstFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
