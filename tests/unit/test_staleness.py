"""Prometheus's stale markers put back from each target's `up`: at the first scrape a series
missed, and at a failed one; never on a series that is not scraped."""

from __future__ import annotations

from gpuwatch.rules.staleness import Scrapes
from gpuwatch.store.series import is_stale_marker

TARGET = ("gpuwatch", "n1:10040")
A = (("__name__", "a"), ("instance", "n1:10040"), ("job", "gpuwatch"))
B = (("__name__", "b"), ("instance", "n1:10040"), ("job", "gpuwatch"))
RECORDED = (("__name__", "x:rate"), ("instance", "n1:10040"), ("job", "gpuwatch"))


def stale_at(points: list[tuple[int, float]]) -> list[int]:
    return [t for t, v in points if is_stale_marker(v)]


def test_a_series_missing_from_a_scrape_is_stale_there_and_at_a_failed_scrape() -> None:
    scrapes = Scrapes()
    chunk = {
        A: [(0, 1.0), (5000, 1.0), (15000, 1.0)],  # missing from the scrape at 10 s
        B: [(0, 2.0), (5000, 2.0), (10000, 2.0)],  # the scrape at 15 s failed for it too
        RECORDED: [(2500, 0.5), (7500, 0.5)],  # a rule's output: not on the scrapes
    }
    scrapes.mark(chunk, {TARGET: [0, 5000, 10000, 15000]})
    assert stale_at(chunk[A]) == [10000]
    assert stale_at(chunk[B]) == [15000]
    assert stale_at(chunk[RECORDED]) == []
    assert [t for t, _ in chunk[A]] == [0, 5000, 10000, 15000]  # in time order


def test_a_series_gone_at_a_chunks_edge_is_stale_at_the_next_chunks_first_scrape() -> None:
    scrapes = Scrapes()
    first = {A: [(0, 1.0), (5000, 1.0)], B: [(0, 2.0), (5000, 2.0)]}
    scrapes.mark(first, {TARGET: [0, 5000]})
    second = {B: [(10000, 2.0)]}
    scrapes.mark(second, {TARGET: [10000, 15000]})
    assert stale_at(second[A]) == [10000]  # read in no selector of the second chunk at all
    assert stale_at(second[B]) == [15000]
    assert scrapes.marked == 2


def test_without_up_nothing_is_marked() -> None:
    chunk = {A: [(0, 1.0), (10000, 1.0)]}
    Scrapes().mark(chunk, {})
    assert stale_at(chunk[A]) == []
