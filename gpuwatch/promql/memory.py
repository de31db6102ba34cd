"""A small in-memory series store for rule unit tests: samples at arbitrary times, gaps,
explicit stale markers, and appends from recording rules."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from math import isnan

from gpuwatch.model import Sample
from gpuwatch.promql.evaluator import SeriesView
from gpuwatch.promql.values import NAME, Labels
from gpuwatch.store.series import (
    STALE_NAN,
    CounterStats,
    LastTwo,
    ListWindow,
    counter_stats,
    is_stale_marker,
    last_two,
    on_ms,
)


class MemorySeries:
    """One series' samples in time order. Where its stale markers and counter drops are is
    kept as it grows, so a window without a stale marker is two slices and its counter
    statistics cost a lookup, not a pass over every sample."""

    __slots__ = ("_metric", "drops", "labels", "name", "stale", "times", "values")

    def __init__(self, name: str, labels: Labels) -> None:
        self.name = name
        self.labels = labels
        self._metric = tuple(sorted(((NAME, name), *labels)))
        self.times: list[float] = []
        self.values: list[float] = []
        self.stale: list[int] = []  # indices of stale markers
        self.drops: list[int] = []  # indices i where values[i] < values[i - 1]

    def add(self, t: float, value: float) -> None:
        """Append in time order; a second sample at the same time is ignored, as Prometheus does.
        `t` is on the millisecond grid already (on_ms): callers put it there once a batch."""
        times = self.times
        if times and t <= times[-1]:
            return
        if isnan(value) and is_stale_marker(value):  # NaN first: the cheap test
            self.stale.append(len(times))
        elif times and value < self.values[-1]:
            self.drops.append(len(times))
        times.append(t)
        self.values.append(value)

    def metric(self) -> Labels:
        return self._metric

    def trim(self, before: float) -> None:
        """Drop the samples at or before `before` (none a later window can read)."""
        cut = bisect_right(self.times, before)
        if not cut:
            return
        del self.times[:cut], self.values[:cut]
        self.stale = [i - cut for i in self.stale if i >= cut]
        self.drops = [i - cut for i in self.drops if i > cut]  # a drop needs the one before

    def _span(self, start: float, end: float) -> tuple[int, int, bool]:
        """The indices of (start, end] and whether a stale marker lies among them."""
        lo, hi = bisect_right(self.times, start), bisect_right(self.times, end)
        stale = self.stale
        clean = not stale or bisect_right(stale, hi - 1) == bisect_right(stale, lo - 1)
        return lo, hi, clean

    def window(self, start: float, end: float) -> ListWindow:
        times = self.times
        if not self.stale:  # the common case, inlined: most series have no stale marker
            lo, hi = bisect_right(times, start), bisect_right(times, end)
            return ListWindow(times[lo:hi], self.values[lo:hi])
        lo, hi, clean = self._span(start, end)
        if clean:
            return ListWindow(times[lo:hi], self.values[lo:hi])
        keep = [i for i in range(lo, hi) if not is_stale_marker(self.values[i])]
        return ListWindow([self.times[i] for i in keep], [self.values[i] for i in keep])

    def counter_stats(self, start: float, end: float) -> CounterStats | None:
        lo, hi, clean = self._span(start, end)
        if not clean:
            return counter_stats(self.window(start, end))
        if hi - lo < 2:
            return None
        values, drops = self.values, self.drops
        total = 0.0
        # a drop at i counts when the pair (i - 1, i) lies inside the window; summed in
        # order, as a pass over the window would
        for i in drops[bisect_right(drops, lo) : bisect_right(drops, hi - 1)]:
            total += values[i - 1]
        times = self.times
        return hi - lo, times[lo], values[lo], times[hi - 1], values[hi - 1], total

    def last_two(self, start: float, end: float) -> LastTwo | None:
        lo, hi, clean = self._span(start, end)
        if not clean:
            return last_two(self.window(start, end))
        if hi - lo < 2:
            return None
        times, values = self.times, self.values
        return times[hi - 2], values[hi - 2], times[hi - 1], values[hi - 1]

    def point_at(self, t: float, lookback: float) -> tuple[float, float] | None:
        times = self.times
        i = bisect_right(times, t) - 1
        edge = t - lookback
        # (t - lookback, t]; on_ms only where float error may have moved the edge
        if i < 0 or times[i] <= edge or (times[i] - edge < 1e-6 and times[i] <= on_ms(edge)):
            return None
        value = self.values[i]
        if isnan(value) and is_stale_marker(value):
            return None
        return times[i], value


class MemoryStorage:
    def __init__(self) -> None:
        self._series: dict[Labels, MemorySeries] = {}
        self._by_name: dict[tuple[str, Labels], MemorySeries] = {}  # (name, other labels)
        self._written: dict[str, set[MemorySeries]] = {}
        self.layout = 0

    def ingest(self, source: str, t: float, samples: Iterable[Sample]) -> None:
        """Write one batch of `source`; its series missing from the batch get a stale marker."""
        written: set[MemorySeries] = set()
        by_name = self._by_name
        t = on_ms(t)
        for name, labels, value in samples:
            series = by_name.get((name, labels))
            if series is None:
                series = self.series(tuple(sorted(((NAME, name), *labels))))
                by_name[(name, labels)] = series
            series.add(t, value)
            written.add(series)
        for series in self._written.get(source, set()) - written:
            series.add(t, STALE_NAN)
        self._written[source] = written

    def series(self, metric: Labels) -> MemorySeries:
        """The series with these labels (including __name__), created when new."""
        found = self._series.get(metric)
        if found is None:
            name = dict(metric).get(NAME, "")
            rest = tuple(pair for pair in metric if pair[0] != NAME)
            found = self._series[metric] = MemorySeries(name, rest)
            self.layout += 1
        return found

    def trim(self, before: float) -> None:
        """Drop every sample at or before `before`, and the series left with none."""
        for metric, series in list(self._series.items()):
            series.trim(before)
            if not series.times:
                del self._series[metric]
                self._by_name.pop((series.name, series.labels), None)
                for written in self._written.values():
                    written.discard(series)
                self.layout += 1

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
