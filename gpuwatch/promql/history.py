"""How far back in time evaluating an expression reads: what the store must keep for it."""

from __future__ import annotations

import promql_parser as pp


def _seconds(delta: object) -> float:
    return float(delta.total_seconds()) if delta is not None else 0.0  # type: ignore[attr-defined]


def history_needed(expr: pp.Expr, lookback: float) -> dict[str | None, float]:
    """Seconds before the evaluation time that `expr` reads, per metric name (None for a
    selector without a plain name): a range selector's range plus its offset, an instant
    selector's lookback plus its offset, inside a subquery plus the subquery's range and
    offset."""
    out: dict[str | None, float] = {}
    _walk(expr, lookback, 0.0, out)
    return out


def _note(out: dict[str | None, float], name: str | None, reach: float) -> None:
    key = name or None
    out[key] = max(out.get(key, 0.0), reach)


def _walk(expr: pp.Expr, lookback: float, extra: float, out: dict[str | None, float]) -> None:
    if isinstance(expr, pp.VectorSelector):
        _note(out, expr.name, extra + lookback + _seconds(expr.offset))
    elif isinstance(expr, pp.MatrixSelector):
        selector = expr.vector_selector
        _note(out, selector.name, extra + _seconds(expr.range) + _seconds(selector.offset))
    elif isinstance(expr, pp.SubqueryExpr):
        _walk(expr.expr, lookback, extra + _seconds(expr.range) + _seconds(expr.offset), out)
    elif isinstance(expr, pp.BinaryExpr):
        _walk(expr.lhs, lookback, extra, out)
        _walk(expr.rhs, lookback, extra, out)
    elif isinstance(expr, pp.Call):
        for arg in expr.args:
            _walk(arg, lookback, extra, out)
    elif isinstance(expr, pp.AggregateExpr):
        _walk(expr.expr, lookback, extra, out)
        if expr.param is not None:
            _walk(expr.param, lookback, extra, out)
    elif isinstance(expr, pp.ParenExpr | pp.UnaryExpr):
        _walk(expr.expr, lookback, extra, out)
