"""Parsing of the durations, addresses and numbers users write in config, scenario files and
labels."""

from __future__ import annotations

import math
import re

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w|y)")
_UNIT_SECONDS = {
    "ms": 0.001,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 604800.0,
    "y": 31536000.0,
}


def parse_duration(value: object) -> float:
    """'1s', '500ms', '1h30m' or a plain number of seconds -> seconds. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"expected a duration such as 1s, 500ms or 5m, got {value!r}")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError(f"a duration cannot be negative, got {value!r}")
        return _bounded(float(value), value)
    if isinstance(value, str):
        text = value.strip()
        if text == "0":
            return 0.0  # the one duration without a unit, as in Prometheus
        pos, total = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            total += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos == len(text) and text:
            return _bounded(total, value)
    raise ValueError(f"expected a duration such as 1s, 500ms or 5m, got {value!r}")


MAX_DURATION_S = 1000 * 31536000.0  # a thousand years: past it, a typo or an attack


def _bounded(seconds: float, value: object) -> float:
    if not math.isfinite(seconds) or seconds > MAX_DURATION_S:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:37] + "..."
        raise ValueError(f"a duration must be under 1000y, got {shown}")
    return seconds


def ascii_int(text: str) -> int | None:
    """Plain ASCII decimal digits (a label such as gpu="3" or xid="79", a port, an environment
    variable) as an int; None for anything else.

    str.isdigit() alone is not enough: "²" and "٣" are digits to it but not to int(), and a
    value a user pushed must never raise where an alert is rendered or journaled."""
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    return None


def format_duration(seconds: float) -> str:
    if seconds and seconds < 1:
        return f"{round(seconds * 1000)}ms"
    out, rest = "", round(seconds)
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if rest >= size:
            out += f"{rest // size}{unit}"
            rest %= size
    return out or "0s"


def parse_listen(value: str) -> tuple[str, int]:
    """'HOST:PORT' or '[v6]:PORT' -> (host, port). Raises ValueError."""
    host, sep, port_text = value.rpartition(":")
    if not sep or ascii_int(port_text) is None:
        raise ValueError(f"expected HOST:PORT such as 0.0.0.0:10040, got {value!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ValueError(f"port must be 0-65535, got {port}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise ValueError(f"expected HOST:PORT with a host, got {value!r}")
    return host, port
