"""Subqueries' bounds and default step; what they compute is checked against promtool in
tests/conformance/subqueries.test.yaml."""

from __future__ import annotations

import promql_parser as pp
import pytest

from gpuwatch.promql.evaluator import MAX_SUBQUERY_STEPS, Evaluator
from gpuwatch.promql.memory import MemoryStorage
from gpuwatch.promql.parse import QueryError, parse
from gpuwatch.promql.values import EvalError


def storage() -> MemoryStorage:
    store = MemoryStorage()
    series = store.series((("__name__", "x"),))
    for i in range(100):
        series.add(i * 10.0, float(i))
    return store


def test_a_subquery_without_a_step_steps_at_the_evaluation_interval() -> None:
    for step, expected in ((60.0, 5.0), (10.0, 30.0)):
        result = Evaluator(storage(), subquery_step=step).eval(
            pp.parse("count_over_time(x[5m:])"), 900.0
        )
        assert isinstance(result, list) and result[0].value == expected  # type: ignore[union-attr]


def test_a_subquery_of_too_many_steps_is_an_error_not_a_stall() -> None:
    with pytest.raises(EvalError, match=f"at most {MAX_SUBQUERY_STEPS}"):
        Evaluator(storage()).eval(pp.parse("max_over_time(x[1d:1s])"), 900.0)


def test_nested_subqueries_are_bounded_in_all_not_only_each() -> None:
    nested = "max_over_time(max_over_time(x[10000s:1s])[10000s:1s])"
    with pytest.raises(EvalError, match="nested subqueries multiply their steps"):
        Evaluator(storage()).eval(pp.parse(nested), 900.0)


def test_an_expression_nesting_too_deep_is_refused_when_parsed() -> None:
    chain = " or ".join(f'x{{i="{i}"}}' for i in range(300))
    with pytest.raises(QueryError, match="deeper than 200 levels"):
        parse(chain)
    parse(" or ".join(f'x{{i="{i}"}}' for i in range(150)))
