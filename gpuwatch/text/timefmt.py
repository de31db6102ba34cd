"""Times as the API writes and reads them: RFC 3339 with fractional seconds, in UTC."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

from gpuwatch.text.units import parse_duration


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    moment = datetime.fromtimestamp(t, timezone.utc)
    return moment.isoformat(timespec="microseconds").replace("+00:00", "Z")


def utc_second(t: float) -> str:
    """A time as a person reads it in a table: `2026-11-29 09:38:05`, in UTC."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))


def parse_since(text: str, now: float) -> float:
    """`1h` (that long ago), an RFC 3339 time, or Unix seconds. Raises ValueError."""
    text = text.strip()
    try:
        return float(text)  # a bare number is a Unix time, as in Prometheus's API
    except ValueError:
        pass
    try:
        return now - parse_duration(text)
    except ValueError:
        pass
    try:
        return parse_rfc3339(text)
    except ValueError:
        raise ValueError(
            f"expected a duration (1h), an RFC 3339 time or Unix seconds, got {text!r}"
        ) from None


# Go writes nanoseconds (Alertmanager's endsAt); Python 3.10 reads 3 or 6 digits only.
_FRACTION = re.compile(r"(\.\d+)(?=[zZ]|[+-]\d\d:\d\d$|$)")


def parse_rfc3339(text: str) -> float:
    """An RFC 3339 time (`Z` or an offset; none: UTC), any number of fractional digits, as
    Unix seconds. Raises ValueError."""
    text = text.strip()
    text = _FRACTION.sub(lambda m: m.group(1)[:7].ljust(7, "0"), text, count=1)
    moment = datetime.fromisoformat(re.sub(r"[zZ]$", "+00:00", text))
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()
