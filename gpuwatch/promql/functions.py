"""PromQL functions of the supported subset."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING

import promql_parser as pp

from gpuwatch.promql.aggregations import (
    kahan_add,
    kahan_sum,
    mean,
    quantile,
    variance_over_time,
)
from gpuwatch.promql.elementwise import DATE_PARTS, ELEMENTWISE, clamp, date_part, round_to
from gpuwatch.promql.histograms import histogram_quantile
from gpuwatch.promql.ordering import sort_by_labels
from gpuwatch.promql.relabel import label_join, label_replace, string_arg
from gpuwatch.promql.values import (
    EvalError,
    Labels,
    Matrix,
    RangeSeries,
    Scalar,
    Value,
    Vector,
    VSample,
    drop_name,
)
from gpuwatch.store.series import CounterStats, LastTwo, Window, counter_stats, last_two, on_ms

if TYPE_CHECKING:
    from gpuwatch.promql.evaluator import Evaluator, SeriesView


def _extrapolated(
    stats: CounterStats | None, start: float, end: float, counter: bool, rate: bool
) -> float | None:
    """rate/increase/delta: Prometheus 3's extrapolation towards the window's edges."""
    if stats is None:
        return None
    n, first_t, first_v, last_t, last_v, drops = stats
    result = last_v - first_v
    if counter:
        result += drops
    sampled = last_t - first_t
    if sampled <= 0:
        return None
    if result == 0:
        return 0.0  # a flat series, the common case: no extrapolation can change it
    to_start = first_t - start
    to_end = end - last_t
    average = sampled / (n - 1)
    threshold = average * 1.1
    if to_start >= threshold:
        to_start = average / 2
    if counter and result > 0 and first_v >= 0:
        to_zero = sampled * (first_v / result)
        to_start = min(to_start, to_zero)
    if to_end >= threshold:
        to_end = average / 2
    factor = (sampled + to_start + to_end) / sampled
    if rate:
        factor /= end - start
    return result * factor


def _instant_rate(points: LastTwo | None, counter: bool, rate: bool) -> float | None:
    """irate/idelta: from the last two samples."""
    if points is None:
        return None
    prev_t, prev_v, last_t, last_v = points
    result = last_v if counter and last_v < prev_v else last_v - prev_v
    if not rate:
        return result
    interval = last_t - prev_t
    return result / interval if interval else None


def linear_regression(w: Window, intercept_time: float) -> tuple[float, float]:
    """(slope, intercept at intercept_time) of a least-squares line, as Prometheus fits it."""
    values = w.values()
    first = values[0]
    if all(v == first for v in values):
        return (math.nan, math.nan) if math.isinf(first) else (0.0, first)
    n = float(len(values))
    sx = cx = sy = cy = sxy = cxy = sx2 = cx2 = 0.0
    for t, v in zip(w.times(), values, strict=True):
        x = t - intercept_time
        sx, cx = kahan_add(sx, cx, x)
        sy, cy = kahan_add(sy, cy, v)
        sxy, cxy = kahan_add(sxy, cxy, x * v)
        sx2, cx2 = kahan_add(sx2, cx2, x * x)
    sx, sy, sxy, sx2 = sx + cx, sy + cy, sxy + cxy, sx2 + cx2
    cov = sxy - sx * sy / n
    var = sx2 - sx * sx / n
    slope = cov / var if var else math.nan
    return slope, sy / n - slope * sx / n


def _changes(w: Window) -> float:
    values = w.values()
    if not math.isnan(sum(values)):  # no NaN: count unequal neighbours at C speed
        return float(sum(map(operator.ne, values, values[1:])))
    count = 0
    for a, b in pairwise(values):
        if not (a == b or (math.isnan(a) and math.isnan(b))):
            count += 1
    return float(count)


def _avg_over_time(w: Window) -> float:
    return mean(w.values())


def _extreme(w: Window, pick: Callable[[Sequence[float]], float]) -> float:
    """min/max_over_time: NaN only when every sample is NaN, as Prometheus does."""
    values = w.values()
    if not math.isnan(sum(values)):  # C-speed check: no NaN (and no +Inf meeting -Inf)
        return pick(values)
    real = [v for v in values if not math.isnan(v)]
    return pick(real) if real else math.nan


OVER_TIME: dict[str, Callable[[Window], float]] = {
    "avg_over_time": _avg_over_time,
    "min_over_time": lambda w: _extreme(w, min),
    "max_over_time": lambda w: _extreme(w, max),
    "sum_over_time": lambda w: kahan_sum(w.values()),
    "count_over_time": lambda w: float(len(w)),
    "stddev_over_time": lambda w: math.sqrt(variance_over_time(w.values())),
    "stdvar_over_time": lambda w: variance_over_time(w.values()),
    "present_over_time": lambda w: 1.0,
    "changes": _changes,
    "resets": lambda w: float(w.drops()[0]),
}


def _date_call(ev: Evaluator, name: str, args: list[pp.Expr], t: float) -> Vector:
    part = DATE_PARTS[name]
    if not args:  # the evaluation time, as vector(time())
        return [VSample((), date_part(part, t), t)]
    return _map(ev.vector(args[0], t), lambda v: date_part(part, v))


def _clamp(v: float, low: float, high: float) -> float:
    if math.isnan(v):
        return v
    return max(low, min(high, v))


def _map(vector: Vector, fn: Callable[[float], float]) -> Vector:
    return [VSample(drop_name(s.metric), fn(s.value), s.time) for s in vector]


def _unparen(expr: pp.Expr) -> pp.Expr:
    """The expression inside any parentheses: `rate((x[5m]))` is `rate(x[5m])`, and
    `timestamp((x))` and `absent((x{a="b"}))` see the selector, as Prometheus unwraps them."""
    while isinstance(expr, pp.ParenExpr):
        expr = expr.expr
    return expr


def call(ev: Evaluator, expr: pp.Call, t: float) -> Value:
    name = expr.func.name
    args = [_unparen(a) for a in expr.args]
    if name in ("rate", "increase", "delta", "irate", "idelta", "deriv") or name in OVER_TIME:
        return _range_function(ev, name, args[0], t)
    if name == "last_over_time":
        return [VSample(s.metric, s.window.last()[1], t) for s in _matrix(ev, args[0], t)]
    if name == "quantile_over_time":
        q = ev.scalar(args[0], t)
        return [
            VSample(drop_name(s.metric), quantile(q, list(s.window.values())), t)
            for s in _matrix(ev, args[1], t)
        ]
    if name == "predict_linear":
        ahead = ev.scalar(args[1], t)
        out: Vector = []
        for s in _matrix(ev, args[0], t):
            if len(s.window) >= 2:
                slope, intercept = linear_regression(s.window, t)
                out.append(VSample(drop_name(s.metric), intercept + slope * ahead, t))
        return out
    if name in ("absent", "absent_over_time"):
        found = ev.eval(args[0], t)
        if found:
            return []
        return [VSample(_absent_labels(ev, args[0]), 1.0, t)]
    if name in ELEMENTWISE:
        return _map(ev.vector(args[0], t), ELEMENTWISE[name])
    if name in DATE_PARTS:
        return _date_call(ev, name, args, t)
    if name == "pi":
        return Scalar(math.pi)
    if name == "histogram_quantile":
        return histogram_quantile(ev.scalar(args[0], t), ev.vector(args[1], t), t)
    if name == "round":
        to_nearest = ev.scalar(args[1], t) if len(args) > 1 else 1.0
        return _map(ev.vector(args[0], t), lambda v: round_to(v, to_nearest))
    if name in ("clamp", "clamp_min", "clamp_max"):
        return _clamp_call(ev, name, args, t)
    if name == "time":
        return Scalar(t)
    if name == "timestamp":
        vector = ev.vector(args[0], t)
        own_times = isinstance(args[0], pp.VectorSelector)
        return [VSample(drop_name(s.metric), s.time if own_times else t, t) for s in vector]
    if name == "vector":
        return [VSample((), ev.scalar(args[0], t), t)]
    if name == "scalar":
        vector = ev.vector(args[0], t)
        return Scalar(vector[0].value if len(vector) == 1 else math.nan)
    if name == "label_replace":
        return label_replace(ev, args, t)
    if name == "label_join":
        return label_join(ev, args, t)
    if name in ("sort", "sort_desc"):
        # Order is what the query shows (and what a template's `first` takes): by value, NaN
        # at the bottom either way, as Prometheus sorts.
        sign = 1.0 if name == "sort" else -1.0
        return sorted(
            ev.vector(args[0], t),
            key=lambda s: (True, 0.0) if math.isnan(s.value) else (False, sign * s.value),
        )
    if name in ("sort_by_label", "sort_by_label_desc"):
        names = [string_arg(ev, a, t) for a in args[1:]]
        return sort_by_labels(ev.vector(args[0], t), names, name == "sort_by_label_desc")
    raise EvalError(f"function {name}() is not supported")


def _matrix(ev: Evaluator, arg: pp.Expr, t: float) -> Matrix:
    value = ev.eval(arg, t)
    if not isinstance(value, list) or (value and not isinstance(value[0], RangeSeries)):
        raise EvalError("expected a range vector")
    return value  # type: ignore[return-value]


def _range_function(ev: Evaluator, name: str, arg: pp.Expr, t: float) -> Vector:
    if isinstance(arg, pp.SubqueryExpr):
        start, end = ev.subquery_window(arg, t)
        steps = [(s.metric, s.window) for s in ev.subquery(arg, t)]
        return _over_windows(name, steps, start, end, t)
    if not isinstance(arg, pp.MatrixSelector):
        raise EvalError(f"{name}() needs a range selector")
    selection = ev.selection(arg.vector_selector)
    end = selection.time(t, ev.query_time)
    start = on_ms(end - arg.range.total_seconds())
    # The hot paths of the shipped packs read what they need of each series, no window.
    read: Callable[[SeriesView], float | None] | None = None
    if name in ("rate", "increase", "delta"):
        counter, rate = name != "delta", name == "rate"

        def read(s: SeriesView) -> float | None:
            return _extrapolated(s.counter_stats(start, end), start, end, counter, rate)
    elif name in ("irate", "idelta"):  # the last two samples
        instant = name == "irate"

        def read(s: SeriesView) -> float | None:
            return _instant_rate(s.last_two(start, end), instant, instant)

    out: Vector = []
    if read is not None:
        for series in ev.paced(selection.select(ev.querier)):
            result = read(series)
            if result is not None:
                out.append(VSample(drop_name(series.metric()), result, t))
    else:  # straight from each series' window, no range vector between
        selected = ev.paced(selection.select(ev.querier))
        pairs = ((s.metric(), s.window(start, end)) for s in selected)
        out = _over_windows(name, pairs, start, end, t)
    if not selection.one_name:
        out.sort(key=lambda sample: sample.metric)
    return out


def _over_windows(
    name: str, pairs: Iterable[tuple[Labels, Window]], start: float, end: float, t: float
) -> Vector:
    """A range function over (series, window) pairs; an empty window has no answer."""
    over_time = OVER_TIME.get(name)
    out: Vector = []
    for metric, w in pairs:
        if not len(w):
            continue
        value: float | None
        if over_time is not None:
            value = over_time(w)
        elif name in ("rate", "increase", "delta"):
            value = _extrapolated(counter_stats(w), start, end, name != "delta", name == "rate")
        elif name in ("irate", "idelta"):
            value = _instant_rate(last_two(w), name == "irate", name == "irate")
        else:  # deriv
            value = linear_regression(w, w.first()[0])[0] if len(w) > 1 else None
        if value is not None:
            out.append(VSample(drop_name(metric), value, t))
    return out


def _absent_labels(ev: Evaluator, arg: pp.Expr) -> Labels:
    selector = arg.vector_selector if isinstance(arg, pp.MatrixSelector) else arg
    if not isinstance(selector, pp.VectorSelector):
        return ()
    return ev.selection(selector).absent_labels


def _clamp_call(ev: Evaluator, name: str, args: list[pp.Expr], t: float) -> Vector:
    vector = ev.vector(args[0], t)
    if name == "clamp":
        low, high = ev.scalar(args[1], t), ev.scalar(args[2], t)
        if high < low:
            return []
    elif name == "clamp_min":
        low, high = ev.scalar(args[1], t), math.inf
    else:
        low, high = -math.inf, ev.scalar(args[1], t)
    if math.isnan(low) or math.isnan(high):
        return _map(vector, lambda v: math.nan)
    return _map(vector, lambda v: clamp(v, low, high))
