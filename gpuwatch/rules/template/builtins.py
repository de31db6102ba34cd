"""Go's builtin template functions: and, or, not, len, index, slice, print, printf,
println, html, js, urlquery, the comparisons, call; with Go's type rules and error texts."""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping

from gpuwatch.rules.template.printf import sprintf
from gpuwatch.rules.template.signature import Func, FuncError
from gpuwatch.rules.template.values import (
    ArgsMap,
    QueryResult,
    sprint,
    sprint_one,
    truth,
    type_name,
)


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
