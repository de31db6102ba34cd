"""Prometheus's number-printing template functions (humanize and its kin, toTime,
toDuration) and the conversions they share, with Go's integer arithmetic where it shows."""

from __future__ import annotations

import math
import re

from gpuwatch.rules.template.constants import go_quote
from gpuwatch.rules.template.signature import FuncError
from gpuwatch.rules.template.values import GoDuration, GoHTML, GoTime, sprint_one, type_name
from gpuwatch.text.gofmt import format_g4


def to_float(value: object) -> float:
    """Prometheus's ConvertToFloat: a number, or a string Go's ParseFloat reads."""
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, GoDuration):
        return value.nanos / 1e9
    if isinstance(value, str) and not isinstance(value, GoHTML):
        return parse_go_float(value)
    raise FuncError(f"can't convert {type_name(value)} to float")


_GO_FLOAT = re.compile(
    r"[+-]?(?:(?:\d(?:_?\d)*)?\.?\d(?:_?\d)*(?:[eE][+-]?\d+)?|\d+\.|inf|infinity|nan"
    r"|0[xX][0-9a-fA-F_.]+[pP][+-]?\d+)",
    re.IGNORECASE,
)


def parse_go_float(text: str) -> float:
    if not _GO_FLOAT.fullmatch(text) or ("_" in text and not text.lstrip("+-")[:2].lower() == "0x"):
        raise FuncError(f"strconv.ParseFloat: parsing {go_quote(text)}: invalid syntax")
    cleaned = text.replace("_", "")
    value = float.fromhex(cleaned) if "x" in cleaned.lower() else float(cleaned)
    if math.isinf(value) and "inf" not in text.lower():
        raise FuncError(f"strconv.ParseFloat: parsing {go_quote(text)}: value out of range")
    return value


def humanize(v: float) -> str:
    if v == 0 or math.isnan(v) or math.isinf(v):
        return format_g4(v)
    prefix = ""
    if abs(v) >= 1:
        for p in ("k", "M", "G", "T", "P", "E", "Z", "Y"):
            if abs(v) < 1000:
                break
            prefix, v = p, v / 1000
        return format_g4(v) + prefix
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return format_g4(v) + prefix


def humanize_1024(v: float) -> str:
    if abs(v) <= 1 or math.isnan(v) or math.isinf(v):
        return format_g4(v)
    prefix = ""
    for p in ("ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi", "Yi"):
        if abs(v) < 1024:
            break
        prefix, v = p, v / 1024
    return format_g4(v) + prefix


def _go_int64(v: float) -> int:
    """Go's int64(v) on amd64: truncation, and the most negative int64 out of range."""
    return int(v) if -(2.0**63) <= v < 2.0**63 else -(2**63)


def _quo(a: int, b: int) -> int:
    """Go's integer division, towards zero."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def _rem(a: int, b: int) -> int:
    """Go's %, with the sign of the dividend."""
    return a - _quo(a, b) * b


def humanize_duration(v: float) -> str:
    if math.isnan(v) or math.isinf(v):
        return format_g4(v)
    if v == 0:
        return format_g4(v) + "s"
    if abs(v) >= 1:
        sign = "-" if v < 0 else ""
        v = abs(v)
        whole = _go_int64(v)
        seconds, minutes = _rem(whole, 60), _rem(_quo(whole, 60), 60)
        hours, days = _rem(_quo(whole, 3600), 24), _quo(whole, 86400)
        if days:
            return f"{sign}{days}d {hours}h {minutes}m {seconds}s"
        if hours:
            return f"{sign}{hours}h {minutes}m {seconds}s"
        if minutes:
            return f"{sign}{minutes}m {seconds}s"
        return f"{sign}{format_g4(v)}s"
    prefix = ""
    for p in ("m", "u", "n", "p", "f", "a", "z", "y"):
        if abs(v) >= 1:
            break
        prefix, v = p, v * 1000
    return f"{format_g4(v)}{prefix}s"


def to_time(v: float) -> GoTime:
    if math.isnan(v) or math.isinf(v):
        raise FuncError("value is NaN or Inf")
    nanos = v * 1e9
    if not -(2.0**63) <= nanos <= 2.0**63:
        raise FuncError(
            f"{sprint_one(v)} cannot be represented as a nanoseconds timestamp since it "
            "overflows int64"
        )
    millis = abs(int(nanos)) // 1_000_000  # Prometheus goes through its millisecond time
    return GoTime(millis * 1_000_000 * (-1 if nanos < 0 else 1))


def humanize_timestamp(value: object) -> str:
    v = to_float(value)
    if math.isnan(v) or math.isinf(v):
        return format_g4(v)
    return str(to_time(v))


def to_duration(value: object) -> GoDuration:
    v = to_float(value) * 1e9
    if math.isnan(v):
        return GoDuration(-(2**63))  # Go's conversion of NaN to int64 on amd64
    return GoDuration(int(max(min(v, 2.0**63 - 1), -(2.0**63))))


def percentage(value: object) -> str:
    """humanizePercentage: the value times 100, four significant digits and a %."""
    return format_g4(to_float(value) * 100) + "%"
