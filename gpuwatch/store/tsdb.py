"""In-memory time series: per-series ring buffers with a retention window and staleness.

Each source's batches share one timeline of timestamps, so a series stores only its values.
Values are kept in runs: a run holds consecutive batch indices of one series, as a single
number while it stays constant (most error counters, limits and link states) and as an array
of doubles once it varies. Varying runs are capped, so retention frees memory run by run;
a constant run holds no per-sample data and grows as long as its value holds. A varying run
older than anything the rules read back is packed (gpuwatch.store.packing): an hour of NVML's
data takes 40% less (the NVLink byte counters shrink least), and rule evaluation reads only
plain runs.

A series missing from its source's next batch gets a stale marker at that batch's time, as
Prometheus does: it stops appearing in instant lookups from then on, and history shows a gap.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from time import perf_counter

from gpuwatch.model import Labels, Sample
from gpuwatch.store.runs import DEFAULT_LOOKBACK_S, Series, Timeline, _Run
from gpuwatch.store.series import STALE_NAN

TRIM_EVERY_S = 60.0  # data time between retention sweeps (a sweep visits every series)
PACK_AFTER_S = 300.0  # runs older than this, and than the rules read back, are packed
PACK_PER_INGEST = 4  # runs packed after each batch, at most
PACK_BUDGET_S = 0.001  # and no more once this much time has gone to packing

SeriesKey = tuple[str, Labels]


class Store:
    def __init__(self, retention: float, pack_after: float = PACK_AFTER_S) -> None:
        self.retention = retention
        self.pack_after = pack_after
        # How far back the rules read each name, and any name (a selector without one): a
        # name is kept that long when it is longer than `retention`, and runs within that
        # reach stay plain, so that evaluating a rule never unpacks one.
        self.read_back_by_name: dict[str, float] = {}
        self.read_back_any = 0.0
        self._timelines: dict[str, Timeline] = {}
        self._series: dict[SeriesKey, Series] = {}
        self._by_name: dict[str, dict[SeriesKey, Series]] = {}
        self._current: dict[str, list[Series]] = {}  # by source: its last batch's series
        self._next_trim = -math.inf
        # Runs the last sweep found to pack, with their series, packed a few per batch so
        # that no one batch (and no scrape waiting behind it on the event loop) pays for a
        # whole sweep's.
        self._to_pack: deque[tuple[Series, _Run]] = deque()
        self.generation = 0  # bumps on every ingest; lets readers cache per cycle
        self.layout = 0  # bumps when a series is created or dropped; lets selections cache

    def __len__(self) -> int:
        return len(self._series)

    def ingest(self, source: str, time: float, samples: Sequence[Sample]) -> None:
        """Append one batch of `source`; its series absent from this batch become stale."""
        previous = self._current.get(source, [])
        if not samples and not previous:
            # Nothing now and nothing before (an alert rule with no alert, most cycles): no
            # series to extend or mark stale, and no timestamp worth keeping.
            return
        timeline = self._timelines.get(source)
        if timeline is None:
            timeline = self._timelines[source] = Timeline()
        index = timeline.append(time)
        seen: list[Series] = []
        series_map = self._series
        # A source sends its series in the same order cycle after cycle: the series at the
        # same place in its last batch is most often this sample's, and comparing the labels
        # costs less than hashing them.
        places = len(previous)
        for place, (name, labels, value) in enumerate(samples):
            if place < places:
                there = previous[place]
                if there.name == name and there.labels == labels:
                    there.append(index, time, value)
                    seen.append(there)
                    continue
            key = (name, labels)
            series = series_map.get(key)
            if series is None:
                series = series_map[key] = Series(name, labels, timeline)
                self._by_name.setdefault(name, {})[key] = series
                self.layout += 1
            series.append(index, time, value)
            seen.append(series)
        # What the source's last batch had and this one has not: its last index is older.
        for gone in previous:
            if gone.last_index != index and not gone.stale:
                gone.append(index, time, STALE_NAN)
        self._current[source] = seen
        self.generation += 1
        if time >= self._next_trim:
            self._next_trim = time + TRIM_EVERY_S
            self._trim(time)
        if self._to_pack:
            self._pack_some()

    def _pack_some(self) -> None:
        queue = self._to_pack
        deadline = perf_counter() + PACK_BUDGET_S
        for _ in range(PACK_PER_INGEST):
            if not queue:
                return
            _, run = queue.popleft()
            run.pack()
            if perf_counter() > deadline:
                return

    def pack_waiting(self) -> None:
        """Pack every run waiting to be. A daemon's dozens of batches a second pack them as
        they close; a caller that ingests one batch a second (a bench) would carry the
        queue, and pay for it in every batch it times."""
        while self._to_pack:
            self._to_pack.popleft()[1].pack()

    def _trim(self, now: float) -> None:
        longest = max(self.retention, *self.read_back_by_name.values(), 0.0)
        for timeline in self._timelines.values():
            timeline.trim(now - longest)  # timestamps are shared: kept for the longest
        first: dict[tuple[int, float], int] = {}  # (timeline, age) -> first index not older

        def since(tl: Timeline, age: float) -> int:
            index = first.get((id(tl), age))
            if index is None:
                index = first[(id(tl), age)] = tl.first + bisect_left(tl.times, now - age)
            return index

        plain = max(self.pack_after, self.read_back_any)
        pack = self._to_pack.extend if not self._to_pack else None  # not twice while queued
        dropped = 0
        for key, series in list(self._series.items()):
            reach = self.read_back_by_name.get(series.name, 0.0)
            series.trim(since(series.timeline, max(self.retention, reach)))
            if pack is not None:
                hot = max(plain, reach)
                pack((series, run) for run in series.unpacked_before(since(series.timeline, hot)))
            if not series.runs:
                self.layout += 1
                del self._series[key]
                family = self._by_name[series.name]
                del family[key]
                if not family:
                    del self._by_name[series.name]
                dropped += 1
        if pack is None:  # what this sweep trimmed away is neither packed nor kept for it
            self._to_pack = deque(
                (s, run) for s, run in self._to_pack if s.runs and run.start >= s.runs[0].start
            )
        if dropped:  # a source's last batch must not lead its next one to a series dropped
            self._current = {
                source: [s for s in batch if s.runs] for source, batch in self._current.items()
            }
        if dropped > len(self._series):
            # Most series went at once (10,000 pushed jobs stale): a dict keeps its largest
            # table for good, so the tables are rebuilt to the size of what is left.
            self._series = dict(self._series)
            self._by_name = {name: dict(family) for name, family in self._by_name.items()}

    def has(self, name: str) -> bool:
        """Whether a series of that name is held: one dict lookup, safe from another thread
        while the event loop ingests (select's iteration is not)."""
        return name in self._by_name

    def select(
        self, name: str | None, match: Callable[[Series], bool] | None = None
    ) -> list[Series]:
        """Series named `name` (any name when None) for which `match` holds."""
        if name is None:
            families: Iterable[dict[SeriesKey, Series]] = self._by_name.values()
        else:
            families = (self._by_name.get(name, {}),)
        return [s for f in families for s in f.values() if match is None or match(s)]

    def latest(self, now: float, lookback: float = DEFAULT_LOOKBACK_S) -> Iterator[Series]:
        """Series with a current value: not stale, last sample within the lookback."""
        oldest = now - lookback
        for family in self._by_name.values():
            for series in family.values():
                if not series.stale and series.last_time > oldest:
                    yield series
