"""Aggregation operators with by/without, as Prometheus computes them."""

from __future__ import annotations

import heapq
import json
import math
import re
from collections.abc import Callable, Sequence

import promql_parser as pp

from gpuwatch.promql.values import (
    NAME,
    EvalError,
    Labels,
    Scalar,
    StringValue,
    Value,
    Vector,
    VSample,
)
from gpuwatch.promql.xxhash import labels_hash
from gpuwatch.text.gofmt import format_f, format_v


def kahan_add(total: float, comp: float, inc: float) -> tuple[float, float]:
    """One step of Neumaier-compensated summation, as Prometheus 3 sums."""
    t = total + inc
    if math.isinf(t):
        comp = 0.0
    elif abs(total) >= abs(inc):
        comp += (total - t) + inc
    else:
        comp += (inc - t) + total
    return t, comp


def kahan_sum(values: Sequence[float]) -> float:
    """A compensated sum (exactly rounded, as close as Prometheus's Kahan sum gets)."""
    try:
        return math.fsum(values)
    except (OverflowError, ValueError):  # an infinity, or a NaN from +Inf + -Inf
        return sum(values)


def variance(values: Sequence[float]) -> float:
    """Population variance by Welford's method."""
    mean = acc = 0.0
    for n, v in enumerate(values, 1):
        delta = v - mean
        mean += delta / n
        acc += delta * (v - mean)
    return acc / len(values)


def variance_over_time(values: Sequence[float]) -> float:
    """stdvar_over_time's variance: Welford's method with the mean and the sum of squares
    each compensated, as Prometheus computes it over a window (its aggregation does not)."""
    count = 0
    mean_, mean_c = 0.0, 0.0
    aux, aux_c = 0.0, 0.0
    for v in values:
        count += 1
        delta = v - (mean_ + mean_c)
        mean_, mean_c = kahan_add(mean_, mean_c, delta / count)
        aux, aux_c = kahan_add(aux, aux_c, delta * (v - (mean_ + mean_c)))
    return (aux + aux_c) / count


def quantile(q: float, values: list[float]) -> float:
    """Prometheus's quantile: linear interpolation between the closest ranks."""
    if not values:
        return math.nan
    if q < 0:
        return -math.inf
    if q > 1:
        return math.inf
    if math.isnan(q):
        return math.nan
    # NaN sorts first, as Go's sort puts it: a NaN input shifts the ranks, it does not
    # poison the answer.
    ordered = sorted(values, key=lambda v: (not math.isnan(v), v))
    rank = q * (len(ordered) - 1)
    lower = max(0, math.floor(rank))
    upper = min(len(ordered) - 1, lower + 1)
    weight = rank - math.floor(rank)
    return ordered[lower] * (1 - weight) + ordered[upper] * weight


def grouping(modifier: pp.AggModifier | None) -> Callable[[Labels], Labels]:
    """The function from a series' labels to its group's labels (by/without)."""
    if modifier is None:
        return lambda metric: ()
    names = frozenset(modifier.labels)
    if modifier.type == pp.AggModifierType.By:
        return lambda metric: tuple(pair for pair in metric if pair[0] in names)
    dropped = names | {NAME}
    return lambda metric: tuple(pair for pair in metric if pair[0] not in dropped)


