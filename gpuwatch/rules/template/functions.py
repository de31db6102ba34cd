"""The functions a rule template may call: Go's builtins and Prometheus's own, each with the
parameter types Go checks its arguments against."""

from __future__ import annotations

import ipaddress
import math
import re
import unicodedata
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from gpuwatch.gofmt import format_g4
from gpuwatch.regex import RegexError, compile_regex, expand_replacement
from gpuwatch.rules.template.printf import go_quote, sprintf
from gpuwatch.rules.template.values import (
    ArgsMap,
    GoDuration,
    GoHTML,
    GoTime,
    QueryResult,
    QuerySample,
    sprint,
    sprint_one,
    truth,
    type_name,
)


class FuncError(Exception):
    """A function's error: Go prints it after "error calling NAME: "."""


class Context(Protocol):
    """What the functions that look outside the template need."""

    @property
    def time(self) -> float: ...

    @property
    def external_url(self) -> str: ...

    def query(self, expr: str) -> list[tuple[dict[str, str], float]]: ...


@dataclass(frozen=True, slots=True)
class Func:
    fn: Callable[..., object]
    params: tuple[str, ...]  # Go types: string, float64, any, template.queryResult, ...
    variadic: str | None = None  # the type of the ... parameters
    needs_context: bool = False


# builtins ---------------------------------------------------------------------------------


class _Kind:
    BOOL, INT, FLOAT, STRING, OTHER = range(5)


def _kind(value: object) -> int:
    if isinstance(value, bool):
        return _Kind.BOOL
    if isinstance(value, int):
        return _Kind.INT
    if isinstance(value, float):
        return _Kind.FLOAT
    if isinstance(value, str):
        return _Kind.STRING
    return _Kind.OTHER


def _eq(first: object, *others: object) -> bool:
    if not others:
        raise FuncError("missing argument for comparison")
    k1 = _kind(first)
    for other in others:
        k2 = _kind(other)
        if k1 != k2:
            if first is not None and other is not None:
                raise FuncError("incompatible types for comparison")
            continue
        if k1 == _Kind.OTHER:
            if first is None or other is None:
                if (first is None) == (other is None):
                    return True
                continue
            raise FuncError(f"non-comparable type {sprint_one(other)}: {type_name(other)}")
        if first == other:
            return True
    return False


def _lt(a: object, b: object) -> bool:
    ka, kb = _kind(a), _kind(b)
    if ka in (_Kind.OTHER, _Kind.BOOL) or kb in (_Kind.OTHER, _Kind.BOOL):
        if ka != kb and _Kind.OTHER not in (ka, kb):
            raise FuncError("incompatible types for comparison")
        raise FuncError("invalid type for comparison")
    if ka != kb:
        raise FuncError("incompatible types for comparison")
    return bool(a < b)  # type: ignore[operator]


def _le(a: object, b: object) -> bool:
    return _lt(a, b) or _eq(a, b)


def _index(item: object, *keys: object) -> object:
    for key in keys:
        if item is None:
            raise FuncError("index of untyped nil")
        if isinstance(item, Mapping):
            if not isinstance(key, str):
                raise FuncError(f"value has type {type_name(key)}; should be string")
            item = item.get(key, None if isinstance(item, ArgsMap) else "")
        elif isinstance(item, list | str):
            if not isinstance(key, int) or isinstance(key, bool):
                raise FuncError(f"cannot index slice/array with type {type_name(key)}")
            if not 0 <= key < len(item):
                raise FuncError(f"index out of range: {key}")
            item = item[key] if isinstance(item, list) else item.encode()[key]
        else:
            raise FuncError(f"can't index item of type {type_name(item)}")
    return item


