"""Where a broken expression is broken, without promtool at hand (the integration suite holds
the same places against promtool itself)."""

from __future__ import annotations

import pytest

from gpuwatch.promql import locate
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


def test_brackets_nested_past_the_parsers_stack_are_not_closed_to_find_the_place() -> None:
    """Closing thousands of open brackets would overflow promql-parser's stack (a crash of
    the daemon at a reload); the error is given without its place instead."""
    with pytest.raises(QueryError) as caught:
        parse("(x + " * 3000)
    assert str(caught.value) == "parse error: unclosed left parenthesis"


def test_the_search_for_the_place_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = locate._parses

    def counted(text: str) -> bool:
        calls.append(text)
        return real(text)

    monkeypatch.setattr(locate, "_parses", counted)
    expr = "x + " * ((locate.MAX_LOCATED_CHARS - 1) // 4)
    with pytest.raises(QueryError) as caught:
        parse(expr)
    assert 0 < len(calls) <= locate.MAX_PARSES
    assert str(caught.value).endswith("parse error: unexpected end of input")
