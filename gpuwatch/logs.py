"""Logging to stderr for journald: one line per record, logfmt or JSON, and a burst of the
same message cut short rather than repeated thousands of times."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import TextIO


def _logfmt_value(value: str) -> str:
    if value and all(c not in value for c in ' ="\n'):
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class LogfmtFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line = (
            f"ts={stamp}.{int(record.msecs):03d}Z level={record.levelname.lower()} "
            f"logger={record.name} msg={_logfmt_value(record.getMessage())}"
        )
        if record.exc_info:
            line += " exc=" + _logfmt_value(self.formatException(record.exc_info))
        return line


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out)


class BurstFilter(logging.Filter):
    """Lets `burst` records of one message (logger, level and format string, whatever the
    arguments) through per `window` seconds and drops the rest; the first one through after
    a window in which some were dropped says how many."""

    def __init__(self, burst: int = 5, window: float = 60.0) -> None:
        super().__init__()
        self.burst, self.window = burst, window
        # key -> (window start, records seen in it, dropped since the last one let through)
        self._seen: dict[tuple[str, int, str], tuple[float, int, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.name, record.levelno, str(record.msg))
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
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