def _min(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return min(real) if real else math.nan


def _max(values: list[float]) -> float:
    real = [v for v in values if not math.isnan(v)]
    return max(real) if real else math.nan


def mean(values: Sequence[float]) -> float:
    """avg and avg_over_time: the compensated sum over the count, or, where that sum overflows
    though no value is infinite, a running mean, as Prometheus falls back to."""
    total = kahan_sum(values)
    if not math.isinf(total) or any(math.isinf(v) for v in values):
        return total / len(values)
    running = 0.0
    for n, v in enumerate(values, 1):
        running += v / n - running / n
    return running


SIMPLE = {
    "sum": kahan_sum,
    "avg": mean,
    "min": _min,
    "max": _max,
    "count": lambda values: float(len(values)),
    "group": lambda values: 1.0,
    "stddev": lambda values: math.sqrt(variance(values)),
    "stdvar": variance,
}


def evaluate(
    op: str, key_of: Callable[[Labels], Labels], vector: Vector, param: Value | None
) -> Vector:
    """Aggregate `vector` with `op`; `key_of` gives each series' group (see grouping())."""
    groups: dict[Labels, list[VSample]] = {}
    for s in vector:
        groups.setdefault(key_of(s.metric), []).append(s)
    if op in ("topk", "bottomk"):
        return _top(op, groups, _scalar_param(op, param))
    if op == "limitk":
        return _limitk(groups, _scalar_param(op, param))
    if op == "limit_ratio":
        return _limit_ratio(vector, _scalar_param(op, param))
    if op == "count_values":
        return _count_values(key_of, vector, param)
    out: Vector = []
    if op == "quantile":
        q = _scalar_param(op, param)
        for key, members in groups.items():
            out.append(VSample(key, quantile(q, [s.value for s in members]), 0.0))
        return out
    fn = SIMPLE[op]
    for key, members in groups.items():
        out.append(VSample(key, fn([s.value for s in members]), 0.0))
    return out


LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def _count_values(
    key_of: Callable[[Labels], Labels], vector: Vector, param: Value | None
) -> Vector:
    """count_values("label", v): per group, how many samples have each value, the value
    (as Go prints it) in `label`; it replaces a label of that name."""
    if not isinstance(param, StringValue):
        raise EvalError("count_values needs a string parameter")
    label = param.value
    if not LABEL_NAME.fullmatch(label):
        raise EvalError(f"invalid label name {json.dumps(label, ensure_ascii=False)}")
    counts: dict[Labels, int] = {}
    for s in vector:
        labels = dict(key_of(s.metric))
        labels[label] = format_f(s.value)
        key = tuple(sorted(labels.items()))
        counts[key] = counts.get(key, 0) + 1
    return [VSample(key, float(n), 0.0) for key, n in counts.items()]


def _scalar_param(op: str, param: Value | None) -> float:
    if not isinstance(param, Scalar):
        raise EvalError(f"{op} needs a scalar parameter")
    return param.value


def _top(op: str, groups: dict[Labels, list[VSample]], k_value: float) -> Vector:
    if math.isnan(k_value) or k_value < 1:
        return []
    k = int(min(k_value, 2**31))
    out: Vector = []
    for members in groups.values():
        # NaN ranks below every number for topk and above every number for bottomk
        if op == "topk":
            chosen = heapq.nlargest(k, members, key=lambda s: (not math.isnan(s.value), s.value))
        else:
            chosen = heapq.nsmallest(k, members, key=lambda s: (math.isnan(s.value), s.value))
        out.extend(chosen)
    return out


def _limitk(groups: dict[Labels, list[VSample]], k_value: float) -> Vector:
    """The first k series of each group, in the order they came (sorted by labels for a
    selector), as Prometheus keeps them."""
    if math.isnan(k_value):
        raise EvalError("Parameter value is NaN")
    if k_value < 1:
        return []
    if abs(k_value) >= 2.0**63:
        raise EvalError(f"Scalar value {format_v(k_value)} overflows int64")
    k = int(k_value)
    return [s for members in groups.values() for s in members[:k]]


def _limit_ratio(vector: Vector, ratio: float) -> Vector:
    """A stable sample of the series: a series is kept when the hash of its labels, as a
    fraction of 2^64, is under the ratio (from the top, for a negative ratio), so the same
    series are kept at every evaluation and in Prometheus."""
    if math.isnan(ratio):
        raise EvalError("Ratio value is NaN")
    if ratio == 0:
        return []
    r = max(-1.0, min(1.0, ratio))
    out: Vector = []
    for s in vector:
        offset = float(labels_hash(s.metric)) / float(2**64 - 1)
        if (offset < r) if r >= 0 else (offset >= 1 + r):
            out.append(s)
    return out
