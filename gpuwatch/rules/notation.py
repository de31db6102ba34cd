"""promtool's notation for test input: series like `up{job="x"}` and values like
`0+10x5 _ stale 3x2`."""

from __future__ import annotations

import math
import re

from gpuwatch.promql.values import NAME, Labels
from gpuwatch.store.series import STALE_NAN

_METRIC = re.compile(r"\s*([a-zA-Z_:][a-zA-Z0-9_:]*)?\s*")
_PAIR = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|\})')
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_NUMBER = (
    r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|0x[0-9a-fA-F]+|[iI]nf|NaN)"
)
_EXPANDING = re.compile(rf"({_NUMBER})([-+])({_NUMBER})x(\d+)")
_REPEAT = re.compile(rf"({_NUMBER}|_)x(\d+)")

MISSING = None  # a `_`: no sample at that step


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text)


def parse_metric(text: str) -> Labels:
    """`name{a="b", c="d"}`, `{__name__="name"}` or `name` -> sorted labels with __name__."""
    match = _METRIC.match(text)
    assert match is not None  # the pattern matches the empty string
    labels: dict[str, str] = {}
    if match.group(1):
        labels[NAME] = match.group(1)
    pos = match.end()
    if pos < len(text) and text[pos] == "{":
        pos += 1
        rest = text[pos:].lstrip()
        if rest.startswith("}"):
            pos = len(text) - len(rest) + 1
        else:
            while True:
                pair = _PAIR.match(text, pos)
                if pair is None:
                    raise ValueError(f"cannot parse labels in {text!r} at {text[pos:]!r}")
                labels[pair.group(1)] = _unescape(pair.group(2))
                pos = pair.end()
                if pair.group(3) == "}":
                    break
    if text[pos:].strip():
        raise ValueError(f"unexpected {text[pos:].strip()!r} in {text!r}")
    if not labels:
        raise ValueError(f"no metric name or labels in {text!r}")
    return tuple(sorted(labels.items()))


def _number(text: str) -> float:
    if text.lower() in ("inf", "+inf"):
        return math.inf
    if text.lower() == "-inf":
        return -math.inf
    if text.lower().lstrip("+-").startswith("0x"):
        return float(int(text, 16))
    return float(text)


def expand_values(text: str) -> list[float | None]:
    """One entry per interval step: a value, STALE_NAN, or None for `_`."""
    out: list[float | None] = []
    for token in text.split():
        if token == "_":
            out.append(MISSING)
        elif token == "stale":
            out.append(STALE_NAN)
        elif (m := _EXPANDING.fullmatch(token)) is not None:
            start, step = _number(m.group(1)), _number(m.group(3))
            if m.group(2) == "-":
                step = -step
            # Added step by step, as Prometheus's series parser does: `1+0.1x3` ends at
            # 1.3000000000000003, not at 1 + 0.1 * 3.
            value = start
            out.append(value)
            for _ in range(int(m.group(4))):
                value += step
                out.append(value)
        elif (m := _REPEAT.fullmatch(token)) is not None:
            times = int(m.group(2))
            if m.group(1) == "_":
                out.extend([MISSING] * times)
            else:
                out.extend([_number(m.group(1))] * (times + 1))
        else:
            try:
                out.append(_number(token))
            except ValueError:
                raise ValueError(f"cannot parse value {token!r} in {text!r}") from None
    return out
