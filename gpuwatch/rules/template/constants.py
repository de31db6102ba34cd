"""Go's constants as text/template reads them, and Go's quoting back: quoted strings through
strconv.Unquote's escapes (strconv.Quote for messages and %q), and numbers as ints, uints,
floats or complex numbers by Go's rules (`017` is octal, `08` an error, `1e3` a float that is
also an integer, `1e400` out of range)."""

from __future__ import annotations

import math
import re

from gpuwatch.rules.template.lex import TemplateError

_SIMPLE = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v"}
_SIMPLE |= {"\\": "\\"}


def unquote(text: str) -> str:
    """strconv.Unquote of a "double-quoted", `raw` or 'c' literal; TemplateError("invalid
    syntax") where Go refuses it."""
    if text.startswith("`"):
        if len(text) < 2 or not text.endswith("`") or "`" in text[1:-1]:
            raise TemplateError("invalid syntax")
        return text[1:-1].replace("\r", "")
    quote = text[:1]
    if quote not in "\"'" or len(text) < 2 or not text.endswith(quote):
        raise TemplateError("invalid syntax")
    body, out, i = text[1:-1], [], 0
    while i < len(body):
        c = body[i]
        if c in (quote, "\n"):
            raise TemplateError("invalid syntax")
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(body):
            raise TemplateError("invalid syntax")
        e = body[i + 1]
        i += 2
        if e in _SIMPLE:
            out.append(_SIMPLE[e])
        elif e == quote:
            out.append(e)
        elif e in "xuU":
            width = {"x": 2, "u": 4, "U": 8}[e]
            digits = body[i : i + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise TemplateError("invalid syntax")
            value = int(digits, 16)
            if e != "x" and (value > 0x10FFFF or 0xD800 <= value < 0xE000):
                raise TemplateError("invalid syntax")
            out.append(chr(value))
            i += width
        elif e in "01234567":
            digits = body[i - 1 : i + 2]
            if len(digits) != 3 or not all(d in "01234567" for d in digits) or int(digits, 8) > 255:
                raise TemplateError("invalid syntax")
            out.append(chr(int(digits, 8)))
            i += 2
        else:
            raise TemplateError("invalid syntax")
    result = "".join(out)
    if quote == "'" and len(result) != 1:
        raise TemplateError("invalid syntax")
    return result


_ESCAPES = {"\a": "\\a", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPES |= {"\v": "\\v", "\\": "\\\\"}


def go_quote(text: str, ascii_only: bool = False, quote: str = '"') -> str:
    """strconv.Quote (or QuoteToASCII, or QuoteRune with quote="'")."""
    out = [quote]
    for c in text:
        code = ord(c)
        if c == quote:
            out.append("\\" + c)
        elif c in _ESCAPES:
            out.append(_ESCAPES[c])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif (ascii_only and code > 0x7E) or not c.isprintable():
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(c)
    return "".join(out) + quote


_OCTAL = re.compile(r"[+-]?0[0-7_]+")
_FLOAT = re.compile(
    r"[+-]?(\d+\.?\d*([eE][+-]?\d+)?|\.\d+([eE][+-]?\d+)?"
    r"|0[xX](_?[0-9a-fA-F])*\.?[0-9a-fA-F_]*[pP][+-]?\d+)"
)


def _go_int(text: str, signed: bool) -> int | None:
    """strconv.ParseInt / ParseUint with base 0, or None where they fail."""
    body = text
    if text[:1] in "+-":
        if not signed:
            return None
        body = text[1:]
    try:
        if _OCTAL.fullmatch(body) and body.strip("0_"):
            value = int(body[1:].lstrip("_") or "0", 8)
        else:
            value = int(body, 0)
    except ValueError:
        return None
    if text.startswith("-"):
        value = -value
    low, high = (-(2**63), 2**63 - 1) if signed else (0, 2**64 - 1)
    return value if low <= value <= high else None


def number(text: str) -> tuple[int | float | complex, str]:
    """The constant and what Go makes of it where no type is asked for: "int" (`80`),
    "float" (`80.0`, `1e3`), "complex" (`1i`), or "uint" (`9223372036854775808`: a number
    that only fits a uint64, an error when it is used)."""
    if text.endswith("i"):
        imag = _go_float(text[:-1])
        if imag is not None:
            return complex(0.0, imag), "complex"
    as_int = _go_int(text, signed=True)
    if as_int is not None:
        return as_int, "int"
    as_uint = _go_int(text, signed=False)
    if as_uint is not None:
        return as_uint, "uint"
    value = _go_float(text)
    if value is None:
        raise TemplateError(f'illegal number syntax: "{text}"')
    if not any(c in text for c in ".eEpP"):
        raise TemplateError(f'integer overflow: "{text}"')
    return value, "float"


def _go_float(text: str) -> float | None:
    """strconv.ParseFloat, None where it fails (a syntax error or out of range)."""
    if not _FLOAT.fullmatch(text) or ("_" in text and "x" not in text.lower()):
        return None
    clean = text.replace("_", "")
    try:
        value = float.fromhex(clean) if "x" in clean.lower() else float(clean)
    except (ValueError, OverflowError):
        return None
    return None if math.isinf(value) else value
