"""The functions PromQL applies to each sample's value (abs, ceil, the logarithms, the trig
functions, round, clamp) and the date functions, with Go's math where Python's differs."""

from __future__ import annotations

import calendar
import math
from collections.abc import Callable
from datetime import datetime, timezone


def round_to(v: float, to_nearest: float) -> float:
    inverse = 1.0 / to_nearest
    return math.floor(v * inverse + 0.5) / inverse


def _sgn(v: float) -> float:
    if math.isnan(v):
        return v
    return 0.0 if v == 0 else math.copysign(1.0, v)


def _safe(fn: Callable[[float], float]) -> Callable[[float], float]:
    def apply(v: float) -> float:
        try:
            return fn(v)
        except (ValueError, OverflowError):
            if fn is math.exp:
                return math.inf
            if v == 0:
                return -math.inf
            return math.nan

    return apply


def _ceil(v: float) -> float:
    return v if math.isinf(v) or math.isnan(v) else float(math.ceil(v))


def _floor(v: float) -> float:
    return v if math.isinf(v) or math.isnan(v) else float(math.floor(v))


def _nan_outside(fn: Callable[[float], float]) -> Callable[[float], float]:
    """fn, NaN outside its domain (asin(2), acosh(0), sin(Inf)), as Go's math answers."""

    def apply(v: float) -> float:
        try:
            return fn(v)
        except ValueError:
            return math.nan

    return apply


def _overflowing(fn: Callable[[float], float]) -> Callable[[float], float]:
    """sinh and cosh: Go's ±Inf where Python raises on overflow."""

    def apply(v: float) -> float:
        try:
            return fn(v)
        except OverflowError:
            return math.copysign(math.inf, v) if fn is math.sinh else math.inf

    return apply


def _atanh(v: float) -> float:
    if abs(v) == 1:
        return math.copysign(math.inf, v)
    return math.atanh(v) if abs(v) < 1 else math.nan


ELEMENTWISE: dict[str, Callable[[float], float]] = {
    "abs": abs,
    "ceil": _ceil,
    "floor": _floor,
    "sqrt": _safe(math.sqrt),
    "exp": _safe(math.exp),
    "ln": _safe(math.log),
    "log2": _safe(math.log2),
    "log10": _safe(math.log10),
    "sgn": _sgn,
    "sin": _nan_outside(math.sin),
    "cos": _nan_outside(math.cos),
    "tan": _nan_outside(math.tan),
    "asin": _nan_outside(math.asin),
    "acos": _nan_outside(math.acos),
    "atan": math.atan,
    "sinh": _overflowing(math.sinh),
    "cosh": _overflowing(math.cosh),
    "tanh": math.tanh,
    "asinh": math.asinh,
    "acosh": _nan_outside(math.acosh),
    "atanh": _atanh,
    # In Prometheus's order of operations, so results match to the last bit.
    "deg": lambda v: v * 180 / math.pi,
    "rad": lambda v: v * math.pi / 180,
}


def _days_in_month(d: datetime) -> float:
    return float(calendar.monthrange(d.year, d.month)[1])


# The date functions: each sample's value read as seconds since the epoch, in UTC.
DATE_PARTS: dict[str, Callable[[datetime], float]] = {
    "minute": lambda d: float(d.minute),
    "hour": lambda d: float(d.hour),
    "day_of_week": lambda d: float(d.isoweekday() % 7),  # Sunday is 0
    "day_of_month": lambda d: float(d.day),
    "day_of_year": lambda d: float(d.timetuple().tm_yday),
    "days_in_month": _days_in_month,
    "month": lambda d: float(d.month),
    "year": lambda d: float(d.year),
}


def date_part(part: Callable[[datetime], float], v: float) -> float:
    if not math.isfinite(v):
        return math.nan
    try:  # whole seconds, truncated as Go's int64 conversion does
        return part(datetime.fromtimestamp(int(v), tz=timezone.utc))
    except (OverflowError, ValueError, OSError):  # beyond the years datetime holds
        return math.nan


def clamp(v: float, low: float, high: float) -> float:
    if math.isnan(v):
        return v
    return max(low, min(high, v))
