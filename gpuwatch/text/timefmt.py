"""Times as the API writes and reads them: RFC 3339 with fractional seconds, in UTC."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuwatch.text.units import parse_duration


def rfc3339(t: float | None) -> str | None:
    if t is None:
        return None
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


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
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"expected a duration (1h), an RFC 3339 time or Unix seconds, got {text!r}"
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()
