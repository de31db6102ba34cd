"""Go's fmt.Sprintf for the values a template holds: verbs, flags (`-+# 0`), width and
precision (`*` too), explicit argument indexes (`%[2]d`), Go-syntax `%#v`, maps formatted
element by element, and Go's own text for a verb that does not fit its value
(`%!d(float64=1.5)`), a missing operand, an extra one and a bad index."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from gpuwatch.rules.template.constants import go_quote
from gpuwatch.rules.template.values import (
    ArgsMap,
    GoDuration,
    GoHTML,
    GoTime,
    QueryResult,
    QuerySample,
    sprint_one,
    type_name,
)
from gpuwatch.text.gofmt import format_v

# flags, [n] for the width, width, [n] for the precision, precision, [n] for the operand, verb
_SPEC = re.compile(
    r"%([-+# 0]*)(?:\[(\d+)\])?(\*|\d+)?(?:\.(?:\[(\d+)\])?(\*|\d*))?(?:\[(\d+)\])?(.|$)",
    re.DOTALL,
)


class _Flags:
    __slots__ = ("minus", "plus", "precision", "sharp", "space", "width", "zero")

    def __init__(self, flags: str, width: int | None, precision: int | None) -> None:
        self.minus = "-" in flags
        self.plus = "+" in flags
        self.sharp = "#" in flags
        self.space = " " in flags
        self.zero = "0" in flags and not self.minus
        self.width = width
        self.precision = precision

    def pad(self, text: str, numeric: bool = False) -> str:
        if self.width is None or len(text) >= self.width:
            return text
        fill = self.width - len(text)
        if self.minus:
            return text + " " * fill
        if self.zero and numeric:
            sign = text[0] if text[:1] in "+- " else ""
            return sign + "0" * fill + text[len(sign) :]
        if self.zero:  # Go pads even a string with zeros
            return "0" * fill + text
        return " " * fill + text

    def sign(self, text: str, negative: bool) -> str:
        if negative:
            return "-" + text
        if self.plus:
            return "+" + text
        if self.space:
            return " " + text
        return text


def _hex_float(value: float, upper: bool) -> str:
    """%x of a float64: 0x1.cp+01, the mantissa normalised to 1.x, trailing zeros dropped."""
    if value == 0:
        text = "0x0p+00"
    else:
        mantissa, exponent = math.frexp(value)  # value = mantissa * 2**exponent, 0.5 <= m < 1
        bits = round((mantissa * 2 - 1) * 2**52)
        digits = f"{bits:013x}".rstrip("0")
        text = f"0x1{'.' + digits if digits else ''}p{exponent - 1:+03d}"
    return text.upper().replace("0X", "0X") if upper else text


def _float(value: float, verb: str, f: _Flags) -> str:
    if math.isnan(value) or math.isinf(value):
        # Go keeps the sign of +Inf, shows NaN's only when asked, and never zero-pads either
        text = "Inf" if math.isinf(value) else "NaN"
        if value < 0:
            text = "-" + text
        elif f.plus or (math.isinf(value) and not f.space):
            text = "+" + text
        elif f.space:
            text = " " + text
        f.zero = False
        return f.pad(text)
    negative = math.copysign(1.0, value) < 0
    magnitude = abs(value)
    p = f.precision
    if verb in "xX":
        text = _hex_float(magnitude, verb == "X")
    elif verb in "vgG" and p is None:
        text = format_v(magnitude)
        if verb == "G":
            text = text.upper()
    elif verb in "eE" and p is None:
        text = f"{magnitude:.6{verb}}"
    elif verb in "fF":
        text = f"{magnitude:.{6 if p is None else p}f}"
    elif verb in "eE":
        text = f"{magnitude:.{p}{verb}}"
    else:  # g, G or v with a precision: Go's and C's %g agree
        text = f"{magnitude:.{max(p or 0, 1)}{'g' if verb == 'v' else verb}}"
    return f.pad(f.sign(text, negative), numeric=True)


def _int(value: int, verb: str, f: _Flags) -> str:
    negative, magnitude = value < 0, abs(value)
    if verb == "c":
        return f.pad(chr(magnitude))
    if verb == "q":
        return f.pad(go_quote(chr(magnitude), ascii_only=f.plus, quote="'"))
    if verb == "U":
        text = f"U+{magnitude:04X}"
        if f.sharp and chr(magnitude).isprintable():
            text += f" '{chr(magnitude)}'"
        return f.pad(text)
    base = {"d": "d", "v": "d", "x": "x", "X": "X", "o": "o", "O": "o", "b": "b"}[verb]
    text = format(magnitude, base)
    if f.precision is not None:
        text = text.rjust(f.precision, "0") if f.precision else ("" if magnitude == 0 else text)
    if verb == "O":
        text = "0o" + text
    elif f.sharp and verb == "o" and not text.startswith("0"):
        text = "0" + text
    elif f.sharp and verb in "xXb":
        text = {"x": "0x", "X": "0X", "b": "0b"}[verb] + text
    return f.pad(f.sign(text, negative), numeric=f.precision is None)


def _string(text: str, verb: str, f: _Flags) -> str:
    if f.precision is not None:
        text = text[: f.precision]
    if verb == "q":
        if f.sharp and "`" not in text and all(c == "\t" or c.isprintable() for c in text):
            return f.pad(f"`{text}`")
        return f.pad(go_quote(text, ascii_only=f.plus))
    if verb in "xX":
        data = text.encode()
        pieces = [format(b, "02x" if verb == "x" else "02X") for b in data]
        prefix = ("0x" if verb == "x" else "0X") if f.sharp else ""
        if f.space:
            return f.pad(" ".join(prefix + piece for piece in pieces))
        return f.pad(prefix + "".join(pieces) if pieces else "")
    return f.pad(text)


def _bad_verb(verb: str, value: object, f: _Flags) -> str:
    if value is None:
        return f"%!{verb}(<nil>)"
    return f"%!{verb}({type_name(value)}={_format(value, 'v', f, 0)})"


def go_syntax(value: object) -> str:
    """%#v: the value as Go source would write it."""
    if value is None:
        return "<nil>"
    if isinstance(value, bool | int | float | complex):
        return sprint_one(value)
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, Mapping):
        kind = "map[string]interface {}" if isinstance(value, ArgsMap) else "map[string]string"
        items = ", ".join(f"{go_quote(k)}:{go_syntax(value[k])}" for k in sorted(value))
        return f"{kind}{{{items}}}"
    if isinstance(value, QuerySample):
        return (
            f"&template.sample{{Labels:{go_syntax(value.Labels)}, Value:{go_syntax(value.Value)}}}"
        )
    if isinstance(value, QueryResult):
        return "template.queryResult{" + ", ".join(go_syntax(s) for s in value) + "}"
    return sprint_one(value)


