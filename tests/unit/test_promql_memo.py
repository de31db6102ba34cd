"""An aggregation's grouping memo holds the label sets of the series that exist, not of every
series that ever passed through it."""

from __future__ import annotations

from gpuwatch.model import Labels
from gpuwatch.promql.evaluator import GroupMemo


def test_a_series_not_met_for_a_whole_evaluation_is_forgotten() -> None:
    grouped: list[Labels] = []

    def by_job(metric: Labels) -> Labels:
        grouped.append(metric)
        return tuple((k, v) for k, v in metric if k == "job")

    memo = GroupMemo(by_job)
    a = (("job", "a"), ("rank", "0"))
    b = (("job", "b"), ("rank", "0"))
    key = memo.at(1.0)
    assert key(a) == (("job", "a"),) and key(b) == (("job", "b"),) and key(a) == (("job", "a"),)
    assert grouped == [a, b]  # each label set grouped once
    key = memo.at(2.0)
    assert key(a) == (("job", "a"),)  # b has gone (its job ended)
    assert grouped == [a, b]
    key = memo.at(3.0)
    key(a)
    key(b)  # met again after a whole evaluation without it: grouped anew
    assert grouped == [a, b, b]
