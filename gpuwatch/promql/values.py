"""The value types of PromQL evaluation: scalars, instant vectors and range vectors."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass

from gpuwatch.store.series import Window

Labels = tuple[tuple[str, str], ...]  # sorted by name; includes __name__ while a name applies
NAME = "__name__"


class EvalError(Exception):
    """A query that cannot be evaluated (Prometheus would answer it with an error too)."""


@dataclass(frozen=True, slots=True)
class Scalar:
    value: float


@dataclass(frozen=True, slots=True)
class StringValue:
    value: str


@dataclass(slots=True)
class VSample:
    """One element of an instant vector. `time` is the sample's own timestamp, for timestamp()."""

    metric: Labels
    value: float
    time: float


@dataclass(slots=True)
class RangeSeries:
    """One element of a range vector: the samples of one series inside the window."""

    metric: Labels
    window: Window


Vector = list[VSample]
Matrix = list[RangeSeries]
Value = Scalar | StringValue | Vector | Matrix


def drop_name(metric: Labels) -> Labels:
    if metric and metric[0][0] == NAME:  # sorted: only upper-case names come before it
        return metric[1:]
    if any(k == NAME for k, _ in metric):
        return tuple(pair for pair in metric if pair[0] != NAME)
    return metric


def label_value(metric: Labels, name: str) -> str:
    for k, v in metric:
        if k == name:
            return v
    return ""


def with_label(metric: Labels, name: str, value: str) -> Labels:
    """`metric` with `name` set to `value`, or removed when `value` is empty."""
    rest = [pair for pair in metric if pair[0] != name]
    if value:
        rest.append((name, value))
        rest.sort()
    return tuple(rest)


def format_labels(metric: Labels) -> str:
    """Go's labels.String(): {a="b", c="d"}."""
    return "{" + ", ".join(f"{k}={go_quote(v)}" for k, v in metric) + "}"


def go_quote(text: str) -> str:
    """strconv.Quote for the characters label values actually hold."""
    out = ['"']
    for ch in text:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


MIN_NORMAL = 2.2250738585072014e-308  # the smallest normal float64


def almost_equal(a: float, b: float, epsilon: float) -> bool:
    """Prometheus's util/almost.Equal: equal within a relative epsilon, NaN equal to NaN (its
    histogram code ignores rounding wobbles with it; its test suite compares results with it)."""
    if math.isnan(a) and math.isnan(b):
        return True
    if a == b:
        return True
    total = abs(a) + abs(b)
    diff = abs(a - b)
    if a == 0 or b == 0 or total < MIN_NORMAL:
        return diff < epsilon * MIN_NORMAL
    return diff / min(total, sys.float_info.max) < epsilon
