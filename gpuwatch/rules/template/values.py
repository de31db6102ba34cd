"""The Go values a rule template handles, and how Go's fmt prints them.

Python stands in for Go's types: str for string, float for float64, int for int, bool, None
for nil, dict for maps. The few named types Prometheus's functions return get classes, because
Go prints them (and names them in errors) differently from their underlying type."""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping
from dataclasses import dataclass

from gpuwatch.text.gofmt import format_v


class GoHTML(str):
    """html/template.HTML, what safeHtml returns: a string to print, not to pass as one."""

    __slots__ = ()


class ArgsMap(dict[str, object]):
    """map[string]interface{}, what args returns: a missing key is nil, not ""."""


@dataclass(slots=True)
class QuerySample:
    """One element of what `query` returns: Prometheus's *template.sample."""

    Labels: dict[str, str]  # the field names templates write
    Value: float


class QueryResult(list[QuerySample]):
    """template.queryResult: what `query` and `sortByLabel` return."""


@dataclass(frozen=True, slots=True)
class GoTime:
    """*time.Time in UTC, nanoseconds since the epoch."""

    nanos: int

    def __str__(self) -> str:
        seconds, nanos = divmod(self.nanos, 1_000_000_000)
        moment = datetime.datetime(1970, 1, 1) + datetime.timedelta(seconds=seconds)
        text = moment.strftime("%Y-%m-%d %H:%M:%S")  # int64 nanoseconds: 1677 to 2262
        if nanos:
            text += "." + f"{nanos:09d}".rstrip("0")
        return text + " +0000 UTC"


@dataclass(frozen=True, slots=True)
class GoDuration:
    """*time.Duration in nanoseconds, printed as Go prints one: 1h2m3.5s, 1.5ms, 0s."""

    nanos: int

    def __str__(self) -> str:
        n = self.nanos
        if n == 0:
            return "0s"
        sign, n = ("-", -n) if n < 0 else ("", n)
        if n < 1_000_000_000:
            for unit, size in (("ms", 1_000_000), ("µs", 1_000), ("ns", 1)):
                if n >= size or unit == "ns":
                    return sign + _trim_fraction(n, size) + unit
        hours, rest = divmod(n, 3_600_000_000_000)
        minutes, rest = divmod(rest, 60_000_000_000)
        text = _trim_fraction(rest, 1_000_000_000) + "s"
        if hours or minutes:
            text = f"{minutes}m{text}"
        if hours:
            text = f"{hours}h{text}"
        return sign + text


def _trim_fraction(n: int, size: int) -> str:
    whole, frac = divmod(n, size)
    if not frac:
        return str(whole)
    width = len(str(size)) - 1
    return f"{whole}." + f"{frac:0{width}d}".rstrip("0")


@dataclass(frozen=True, slots=True)
class AlertData:
    """What Prometheus hands an alert's templates as dot."""

    Labels: Mapping[str, str]
    ExternalLabels: Mapping[str, str]
    ExternalURL: str
    Value: float


STRUCT_FIELDS: dict[type, tuple[str, ...]] = {
    AlertData: ("Labels", "ExternalLabels", "ExternalURL", "Value"),
    QuerySample: ("Labels", "Value"),
}


def type_name(value: object) -> str:
    """The Go type a value stands for, as Go's errors and %T name it."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float64"
    if isinstance(value, complex):
        return "complex128"
    if isinstance(value, GoHTML):
        return "template.HTML"
    if isinstance(value, str):
        return "string"
    if isinstance(value, ArgsMap):
        return "map[string]interface {}"
    if isinstance(value, Mapping):
        return "map[string]string"
    if isinstance(value, QueryResult):
        return "template.queryResult"
    names = {
        QuerySample: "*template.sample",
        GoTime: "*time.Time",
        GoDuration: "*time.Duration",
        AlertData: "struct { Labels map[string]string; ExternalLabels map[string]string; "
        "ExternalURL string; Value interface {} }",
    }
    return names.get(type(value), type(value).__name__)


def truth(value: object) -> bool:
    """Go template truth: false, 0, nil and empty strings, maps and slices are false; a
    struct or a pointer is true (NaN is not 0, so it is true)."""
    if value is None:
        return False
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float | complex):
        return value != 0
    if isinstance(value, str | Mapping | list):
        return len(value) > 0
    return True


def _map_text(mapping: Mapping[str, object]) -> str:
    return "map[" + " ".join(f"{k}:{sprint_one(mapping[k])}" for k in sorted(mapping)) + "]"


def sprint_one(value: object) -> str:
    """fmt's %v of one operand."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return format_v(value)
    if isinstance(value, complex):
        imag = format_v(value.imag)
        return f"({format_v(value.real)}{'' if imag[0] in '+-' else '+'}{imag}i)"
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping):
        return _map_text(value)
    if isinstance(value, QuerySample):
        return "&{" + _map_text(value.Labels) + " " + format_v(value.Value) + "}"
    if isinstance(value, list):
        return "[" + " ".join(sprint_one(v) for v in value) + "]"
    if isinstance(value, AlertData):
        return "{" + " ".join(sprint_one(getattr(value, f)) for f in STRUCT_FIELDS[AlertData]) + "}"
    return str(value)


def sprint(args: list[object]) -> str:
    """fmt.Sprint: a space between two operands when neither is a string."""
    out: list[str] = []
    for i, arg in enumerate(args):
        if i and not isinstance(arg, str) and not isinstance(args[i - 1], str):
            out.append(" ")
        out.append(sprint_one(arg))
    return "".join(out)


def print_text(value: object) -> str:
    """What an action prints: a pointer is followed, nothing is "<no value>"."""
    if value is None:
        return "<no value>"
    if isinstance(value, QuerySample):
        return "{" + _map_text(value.Labels) + " " + format_v(value.Value) + "}"
    return sprint_one(value)


def is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))