def _slice(item: object, *indexes: object) -> object:
    if not isinstance(item, str | list):
        raise FuncError(f"can't slice item of type {type_name(item)}")
    if len(indexes) > 3:
        raise FuncError(f"too many slice indexes: {len(indexes)}")
    if len(indexes) == 3 and isinstance(item, str):
        raise FuncError("cannot 3-index slice a string")
    bounds: list[int] = []
    for index in indexes:
        if not isinstance(index, int) or isinstance(index, bool):
            raise FuncError(f"cannot index slice/array with type {type_name(index)}")
        bounds.append(index)
    size = len(item.encode()) if isinstance(item, str) else len(item)
    for index in bounds:
        if not 0 <= index <= size:
            raise FuncError(f"index out of range: {index}")
    low = bounds[0] if bounds else 0
    high = bounds[1] if len(bounds) > 1 else size
    if low > high:
        raise FuncError(f"invalid slice index: {low} > {high}")
    if isinstance(item, str):
        return item.encode()[low:high].decode(errors="replace")
    return QueryResult(item[low:high]) if isinstance(item, QueryResult) else item[low:high]


def _len(item: object) -> int:
    if isinstance(item, str):
        return len(item.encode())
    if isinstance(item, Mapping | list):
        return len(item)
    if item is None:
        raise FuncError("reflect: call of reflect.Value.Type on zero Value")
    raise FuncError(f"len of type {type_name(item)}")


def _args_text(args: tuple[object, ...]) -> str:
    if len(args) == 1 and isinstance(args[0], str):
        return args[0]
    return sprint(list(args))


def html_escape(text: str) -> str:
    table = {'"': "&#34;", "'": "&#39;", "&": "&amp;", "<": "&lt;", ">": "&gt;", "\0": "\ufffd"}
    return "".join(table.get(c, c) for c in text)


def js_escape(text: str) -> str:
    table = {"\\": "\\\\", "'": "\\'", '"': '\\"', "<": "\\u003C", ">": "\\u003E"}
    table |= {"&": "\\u0026", "=": "\\u003D"}
    out = []
    for c in text:
        if c in table:
            out.append(table[c])
        elif ord(c) < 0x20 or (not c.isprintable() and c != " "):
            out.append(f"\\u{ord(c):04X}")
        else:
            out.append(c)
    return "".join(out)


def go_query_escape(text: str) -> str:
    """url.QueryEscape: space as +, A-Z a-z 0-9 - _ . ~ kept, the rest %XX of UTF-8."""
    return urllib.parse.quote_plus(text, safe="-_.~")


def _call(fn: object, *args: object) -> object:
    raise FuncError(f"non-function of type {type_name(fn)}")


BUILTINS: dict[str, Func] = {
    "and": Func(lambda *a: a, ("reflect",), "reflect"),  # short-circuits in the executor
    "or": Func(lambda *a: a, ("reflect",), "reflect"),
    "not": Func(lambda a: not truth(a), ("reflect",)),
    "len": Func(_len, ("reflect",)),
    "index": Func(_index, ("reflect",), "reflect"),
    "slice": Func(_slice, ("reflect",), "reflect"),
    "print": Func(lambda *a: sprint(list(a)), (), "any"),
    "println": Func(lambda *a: " ".join(sprint_one(x) for x in a) + "\n", (), "any"),
    "printf": Func(lambda f, *a: sprintf(f, list(a)), ("string",), "any"),
    "html": Func(lambda *a: html_escape(_args_text(a)), (), "any"),
    "js": Func(lambda *a: js_escape(_args_text(a)), (), "any"),
    "urlquery": Func(lambda *a: go_query_escape(_args_text(a)), (), "any"),
    "eq": Func(_eq, ("reflect",), "reflect"),
    "ne": Func(lambda a, b: not _eq(a, b), ("reflect", "reflect")),
    "lt": Func(_lt, ("reflect", "reflect")),
    "le": Func(_le, ("reflect", "reflect")),
    "gt": Func(lambda a, b: not _le(a, b), ("reflect", "reflect")),
    "ge": Func(lambda a, b: not _lt(a, b), ("reflect", "reflect")),
    "call": Func(_call, ("reflect",), "reflect"),
}


# Prometheus's functions ------------------------------------------------------------------


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
        raise FuncError(f"strconv.ParseFloat: parsing {_quoted(text)}: invalid syntax")
    cleaned = text.replace("_", "")
    value = float.fromhex(cleaned) if "x" in cleaned.lower() else float(cleaned)
    if math.isinf(value) and "inf" not in text.lower():
        raise FuncError(f"strconv.ParseFloat: parsing {_quoted(text)}: value out of range")
    return value


