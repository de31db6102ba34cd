"""A small in-memory series store for rule unit tests: samples at arbitrary times, gaps,
explicit stale markers, and appends from recording rules."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator

from gpuwatch.model import Sample
from gpuwatch.promql.evaluator import SeriesView
from gpuwatch.promql.values import NAME, Labels
from gpuwatch.promql.window import CounterStats, ListWindow, counter_stats
from gpuwatch.store import STALE_NAN, is_stale_marker


class MemorySeries:
    __slots__ = ("labels", "name", "times", "values")

    def __init__(self, name: str, labels: Labels) -> None:
        self.name = name
        self.labels = labels
        self.times: list[float] = []
        self.values: list[float] = []

    def add(self, t: float, value: float) -> None:
        """Append in time order; a second sample at the same time is ignored, as Prometheus does."""
        if self.times and t <= self.times[-1]:
            return
        self.times.append(t)
        self.values.append(value)

    def metric(self) -> Labels:
        return tuple(sorted(((NAME, self.name), *self.labels)))

    def window(self, start: float, end: float) -> ListWindow:
        lo, hi = bisect_right(self.times, start), bisect_right(self.times, end)
        keep = [i for i in range(lo, hi) if not is_stale_marker(self.values[i])]
        return ListWindow([self.times[i] for i in keep], [self.values[i] for i in keep])

    def counter_stats(self, start: float, end: float) -> CounterStats | None:
        return counter_stats(self.window(start, end))

    def point_at(self, t: float, lookback: float) -> tuple[float, float] | None:
        i = bisect_right(self.times, t) - 1
        if i < 0 or self.times[i] <= t - lookback or is_stale_marker(self.values[i]):
            return None
        return self.times[i], self.values[i]


class MemoryStorage:
    def __init__(self) -> None:
        self._series: dict[Labels, MemorySeries] = {}
        self._written: dict[str, set[Labels]] = {}
        self.layout = 0

    def ingest(self, source: str, t: float, samples: Iterable[Sample]) -> None:
        """Write one batch of `source`; its series missing from the batch get a stale marker."""
        written: set[Labels] = set()
        for name, labels, value in samples:
            metric = tuple(sorted(((NAME, name), *labels)))
            self.series(metric).add(t, value)
            written.add(metric)
        for metric in self._written.get(source, set()) - written:
            self.series(metric).add(t, STALE_NAN)
        self._written[source] = written

    def series(self, metric: Labels) -> MemorySeries:
        """The series with these labels (including __name__), created when new."""
        found = self._series.get(metric)
        if found is None:
            name = dict(metric).get(NAME, "")
            rest = tuple((k, v) for k, v in metric if k != NAME)
            found = self._series[metric] = MemorySeries(name, rest)
            self.layout += 1
        return found

    def __iter__(self) -> Iterator[MemorySeries]:
        return iter(self._series.values())

    def select(
        self, name: str | None, match: Callable[[SeriesView], bool] | None = None
    ) -> list[MemorySeries]:
        return [
            s
            for s in self._series.values()
            if (name is None or s.name == name) and (match is None or match(s))
        ]
