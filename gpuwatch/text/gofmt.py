"""Go's ways of printing floats, so messages read exactly as Prometheus's would."""

from __future__ import annotations

import math


def _shortest(v: float) -> tuple[str, int]:
    """The shortest round-trip digits of |v| and the decimal exponent of the first digit."""
    digits = repr(abs(v))
    if "e" in digits:
        head, _, exp_part = digits.partition("e")
        exp = int(exp_part)
        digits = head.replace(".", "")
    else:
        int_part, _, frac = digits.partition(".")
        frac = frac.rstrip("0")
        if int_part != "0":
            exp = len(int_part) - 1
            digits = int_part + frac
        else:
            stripped = frac.lstrip("0")
            exp = -(len(frac) - len(stripped)) - 1
            digits = stripped
    digits = digits.lstrip("0").rstrip("0") or "0"
    return digits, exp


def non_finite(v: float) -> str | None:
    """How Go and Prometheus spell the values that are not numbers: NaN, +Inf, -Inf."""
    if math.isnan(v):
        return "NaN"
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return None


def format_e(v: float, upper: bool = True) -> str:
    """strconv.FormatFloat(v, 'E', -1, 64): 1E+00, 1.5E-05."""
    special = non_finite(v)
    if special is not None:
        return special
    sign = "-" if math.copysign(1.0, v) < 0 else ""
    if v == 0:
        return f"{sign}0{'E' if upper else 'e'}+00"
    digits, exp = _shortest(v)
    mantissa = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
    return f"{sign}{mantissa}{'E' if upper else 'e'}{'-' if exp < 0 else '+'}{abs(exp):02d}"


def _non_finite_or_zero(v: float) -> str | None:
    """NaN, ±Inf and ±0 as every Go float format without an exponent spells them."""
    if v == 0:
        return "-0" if math.copysign(1.0, v) < 0 else "0"
    return non_finite(v)


def format_v(v: float) -> str:
    """fmt's %v for a float64 (as {{ $value }} prints): shortest digits, exponent form below
    1e-4 and from 1e+06, as strconv's 'g' with the shortest precision does."""
    special = _non_finite_or_zero(v)
    if special is not None:
        return special
    digits, exp = _shortest(v)
    sign = "-" if v < 0 else ""
    if exp < -4 or exp >= 6:
        return sign + format_e(abs(v), upper=False)
    return sign + _fixed(digits, exp)


def format_f(v: float) -> str:
    """strconv.FormatFloat(v, 'f', -1, 64): shortest digits, never an exponent (1e21 is
    1000000000000000000000), as count_values writes its label values."""
    special = _non_finite_or_zero(v)
    if special is not None:
        return special
    digits, exp = _shortest(v)
    return ("-" if v < 0 else "") + _fixed(digits, exp)


def _fixed(digits: str, exp: int) -> str:
    if exp < 0:
        return f"0.{'0' * (-exp - 1)}{digits}"
    if len(digits) <= exp + 1:
        return digits + "0" * (exp + 1 - len(digits))
    return f"{digits[: exp + 1]}.{digits[exp + 1 :]}"


def format_g4(v: float) -> str:
    """fmt's %.4g, used by the humanize functions."""
    special = non_finite(v)
    if special is not None:
        return special
    return f"{v:.4g}"
