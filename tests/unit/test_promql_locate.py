"""Where a broken expression is broken, without promtool at hand (the integration suite holds
the same places against promtool itself)."""

from __future__ import annotations

import pytest

from gpuwatch.promql.locate import MAX_LOCATED_CHARS
from gpuwatch.promql.parse import QueryError, parse


@pytest.mark.parametrize(
    ("expr", "said"),
    [
        ("gpuwatch_gpu_temperature_celsius > 85 and", "1:42: parse error: unexpected end of input"),
        ("foo bar", '1:5: parse error: unexpected identifier "bar"'),
        ("rate(x[5m])\n  > foo bar\n", '2:9: parse error: unexpected identifier "bar"'),
        ("foo)", "1:5: parse error: unexpected right parenthesis ')'"),
        ("sum by (gpu (x)", '1:13: parse error: unexpected "("'),
        ("rate(foo[5m]", "1:13: parse error: unclosed left parenthesis"),
        ("nosuchfn(x)", "1:1: parse error: unknown function with name 'nosuchfn'"),
        (
            "sum(x[5m])",
            "1:5: parse error: expected type vector in aggregation expression, got matrix",
        ),
    ],
)
def test_the_error_says_line_and_column_in_the_expression(expr: str, said: str) -> None:
    with pytest.raises(QueryError) as caught:
        parse(expr)
    assert str(caught.value) == said


def test_an_expression_too_long_to_place_still_says_what_is_wrong() -> None:
    expr = "x + " * (MAX_LOCATED_CHARS // 4 + 1)
    with pytest.raises(QueryError) as caught:
        parse(expr)
    assert str(caught.value) == "parse error: invalid promql query"
