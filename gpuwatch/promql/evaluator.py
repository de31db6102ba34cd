"""Instant evaluation of a parsed expression at one time over any store of series.

Semantics follow Prometheus 3: range selectors are left-open (start, end], the instant
lookback is (t - 5m, t], and a stale marker ends a series at once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

import promql_parser as pp

from gpuwatch.promql import aggregations, binops, functions
from gpuwatch.promql.values import (
    NAME,
    EvalError,
    Labels,
    Matrix,
    RangeSeries,
    Scalar,
    StringValue,
    Value,
    Vector,
    VSample,
)
from gpuwatch.store.series import CounterStats, LastTwo, ListWindow, Window, on_ms
from gpuwatch.text.regex import RegexError, compile_regex

DEFAULT_LOOKBACK_S = 300.0
DEFAULT_SUBQUERY_STEP_S = 60.0  # Prometheus's default global evaluation_interval
MAX_SUBQUERY_STEPS = 11_000  # Prometheus's cap on the points of one range query's series
# Inner evaluations one query may make in all: nested subqueries multiply their steps, and
# `max_over_time(max_over_time(x[3h:1s])[3h:1s])` would otherwise run for minutes.
MAX_SUBQUERY_EVALUATIONS = 100_000
MEMO_LIMIT = 100_000  # label sets an aggregation remembers in one evaluation, at most
# Series read, across selections, between two calls of the evaluator's `pace`: about a
# millisecond of `rate` at a time.
PACE_EVERY = 256


class SeriesView(Protocol):
    """What the evaluator reads from one stored series."""

    @property
    def name(self) -> str: ...
    @property
    def labels(self) -> tuple[tuple[str, str], ...]: ...
    def metric(self) -> Labels: ...
    def window(self, start: float, end: float) -> Window: ...
    def counter_stats(self, start: float, end: float) -> CounterStats | None: ...
    def last_two(self, start: float, end: float) -> LastTwo | None: ...
    def point_at(self, t: float, lookback: float) -> tuple[float, float] | None: ...


class Querier(Protocol):
    @property
    def layout(self) -> int:
        """Changes whenever a series is created or dropped."""
        ...

    def select(
        self, name: str | None, match: Callable[[SeriesView], bool] | None = None
    ) -> Iterable[SeriesView]: ...


def _matcher(m: pp.Matcher) -> Callable[[str], bool]:
    op, value = m.op, m.value
    if op == pp.MatchOp.Equal:
        return lambda v: v == value
    if op == pp.MatchOp.NotEqual:
        return lambda v: v != value
    try:  # parse() has checked it; a reload that skipped that check still fails cleanly
        pattern = compile_regex(value, dot_matches_newline=True)
    except RegexError as exc:
        raise EvalError(f"invalid regular expression {value!r}: {exc}") from None
    if op == pp.MatchOp.Re:
        return lambda v: pattern.fullmatch(v) is not None
    return lambda v: pattern.fullmatch(v) is None


def _absent_labels(selector: pp.VectorSelector) -> Labels:
    """What absent() puts on its answer, as Prometheus does: each label an equality matcher
    names, unless the same name has any other matcher too (`job="a", job=~"b"`: no job)."""
    labels: dict[str, str] = {}
    dropped: set[str] = set()
    for m in selector.matchers.matchers:
        if m.name == NAME:
            continue
        if m.op == pp.MatchOp.Equal and m.name not in labels:
            labels[m.name] = m.value
        else:
            dropped.add(m.name)
    return tuple(sorted((k, v) for k, v in labels.items() if k not in dropped))


def _distinct(value: Value) -> Value:
    """`value`, unless two of its samples have the same labels: dropping the metric name
    (`ceil({__name__=~"a|b"})`) or relabelling can leave two, and Prometheus refuses those."""
    if (
        isinstance(value, list)
        and len(value) > 1
        and isinstance(value[0], VSample)
        and len({s.metric for s in value}) < len(value)
    ):
        raise EvalError("vector cannot contain metrics with the same labelset")
    return value


class Selection:
    """A vector selector compiled once: the metric name to look up and the label tests."""

    def __init__(self, selector: pp.VectorSelector) -> None:
        self.name = selector.name
        self.offset = selector.offset.total_seconds() if selector.offset else 0.0
        # `@ t` pins the selector to a time; `@ start()` and `@ end()` to the query's time,
        # which in an instant evaluation (all a rule is) is the evaluation time, also inside
        # a subquery, whose steps run at other times.
        at = selector.at
        self.pinned = at.at.timestamp() if at is not None and at.at is not None else None
        self.query_pinned = at is not None and at.at is None
        name_tests: list[Callable[[str], bool]] = []
        label_tests: list[tuple[str, Callable[[str], bool]]] = []
        for m in selector.matchers.matchers:
            if m.name == NAME:
                if m.op == pp.MatchOp.Equal and self.name is None:
                    self.name = m.value
                else:
                    name_tests.append(_matcher(m))
            else:
                label_tests.append((m.name, _matcher(m)))
        self._name_tests = name_tests
        self._label_tests = label_tests
        self._cache: tuple[int, list[SeriesView]] | None = None
        self.absent_labels = _absent_labels(selector)

    def time(self, t: float, query_time: float | None = None) -> float:
        """The time the selector reads at when evaluated at `t` in a query at `query_time`:
        its `@`, less its offset."""
        if self.pinned is not None:
            t = self.pinned
        elif self.query_pinned and query_time is not None:
            t = query_time
        return on_ms(t - self.offset)

    def matches(self, series: SeriesView) -> bool:
        if any(not test(series.name) for test in self._name_tests):
            return False
        labels = dict(series.labels)
        return all(test(labels.get(name, "")) for name, test in self._label_tests)

    def select(self, querier: Querier) -> list[SeriesView]:
        """The matching series sorted by labels, as Prometheus's storage returns them (sums
        and means then come out bit for bit the same); recomputed only when the set of series
        has changed."""
        layout = querier.layout
        if self._cache is None or self._cache[0] != layout:
            found = sorted(querier.select(self.name, self.matches), key=lambda s: s.metric())
            self._cache = (layout, found)
        return self._cache[1]

    @property
    def one_name(self) -> bool:
        """Every series it selects has the same name, so dropping the name keeps their order."""
        return self.name is not None and not self._name_tests


class GroupMemo:
    """An aggregation's grouping function, remembered per label set for the series it met in
    its last two evaluations: series that left (ten thousand jobs that pushed once) are
    forgotten one evaluation later, not kept until the memo fills."""

    def __init__(self, group: Callable[[Labels], Labels]) -> None:
        self._group = group
        self._t: float | None = None
        self._young: dict[Labels, Labels] = {}  # met at the current evaluation time
        self._old: dict[Labels, Labels] = {}  # met at the one before

    def at(self, t: float) -> Callable[[Labels], Labels]:
        """The grouping function for an evaluation at `t`."""
        if t != self._t:
            self._t = t
            self._old, self._young = self._young, {}
        return self._key_of

    def _key_of(self, metric: Labels) -> Labels:
        result = self._young.get(metric)
        if result is None:
            result = self._old.get(metric)
            if result is None:
                result = self._group(metric)
            if len(self._young) >= MEMO_LIMIT:
                self._young.clear()
            self._young[metric] = result
        return result


class Evaluator:
    def __init__(
        self,
        querier: Querier,
        lookback: float = DEFAULT_LOOKBACK_S,
        subquery_step: float = DEFAULT_SUBQUERY_STEP_S,
        pace: Callable[[], object] | None = None,
    ) -> None:
        """`pace` is called each time selections have read PACE_EVERY more series: the
        rules engine steps aside there for a client waiting on the daemon."""
        self.querier = querier
        self.pace = pace
        self._unpaced = 0  # series read since `pace` was last called
        self.lookback = lookback
        # A subquery without a step (`x[1h:]`) steps at the global evaluation interval, as
        # Prometheus's does: the rules' default interval, a test file's evaluation_interval.
        self.subquery_step = subquery_step
        self.query_time: float | None = None  # set while a subquery's steps are evaluated
        self._evaluations_left = 0
        self._selections: dict[str, Selection] = {}
        self._aggregations: dict[str, tuple[str, GroupMemo]] = {}

    def selection(self, selector: pp.VectorSelector) -> Selection:
        # AST nodes are rebuilt on each attribute access; key by their text instead, and by
        # the offset in seconds: the text writes `offset 25ms` as `offset 0s`.
        offset = selector.offset.total_seconds() if selector.offset else 0.0
        key = f"{selector} {offset!r}"
        found = self._selections.get(key)
        if found is None:
            found = self._selections[key] = Selection(selector)
        return found

    def _aggregation(self, expr: pp.AggregateExpr) -> tuple[str, GroupMemo]:
        """The operator and the memoised grouping function of an aggregation node."""
        key = str(expr)
        found = self._aggregations.get(key)
        if found is None:
            memo = GroupMemo(aggregations.grouping(expr.modifier))
            found = self._aggregations[key] = (str(expr.op), memo)
        return found

    def eval(self, expr: pp.Expr, t: float) -> Value:
        """Evaluate `expr` at time `t` (seconds)."""
        if isinstance(expr, pp.NumberLiteral):
            return Scalar(expr.val)
        if isinstance(expr, pp.StringLiteral):
            return StringValue(expr.val)
        if isinstance(expr, pp.ParenExpr):
            return self.eval(expr.expr, t)
        if isinstance(expr, pp.VectorSelector):
            return self.vector_selector(expr, t)
        if isinstance(expr, pp.MatrixSelector):
            return self.matrix_selector(expr, t)
        if isinstance(expr, pp.SubqueryExpr):
            return self.subquery(expr, t)
        if isinstance(expr, pp.UnaryExpr):
            return _distinct(binops.negate(self.eval(expr.expr, t)))
        if isinstance(expr, pp.BinaryExpr):
            lhs, rhs = self.eval(expr.lhs, t), self.eval(expr.rhs, t)
            return _distinct(binops.evaluate(expr, lhs, rhs, t))
        if isinstance(expr, pp.AggregateExpr):
            param = self.eval(expr.param, t) if expr.param is not None else None
            op, memo = self._aggregation(expr)
            return aggregations.evaluate(op, memo.at(t), self.vector(expr.expr, t), param)
        if isinstance(expr, pp.Call):
            return _distinct(functions.call(self, expr, t))
        raise EvalError(f"unsupported expression {type(expr).__name__}")

    def vector(self, expr: pp.Expr, t: float) -> Vector:
        value = self.eval(expr, t)
        if not isinstance(value, list) or (value and not isinstance(value[0], VSample)):
            raise EvalError("expected an instant vector")
        return value  # type: ignore[return-value]

    def scalar(self, expr: pp.Expr, t: float) -> float:
        value = self.eval(expr, t)
        if not isinstance(value, Scalar):
            raise EvalError("expected a scalar")
        return value.value

    def paced(self, series: list[SeriesView]) -> Iterable[SeriesView]:
        """The series, `pace` called each time PACE_EVERY more have been read, counted
        across selections: a rule that reads 64 GPUs' series in each of its selections asks
        as often as one that reads every NVLink link at once."""
        pace = self.pace
        if pace is None:
            return series
        due = PACE_EVERY - self._unpaced  # series to read before the next call
        if len(series) < due:
            self._unpaced += len(series)
            return series
        return self._paced(series, pace, due)

    def _paced(
        self, series: list[SeriesView], pace: Callable[[], object], due: int
    ) -> Iterator[SeriesView]:
        yield from series[:due]
        for start in range(due, len(series), PACE_EVERY):
            pace()
            step = series[start : start + PACE_EVERY]
            self._unpaced = len(step)
            yield from step
        if due == len(series):  # read to the count exactly: the next read calls first
            self._unpaced = PACE_EVERY

    def vector_selector(self, selector: pp.VectorSelector, t: float) -> Vector:
        sel = self.selection(selector)
        at = sel.time(t, self.query_time)
        out: Vector = []
        for series in self.paced(sel.select(self.querier)):
            point = series.point_at(at, self.lookback)
            if point is not None:
                out.append(VSample(series.metric(), point[1], point[0]))
        return out

    def matrix_selector(self, expr: pp.MatrixSelector, t: float) -> Matrix:
        sel = self.selection(expr.vector_selector)
        end = sel.time(t, self.query_time)
        start = on_ms(end - expr.range.total_seconds())
        out: Matrix = []
        for series in self.paced(sel.select(self.querier)):
            window = series.window(start, end)
            if len(window):
                out.append(RangeSeries(series.metric(), window))
        return out

    def subquery_window(self, expr: pp.SubqueryExpr, t: float) -> tuple[float, float]:
        """The (start, end] a subquery covers at `t`: its `@` or `t`, less its offset."""
        at = expr.at
        end = t
        if at is not None and at.at is not None:
            end = at.at.timestamp()
        elif at is not None and self.query_time is not None:
            end = self.query_time  # @ start() / @ end() inside an outer subquery
        end -= expr.offset.total_seconds() if expr.offset else 0.0
        span = expr.range.total_seconds() if expr.range is not None else 0.0
        end = on_ms(end)
        return on_ms(end - span), end

    def subquery(self, expr: pp.SubqueryExpr, t: float) -> Matrix:
        """`expr[range:step]`: the inner expression evaluated at every multiple of the step
        (counted from the epoch, as Prometheus aligns them) inside (end - range, end]."""
        start_s, end_s = self.subquery_window(expr, t)
        step = round((expr.step.total_seconds() if expr.step else self.subquery_step) * 1000)
        if step <= 0:
            raise EvalError("a subquery's step must be positive")
        start, end = round(start_s * 1000), round(end_s * 1000)
        first = step * int(start / step)  # Go's integer division truncates towards zero
        if first <= start:
            first += step
        count = (end - first) // step + 1 if end >= first else 0
        if count > MAX_SUBQUERY_STEPS:
            raise EvalError(
                f"subquery of {count} steps; at most {MAX_SUBQUERY_STEPS} (widen the step)"
            )
        outermost = self.query_time is None
        if outermost:
            self.query_time, self._evaluations_left = t, MAX_SUBQUERY_EVALUATIONS
        try:
            self._evaluations_left -= count
            if self._evaluations_left < 0:
                raise EvalError(
                    f"subqueries would evaluate more than {MAX_SUBQUERY_EVALUATIONS} steps "
                    "in one evaluation (nested subqueries multiply their steps)"
                )
            return self._steps(expr, first, step, count)
        finally:
            if outermost:
                self.query_time = None

    def _steps(self, expr: pp.SubqueryExpr, first: int, step: int, count: int) -> Matrix:
        points: dict[Labels, tuple[list[float], list[float]]] = {}
        for i in range(count):
            at = (first + i * step) / 1000
            value = self.eval(expr.expr, at)
            if isinstance(value, Scalar):
                value = [VSample((), value.value, at)]
            if not isinstance(value, list) or (value and not isinstance(value[0], VSample)):
                raise EvalError("a subquery needs an instant vector inside")
            for sample in value:
                assert isinstance(sample, VSample)
                times, values = points.setdefault(sample.metric, ([], []))
                times.append(at)
                values.append(sample.value)
        return sorted(
            (RangeSeries(metric, ListWindow(*tv)) for metric, tv in points.items()),
            key=lambda s: s.metric,
        )
