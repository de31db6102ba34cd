"""The functions a rule template may call: Prometheus's own (query, label, humanize...)
beside Go's builtins, each with the parameter types Go checks its arguments against."""

from __future__ import annotations

import ipaddress
import re
import unicodedata
import urllib.parse

from gpuwatch.rules.template.builtins import BUILTINS, go_query_escape
from gpuwatch.rules.template.constants import go_quote
from gpuwatch.rules.template.numbers import (
    humanize,
    humanize_1024,
    humanize_duration,
    humanize_timestamp,
    percentage,
    to_duration,
    to_float,
    to_time,
)
from gpuwatch.rules.template.signature import Context, Func, FuncError
from gpuwatch.rules.template.values import ArgsMap, GoHTML, QueryResult, QuerySample
from gpuwatch.text.regex import RegexError, compile_regex, expand_replacement

__all__ = ["FUNCTIONS", "Context", "Func", "FuncError"]


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
        raise FuncError(f"not a valid duration string: {go_quote(text)}")
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
    "humanizePercentage": Func(percentage, ("any",)),
    "humanizeTimestamp": Func(humanize_timestamp, ("any",)),
    "toTime": Func(lambda v: to_time(to_float(v)), ("any",)),
    "toDuration": Func(to_duration, ("any",)),
    "now": Func(lambda ctx: ctx.time, (), needs_context=True),
    "pathPrefix": Func(_path_prefix, (), needs_context=True),
    "externalURL": Func(_external_url, (), needs_context=True),
    "parseDuration": Func(_parse_duration, ("string",)),
    "urlQueryEscape": Func(go_query_escape, ("string",)),
}

FUNCTIONS: dict[str, Func] = BUILTINS | PROMETHEUS
