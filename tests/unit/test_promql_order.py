"""sort() and sort_desc() order an instant vector by value with NaN at the bottom either way,
as Prometheus's funcSort and funcSortDesc do (promql/functions.go: a sort with NaN first,
reversed); promtool's unit tests compare samples sorted by labels, so they cannot show it."""

from __future__ import annotations

import math

import promql_parser as pp

from gpuwatch.promql.evaluator import Evaluator
from gpuwatch.promql.memory import MemoryStorage


def order(expr: str) -> list[str]:
    storage = MemoryStorage()
    for instance, value in (("a", 3.0), ("b", math.nan), ("c", -1.0), ("d", 2.0), ("e", 10.0)):
        storage.series((("__name__", "x"), ("instance", instance))).add(0.0, value)
    result = Evaluator(storage).eval(pp.parse(expr), 0.0)
    assert isinstance(result, list)
    return [dict(s.metric)["instance"] for s in result]  # type: ignore[union-attr]


def test_sort_puts_the_lowest_first_and_nan_last() -> None:
    assert order("sort(x)") == ["c", "d", "a", "e", "b"]


def test_sort_desc_puts_the_highest_first_and_nan_last() -> None:
    assert order("sort_desc(x)") == ["e", "a", "d", "c", "b"]
