"""Parsing an expression and checking it against the subset gpuwatch evaluates.

Anything outside the subset is rejected when a rule file loads, with the construct named,
so a rule never fails for the first time at 3 a.m.
"""

from __future__ import annotations

import promql_parser as pp

from gpuwatch.promql.locate import located
from gpuwatch.promql.walk import TooDeepError, nodes
from gpuwatch.text.regex import RegexError, compile_regex

AGGREGATIONS = frozenset(
    {
        "sum",
        "avg",
        "min",
        "max",
        "count",
        "stddev",
        "stdvar",
        "group",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "limitk",
        "limit_ratio",
    }
)
FUNCTIONS = frozenset(
    {
        "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets",
        "absent", "absent_over_time", "present_over_time",
        "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
        "last_over_time", "stddev_over_time", "stdvar_over_time", "quantile_over_time",
        "predict_linear", "abs", "ceil", "floor", "round", "sqrt", "exp", "ln", "sgn",
        "clamp", "clamp_min", "clamp_max", "time", "timestamp", "vector", "scalar",
        "label_replace", "label_join", "sort", "sort_desc", "sort_by_label", "sort_by_label_desc",
        "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh",
        "asinh", "acosh", "atanh", "deg", "rad", "pi",
        "minute", "hour", "day_of_week", "day_of_month", "day_of_year", "days_in_month",
        "month", "year", "histogram_quantile",
    }
)  # fmt: skip


class QueryError(ValueError):
    """An expression that does not parse or uses a construct outside the subset."""


def parse(text: str) -> pp.Expr:
    """Parse `text` and check it against the subset. Raises QueryError naming the problem."""
    try:
        expr = pp.parse(text)
    except ValueError as exc:
        raise QueryError(located(text, str(exc))) from None
    problems: list[str] = []
    try:
        for node, _ in nodes(expr):
            if not _check(node, problems):
                break
    except TooDeepError as exc:
        raise QueryError(str(exc)) from None
    if problems:
        if problems[0].startswith("regular expression"):
            raise QueryError(f"invalid {problems[0]}")
        raise QueryError(f"unsupported in gpuwatch's PromQL subset: {problems[0]}")
    return expr


def _check(node: pp.Expr, problems: list[str]) -> bool:
    if isinstance(node, pp.VectorSelector):
        for m in node.matchers.matchers:
            if m.op in (pp.MatchOp.Re, pp.MatchOp.NotRe):
                try:
                    compile_regex(m.value, dot_matches_newline=True)
                except RegexError as exc:
                    problems.append(f"regular expression {m.value!r} ({exc}; RE2 syntax)")
    elif isinstance(node, pp.AggregateExpr) and str(node.op) not in AGGREGATIONS:
        problems.append(f"aggregation {node.op}")
    elif isinstance(node, pp.Call) and node.func.name not in FUNCTIONS:
        problems.append(f"function {node.func.name}()")
    elif isinstance(node, pp.BinaryExpr) and node.modifier is not None:
        fill = node.modifier.fill_values
        if fill is not None and (fill.lhs is not None or fill.rhs is not None):
            problems.append("fill modifiers")
    return not problems
