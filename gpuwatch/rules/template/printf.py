"""Go's fmt.Sprintf for the values a template holds: the verbs, flags, width and precision
rule authors write (`%.2f`, `%5.1f%%`, `%s`, `%d`, `%q`, `%x`, `%-10s`), and Go's own text for a
verb that does not fit its value (`%!d(float64=1.5)`), a missing operand and an extra one."""

from __future__ import annotations

import json
import math
import re

from gpuwatch.gofmt import format_v
from gpuwatch.rules.template.values import GoDuration, GoTime, sprint_one, type_name

_SPEC = re.compile(r"%([-+# 0]*)(\*|\d+)?(?:\.(\*|\d*))?(.|$)", re.DOTALL)


def go_quote(text: str) -> str:
    """strconv.Quote: a double-quoted Go string literal."""
    out = ['"']
    for c in text:
        code = ord(c)
        if c in '"\\':
            out.append("\\" + c)
        elif c in "\a\b\f\n\r\t\v":
            out.append(json.dumps(c)[1:-1] if c in "\b\f\n\r\t" else {"\a": "\\a", "\v": "\\v"}[c])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif not c.isprintable():
            out.append(f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}")
        else:
            out.append(c)
    return "".join(out) + '"'


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
        return " " * fill + text

    def sign(self, text: str, negative: bool) -> str:
        if negative:
            return "-" + text
        if self.plus:
            return "+" + text
        if self.space:
            return " " + text
        return text


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
    if verb in "vgG" and p is None:
        text = format_v(magnitude)
        if verb == "G":
            text = text.upper()
    elif verb in "eE" and p is None:
        text = f"{magnitude:.6{verb}}"
    elif verb in "fF":
        text = f"{magnitude:.{6 if p is None else p}f}"
    elif verb in "eE":
        text = f"{magnitude:.{p}{verb}}"
    elif verb in "xX":
        text = magnitude.hex()
        text = text.upper() if verb == "X" else text
    else:  # g, G or v with a precision: Go's and C's %g agree
        text = f"{magnitude:.{max(p or 0, 1)}{'g' if verb == 'v' else verb}}"
    return f.pad(f.sign(text, negative), numeric=True)


def _int(value: int, verb: str, f: _Flags) -> str:
    negative, magnitude = value < 0, abs(value)
    if verb == "c":
        return f.pad(chr(magnitude))
    if verb == "q":
        return f.pad("'" + go_quote(chr(magnitude))[1:-1].replace("'", "\\'") + "'")
    if verb == "U":
        return f.pad(f"U+{magnitude:04X}")
    base = {"d": "d", "v": "d", "x": "x", "X": "X", "o": "o", "O": "o", "b": "b"}[verb]
    text = format(magnitude, base)
    if f.precision is not None:
        text = text.rjust(f.precision, "0") if f.precision else ("" if magnitude == 0 else text)
    if verb == "O" or (f.sharp and verb == "o"):
        text = "0o" + text if verb == "O" else "0" + text
    elif f.sharp and verb in "xX":
        text = ("0x" if verb == "x" else "0X") + text
    zero_ok = f.precision is None
    return f.pad(f.sign(text, negative), numeric=zero_ok)


def _string(text: str, verb: str, f: _Flags) -> str:
    if f.precision is not None:
        text = text[: f.precision]
    if verb == "q":
        text = go_quote(text)
    elif verb in "xX":
        hexed = text.encode().hex()
        text = hexed.upper() if verb == "X" else hexed
    return f.pad(text)


def bad_verb(verb: str, value: object) -> str:
    if value is None:
        return f"%!{verb}(<nil>)"
    return f"%!{verb}({type_name(value)}={sprint_one(value)})"


def format_one(value: object, verb: str, f: _Flags) -> str:
    if verb == "T":
        return f.pad(type_name(value))
    if isinstance(value, GoTime | GoDuration) and verb in "vsxXq":
        return _string(str(value), verb, f)
    if value is None:
        return f.pad("<nil>") if verb == "v" else bad_verb(verb, value)
    if isinstance(value, bool):
        return f.pad("true" if value else "false") if verb in "tv" else bad_verb(verb, value)
    if isinstance(value, int):
        if verb in "vdxXoObcqU":
            return _int(value, verb, f)
        return bad_verb(verb, value)
    if isinstance(value, float):
        if verb in "vgGeEfFxX":
            return _float(value, verb, f)
        return bad_verb(verb, value)
    if isinstance(value, str):
        if verb in "vsqxX":
            return _string(value, "s" if verb == "v" else verb, f)
        return bad_verb(verb, value)
    if verb in "vs":
        return f.pad(sprint_one(value))
    return bad_verb(verb, value)


def sprintf(fmt: str, args: list[object]) -> str:
    out: list[str] = []
    pos, used = 0, 0
    for match in _SPEC.finditer(fmt):
        out.append(fmt[pos : match.start()])
        pos = match.end()
        flags, width_text, precision_text, verb = match.groups()
        if verb == "%" and not flags and width_text is None and precision_text is None:
            out.append("%")
            continue
        width: int | None = None
        precision: int | None = None
        if width_text == "*":
            star = args[used] if used < len(args) else None
            used += 1
            width = star if isinstance(star, int) and not isinstance(star, bool) else None
            if width is None:
                out.append("%!(BADWIDTH)")
        elif width_text:
            width = int(width_text)
        if precision_text == "*":
            star = args[used] if used < len(args) else None
            used += 1
            precision = star if isinstance(star, int) and not isinstance(star, bool) else None
            if precision is None:
                out.append("%!(BADPREC)")
        elif precision_text is not None:
            precision = int(precision_text or "0")
        if not verb:
            out.append("%!(NOVERB)")
            continue
        if verb == "%":
            out.append("%")
            continue
        if used >= len(args):
            out.append(f"%!{verb}(MISSING)")
            continue
        flag_state = _Flags(flags, width, precision)
        if width is not None and width < 0:
            flag_state.minus, flag_state.width = True, -width
        out.append(format_one(args[used], verb, flag_state))
        used += 1
    out.append(fmt[pos:])
    if used < len(args):
        extra = ", ".join(
            "<nil>" if a is None else f"{type_name(a)}={sprint_one(a)}" for a in args[used:]
        )
        out.append(f"%!(EXTRA {extra})")
    return "".join(out)
