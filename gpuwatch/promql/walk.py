"""Every node of a parsed expression, without recursion and without the parser binding's
own walk, which costs cubic time on a long `a or b or c ...` chain (36 s for 500 terms)."""

from __future__ import annotations

from collections.abc import Iterator

import promql_parser as pp

# How deep an expression may nest (parentheses, operators, function calls). The evaluator
# recurses once or twice a level; past this a hostile or generated rule would exhaust
# Python's stack. Prometheus has no such limit; no rule written by hand comes near it.
MAX_DEPTH = 200


class TooDeepError(ValueError):
    pass


def children(node: pp.Expr) -> list[pp.Expr]:
    if isinstance(node, pp.BinaryExpr):
        return [node.lhs, node.rhs]
    if isinstance(node, pp.AggregateExpr):
        return [node.expr] + ([node.param] if node.param is not None else [])
    if isinstance(node, pp.Call):
        return list(node.args)
    if isinstance(node, pp.MatrixSelector):
        return [node.vector_selector]
    if isinstance(node, pp.ParenExpr | pp.UnaryExpr | pp.SubqueryExpr):
        return [node.expr]
    return []


def nodes(expr: pp.Expr, max_depth: int = MAX_DEPTH) -> Iterator[tuple[pp.Expr, int]]:
    """(node, depth) for every node, parents first; TooDeepError past max_depth."""
    stack = [(expr, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > max_depth:
            raise TooDeepError(f"the expression nests deeper than {max_depth} levels")
        yield node, depth
        stack.extend((child, depth + 1) for child in reversed(children(node)))