def _format(value: object, verb: str, f: _Flags, depth: int) -> str:
    if verb == "T":
        return f.pad(type_name(value))
    if isinstance(value, GoTime | GoDuration) and verb in "vsxXq":
        return _string(str(value), verb, f)
    if value is None:
        return f.pad("<nil>") if verb == "v" else _bad_verb(verb, value, f)
    if isinstance(value, bool):
        return f.pad("true" if value else "false") if verb in "tv" else _bad_verb(verb, value, f)
    if isinstance(value, int):
        return _int(value, verb, f) if verb in "vdxXoObcqU" else _bad_verb(verb, value, f)
    if isinstance(value, float):
        return _float(value, verb, f) if verb in "vgGeEfFxX" else _bad_verb(verb, value, f)
    if isinstance(value, complex):
        if verb not in "vgGeEfF":
            return _bad_verb(verb, value, f)
        imag = _Flags("+", None, f.precision)
        return f.pad(
            f"({_float(value.real, verb, _Flags('', None, f.precision))}"
            f"{_float(value.imag, verb, imag)}i)"
        )
    if isinstance(value, GoHTML | str):
        if verb in "vsqxX":
            return _string(str(value), "s" if verb == "v" else verb, f)
        return _bad_verb(verb, value, f)
    if isinstance(value, Mapping):
        items = [
            f"{_format(k, verb, f, depth + 1)}:{_format(value[k], verb, f, depth + 1)}"
            for k in sorted(value)
        ]
        return "map[" + " ".join(items) + "]"
    if isinstance(value, QuerySample):
        if depth > 0 and verb != "v":
            return f"%!{verb}(*template.sample={_format(value, 'v', f, 0)})"
        inner = f"{_format(value.Labels, verb, f, 1)} {_format(value.Value, verb, f, 1)}"
        return "&{" + inner + "}"
    if isinstance(value, list):
        return "[" + " ".join(_format(v, verb, f, depth + 1) for v in value) + "]"
    if verb in "vs":
        return f.pad(sprint_one(value))
    return _bad_verb(verb, value, f)


def format_one(value: object, verb: str, f: _Flags) -> str:
    if verb == "v" and f.sharp:
        return f.pad(go_syntax(value))
    return _format(value, verb, f, 0)


def sprintf(fmt: str, args: list[object]) -> str:
    out: list[str] = []
    pos, used, reordered = 0, 0, False

    def index(text: str | None) -> bool:
        """An explicit [n]: the next operand is the nth; False where n is out of range."""
        nonlocal used, reordered
        if text is None:
            return True
        reordered = True
        n = int(text)
        if not 1 <= n <= len(args):
            return False
        used = n - 1
        return True

    def star() -> int | None:
        nonlocal used
        value = args[used] if used < len(args) else None
        used += 1
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    for match in _SPEC.finditer(fmt):
        out.append(fmt[pos : match.start()])
        pos = match.end()
        flags, width_index, width_text, prec_index, prec_text, arg_index, verb = match.groups()
        if verb == "%" and not flags and width_text is None and prec_text is None:
            out.append("%")
            continue
        good = index(width_index)
        width: int | None = None
        if width_text == "*":
            width = star()
            if width is None:
                out.append("%!(BADWIDTH)")
        elif width_text:
            width = int(width_text)
        good = index(prec_index) and good
        precision: int | None = None
        if prec_text == "*":
            precision = star()
            if precision is None or precision < 0:
                precision = None
                out.append("%!(BADPREC)")
        elif prec_text is not None:
            precision = int(prec_text or "0")
        good = index(arg_index) and good
        if not verb:
            out.append("%!(NOVERB)")
            continue
        if not good:
            out.append(f"%!{verb}(BADINDEX)")
            continue
        if verb == "%":
            out.append("%")
            continue
        if used >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        state = _Flags(flags, width, precision)
        if width is not None and width < 0:
            state.minus, state.zero, state.width = True, False, -width
        out.append(format_one(args[used], verb, state))
        used += 1
    out.append(fmt[pos:])
    if not reordered and used < len(args):
        extra = ", ".join(
            "<nil>" if a is None else f"{type_name(a)}={sprint_one(a)}" for a in args[used:]
        )
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)