def _quoted(text: str) -> str:
    return go_quote(text)


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


def _to_time(v: float) -> GoTime:
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


def _humanize_timestamp(value: object) -> str:
    v = to_float(value)
    if math.isnan(v) or math.isinf(v):
        return format_g4(v)
    return str(_to_time(v))


def split_host_port(text: str) -> tuple[str, str] | None:
    """Go's net.SplitHostPort: (host, port), or None where Go answers an error."""
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            return None
        host, port = text[1:end], text[end + 2 :]
    else:
        host, sep, port = text.rpartition(":")
        if not sep or ":" in host:
            return None
    if any(c in host for c in "[]") or any(c in port for c in "[]:"):
        return None
    return host, port


def _strip_port(text: str) -> str:
    split = split_host_port(text)
    return text if split is None else split[0]


def _strip_domain(text: str) -> str:
    """The host's first name, the port kept; an IP address unchanged."""
    host, port = split_host_port(text) or (text, "")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        pass
    else:
        return text
    host = host.split(".")[0]
    if not port:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def go_upper(text: str) -> str:
    """strings.ToUpper: one rune for one rune (Unicode's simple case mapping), so "ß" stays,
    where Python's full mapping makes "SS"."""
    out = []
    for c in text:
        upper = c.upper()
        if len(upper) != 1:
            title = c.title()
            upper = title if len(title) == 1 else c
        out.append(upper)
    return "".join(out)


def go_lower(text: str) -> str:
    """strings.ToLower: one rune for one rune ("İ" becomes "i", not "i" and a combining dot)."""
    return "".join(c.lower()[0] for c in text)


def _title(text: str) -> str:
    """Each word's first letter upper-cased, the rest left as it is (Go's cases.Title with
    NoLower): a word is a run of letters, digits, marks, underscores and inner apostrophes."""
    out = []
    in_word = False
    for i, c in enumerate(text):
        cat = unicodedata.category(c)
        wordish = (
            cat[0] in "LMN"
            or c == "_"
            or (c in "'\u2019." and in_word and i + 1 < len(text) and text[i + 1].isalpha())
        )
        out.append(c.upper() if wordish and not in_word and cat[0] == "L" else c)
        in_word = wordish
    return "".join(out)


def _match(pattern: str, text: str) -> bool:
    """Go's regexp.MatchString: unanchored, `.` not matching a newline."""
    try:
        return compile_regex(pattern).search(text) is not None
    except RegexError as exc:
        raise FuncError(exc.go_message) from None


def _re_replace_all(pattern: str, replacement: str, text: str) -> str:
    """Go's ReplaceAllString: $1, ${1}, $name and $$ in the replacement; a name that is no
    group expands to nothing."""
    try:
        regex = compile_regex(pattern)
    except RegexError as exc:  # Prometheus uses MustCompile: the panic's text
        shown = f"`{pattern}`" if "`" not in pattern else go_quote(pattern)
        raise FuncError(f"regexp: Compile({shown}): {exc.go_message}") from None
    out: list[str] = []
    pos, last_end = 0, -1
    for match in regex.finditer(text):
        if match.start() == match.end() == last_end:
            continue  # Go ignores an empty match right after the one before
        last_end = match.end()
        out.append(text[pos : match.start()])

        out.append(expand_replacement(replacement, match))
        pos = match.end()
    out.append(text[pos:])
    return "".join(out)


def _sort_by_label(label: str, result: QueryResult | None) -> QueryResult:
    if result is None:
        return QueryResult()
    ordered = sorted(result, key=lambda s: s.Labels.get(label, ""))
    result[:] = ordered  # Go sorts the slice it was given
    return result


def _sample(s: QuerySample | None) -> QuerySample:
    if s is None:
        raise FuncError("runtime error: invalid memory address or nil pointer dereference")
    return s


