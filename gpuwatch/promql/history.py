"""How far back in time evaluating an expression reads: what the store must keep for it."""

from __future__ import annotations

import promql_parser as pp


def _seconds(delta: object) -> float:
    return float(delta.total_seconds()) if delta is not None else 0.0  # type: ignore[attr-defined]


def history_needed(expr: pp.Expr, lookback: float) -> float:
    """Seconds before the evaluation time that `expr` reads: a range selector's range plus its
    offset, an instant selector's lookback plus its offset, a subquery's range and offset
    plus what its inner expression reads."""
    if isinstance(expr, pp.VectorSelector):
        return lookback + _seconds(expr.offset)
    if isinstance(expr, pp.MatrixSelector):
        return _seconds(expr.range) + _seconds(expr.vector_selector.offset)
    if isinstance(expr, pp.SubqueryExpr):
        inner = history_needed(expr.expr, lookback)
        return _seconds(expr.range) + _seconds(expr.offset) + inner
    if isinstance(expr, pp.BinaryExpr):
        return max(history_needed(expr.lhs, lookback), history_needed(expr.rhs, lookback))
    if isinstance(expr, pp.Call):
        return max((history_needed(a, lookback) for a in expr.args), default=0.0)
    if isinstance(expr, pp.AggregateExpr):
        param = history_needed(expr.param, lookback) if expr.param is not None else 0.0
        return max(history_needed(expr.expr, lookback), param)
    if isinstance(expr, pp.ParenExpr | pp.UnaryExpr):
        return history_needed(expr.expr, lookback)
    return 0.0