def _first(result: QueryResult | None) -> QuerySample:
    if not result:
        raise FuncError("first() called on vector with no elements")
    return result[0]


def _query(ctx: Context, expr: str) -> QueryResult:
    return QueryResult(QuerySample(dict(labels), value) for labels, value in ctx.query(expr))


_DURATION = re.compile(
    r"(-?)(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?"
)
_DURATION_UNITS = (365 * 86400.0, 7 * 86400.0, 86400.0, 3600.0, 60.0, 1.0, 0.001)


def _parse_duration(text: str) -> float:
    """Prometheus's ParseDurationAllowNegative, in seconds: 1h30m, 5m, -1d, 0."""
    if not text:
        raise FuncError("empty duration string")
    if text in ("0", "-0"):
        return 0.0
    match = _DURATION.fullmatch(text)
    if match is None or not any(match.groups()[1:]):
        raise FuncError(f"not a valid duration string: {_quoted(text)}")
    total = sum(
        int(g) * unit for g, unit in zip(match.groups()[1:], _DURATION_UNITS, strict=True) if g
    )
    return -total if match.group(1) else total


def _external_url(ctx: Context) -> str:
    return ctx.external_url


def _path_prefix(ctx: Context) -> str:
    return urllib.parse.urlsplit(ctx.external_url).path


def _graph_link(expr: str, tab: int) -> str:
    return f"/graph?g0.expr={go_query_escape(expr)}&g0.tab={tab}"


def _to_duration(value: object) -> GoDuration:
    v = to_float(value) * 1e9
    if math.isnan(v):
        return GoDuration(-(2**63))  # Go's conversion of NaN to int64 on amd64
    return GoDuration(int(max(min(v, 2.0**63 - 1), -(2.0**63))))


PROMETHEUS: dict[str, Func] = {
    "query": Func(_query, ("string",), needs_context=True),
    "first": Func(_first, ("template.queryResult",)),
    "label": Func(lambda name, s: _sample(s).Labels.get(name, ""), ("string", "*template.sample")),
    "value": Func(lambda s: _sample(s).Value, ("*template.sample",)),
    "strvalue": Func(lambda s: _sample(s).Labels.get("__value__", ""), ("*template.sample",)),
    "args": Func(lambda *a: ArgsMap({f"arg{i}": v for i, v in enumerate(a)}), (), "any"),
    "reReplaceAll": Func(_re_replace_all, ("string", "string", "string")),
    "safeHtml": Func(GoHTML, ("string",)),
    "match": Func(_match, ("string", "string")),
    "title": Func(_title, ("string",)),
    "toUpper": Func(go_upper, ("string",)),
    "toLower": Func(go_lower, ("string",)),
    "graphLink": Func(lambda e: _graph_link(e, 0), ("string",)),
    "tableLink": Func(lambda e: _graph_link(e, 1), ("string",)),
    "sortByLabel": Func(_sort_by_label, ("string", "template.queryResult")),
    "stripPort": Func(_strip_port, ("string",)),
    "stripDomain": Func(_strip_domain, ("string",)),
    "humanize": Func(lambda v: humanize(to_float(v)), ("any",)),
    "humanize1024": Func(lambda v: humanize_1024(to_float(v)), ("any",)),
    "humanizeDuration": Func(lambda v: humanize_duration(to_float(v)), ("any",)),
    "humanizePercentage": Func(lambda v: format_g4(to_float(v) * 100) + "%", ("any",)),
    "humanizeTimestamp": Func(_humanize_timestamp, ("any",)),
    "toTime": Func(lambda v: _to_time(to_float(v)), ("any",)),
    "toDuration": Func(_to_duration, ("any",)),
    "now": Func(lambda ctx: ctx.time, (), needs_context=True),
    "pathPrefix": Func(_path_prefix, (), needs_context=True),
    "externalURL": Func(_external_url, (), needs_context=True),
    "parseDuration": Func(_parse_duration, ("string",)),
    "urlQueryEscape": Func(go_query_escape, ("string",)),
}

FUNCTIONS: dict[str, Func] = BUILTINS | PROMETHEUS
