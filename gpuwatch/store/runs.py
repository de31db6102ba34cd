"""A series' values over time: one timeline of timestamps per source, and per series its
runs, each a constant, an array of doubles, or (once rules no longer read it) those doubles
packed (gpuwatch.store.tsdb says why)."""

from __future__ import annotations

import logging
import math
import struct
from array import array
from bisect import bisect_left, bisect_right
from collections.abc import Iterator

from gpuwatch.model import Labels
from gpuwatch.store.packing import pack, unpack
from gpuwatch.store.series import CounterStats, LastTwo, count_drops, is_stale_marker

log = logging.getLogger(__name__)

RUN_CAPACITY = 512  # samples in one varying run
RUN_SPAN_S = 600.0  # and seconds: a series read every 5 s still closes runs to be packed
CONST_RUN_MIN = 16  # a constant run this long is kept as is when the value changes
DEFAULT_LOOKBACK_S = 300.0  # Prometheus's default lookback delta


def _same(a: float, b: float) -> bool:
    """Equal, treating NaNs with the same bits (a NaN loss, the stale marker) as equal."""
    return a == b or (math.isnan(a) and struct.pack("<d", a) == struct.pack("<d", b))


class Timeline:
    """Timestamps of one source's batches; batch i is at times[i - first]."""

    __slots__ = ("first", "times")

    def __init__(self) -> None:
        self.times = array("d")
        self.first = 0

    def append(self, t: float) -> int:
        self.times.append(t)
        return self.first + len(self.times) - 1

    def time(self, index: int) -> float:
        return self.times[index - self.first]

    def span(self, start: float, end: float) -> tuple[int, int]:
        """The indices [lo, hi) of the times in (start, end]."""
        times, first = self.times, self.first
        return first + bisect_right(times, start), first + bisect_right(times, end)

    def index_after(self, t: float) -> int:
        """The first index whose time is > t."""
        return self.first + bisect_right(self.times, t)

    def trim(self, before: float) -> None:
        k = bisect_left(self.times, before)
        if k:
            del self.times[:k]
            self.first += k


class _Run:
    __slots__ = ("const", "count", "drops", "packed", "stale", "start", "tried", "until", "values")

    def __init__(self, start: int, time: float, value: float, stale: bool = False) -> None:
        self.start = start
        self.until = time + RUN_SPAN_S  # a varying run takes no samples from then on
        self.count = 1
        self.const = value
        self.values: array[float] | None = None
        self.packed: bytes | None = None  # the values, packed (then `values` is None)
        self.tried = False  # packing was tried: a run it would not shrink is not tried again
        self.drops = False  # a value below its predecessor inside the run (a counter reset)
        self.stale = stale  # a stale marker: always a run of its own

    @property
    def end(self) -> int:
        return self.start + self.count

    def array(self) -> array[float] | None:
        """The values, None for a constant run. Safe while the store's sweep packs this run on
        another thread: `pack` sets `packed` before it drops `values`."""
        values = self.values
        if values is not None:
            return values
        packed = self.packed
        return None if packed is None else unpack(packed)

    def value(self, index: int) -> float:
        values = self.array()
        return self.const if values is None else values[index - self.start]

    def pack(self) -> None:
        """Pack a closed run's values (no-op for a constant run or one that would not shrink)."""
        values = self.values
        if values is None or self.tried:
            return
        self.tried = True
        try:
            packed = pack(values)
        except Exception:  # a bug in packing costs this run its packing, never an ingest
            log.exception("packing a run of %d values failed; it stays as it is", len(values))
            return
        if packed is not None:
            self.packed = packed
            self.values = None


class Series:
    __slots__ = (
        "_metric",
        "labels",
        "last_index",
        "last_time",
        "last_value",
        "name",
        "runs",
        "stale",
        "timeline",
    )

    def __init__(self, name: str, labels: Labels, timeline: Timeline) -> None:
        self.name = name
        self.labels = labels
        self.timeline = timeline
        self.runs: list[_Run] = []
        self.last_index = -1
        self.last_time = math.nan
        self.last_value = math.nan
        self.stale = False
        self._metric: Labels | None = None

    @property
    def label_dict(self) -> dict[str, str]:
        return dict(self.labels)

    def metric(self) -> Labels:
        """Name and labels sorted, as PromQL sees the series (computed once)."""
        if self._metric is None:
            self._metric = tuple(sorted((("__name__", self.name), *self.labels)))
        return self._metric

    def append(self, index: int, time: float, value: float) -> None:
        if index == self.last_index:
            return  # a duplicate within one batch: the first value stands
        self.last_index, self.last_time, self.last_value = index, time, value
        # Every series, every cycle: the common case (a number, a run going on with the same
        # value) is written out here rather than through the helpers it would call.
        stale = self.stale = value != value and is_stale_marker(value)  # noqa: PLR0124 (NaN)
        runs = self.runs
        run = runs[-1] if runs else None
        if stale or run is None or run.stale or run.start + run.count != index:
            runs.append(_Run(index, time, value, stale))
            return
        if run.values is None:
            if value == run.const or _same(value, run.const):
                run.count += 1  # a constant run costs nothing per sample: no cap
                return
            if run.count >= CONST_RUN_MIN:
                self.runs.append(_Run(index, time, value))
                return
            run.values = array("d", [run.const]) * run.count
        elif run.count >= RUN_CAPACITY or time >= run.until:
            self.runs.append(_Run(index, time, value))
            return
        if value < run.values[-1]:
            run.drops = True
        run.values.append(value)
        run.count += 1

    def trim(self, first_index: int) -> None:
        k = 0
        while k < len(self.runs) and self.runs[k].end <= first_index:
            k += 1
        if k:
            del self.runs[:k]

    def unpacked_before(self, index: int) -> Iterator[_Run]:
        """The plain varying runs that end before `index`, but the newest (still written)."""
        for run in self.runs[:-1]:
            if run.end > index:
                break
            if run.values is not None and not run.tried:
                yield run

    def _parts(self, lo: int, hi: int) -> Iterator[tuple[_Run, int, int]]:
        """(run, first index, end index) of each non-stale run overlapping [lo, hi), clipped."""
        if hi <= lo:
            return
        runs = self.runs
        i = len(runs) - 1
        while i > 0 and runs[i].start > lo:  # windows end near the newest run: walk back
            i -= 1
        for run in runs[i:] if i else runs:
            start = run.start
            if start >= hi:
                break
            a = max(lo, start)
            b = min(start + run.count, hi)
            if a < b and not run.stale:
                yield run, a, b

    def window(self, start: float, end: float) -> RunWindow:
        """The samples with start < time <= end (left-open, as Prometheus 3), stale markers out."""
        tl = self.timeline
        lo, hi = tl.span(start, end)
        parts = list(self._parts(lo, hi))
        length = sum(b - a for _, a, b in parts)
        return RunWindow(tl, parts, length)

    def counter_stats(self, start: float, end: float) -> CounterStats | None:
        """series.counter_stats of (start, end], in one pass without building a window."""
        tl = self.timeline
        times, base = tl.times, tl.first
        lo, hi = tl.span(start, end)
        if hi - lo < 2:
            return None
        last_run = self.runs[-1]
        # Most error counters: one constant run covering the window.
        flat = last_run.values is None and last_run.packed is None and not last_run.stale
        if flat and last_run.start <= lo and last_run.start + last_run.count >= hi:
            c = last_run.const
            return hi - lo, times[lo - base], c, times[hi - 1 - base], c, 0.0
        n = 0
        first_t = first_v = last_t = last_v = 0.0
        drops = 0.0
        for run, a, b in self._parts(lo, hi):
            s = run.start
            values = run.array()
            head = run.const if values is None else values[a - s]
            if n == 0:
                first_t, first_v = times[a - base], head
            elif head < last_v:
                drops += last_v
            if run.drops and values is not None:
                drops += count_drops(values[a - s : b - s])[1]
            last_t = times[b - 1 - base]
            last_v = run.const if values is None else values[b - 1 - s]
            n += b - a
        if n < 2:
            return None
        return n, first_t, first_v, last_t, last_v, drops

    def last_two(self, start: float, end: float) -> LastTwo | None:
        """The last two samples with start < time <= end, stale markers out, read from the
        runs they lie in, newest first: irate over thousands of per-link counters builds no
        window."""
        tl = self.timeline
        times, base = tl.times, tl.first
        lo, hi = tl.span(start, end)
        if hi - lo < 2:
            return None
        found: list[tuple[int, float]] = []  # (index, value), the newest first
        for run in reversed(self.runs):
            s = run.start
            if s >= hi:
                continue
            if s + run.count <= lo:
                break
            if run.stale:
                continue
            b = min(s + run.count, hi)
            values = run.array()
            for index in range(b - 1, max(lo, s, b - 2 + len(found)) - 1, -1):
                found.append((index, run.const if values is None else values[index - s]))
            if len(found) == 2:
                (last, last_v), (before, before_v) = found
                return times[before - base], before_v, times[last - base], last_v
        return None

    def samples(self, start: float, end: float) -> list[tuple[float, float]]:
        """(time, value) pairs with start < time <= end, without stale markers."""
        w = self.window(start, end)
        return list(zip(w.times(), w.values(), strict=True))

    def point_at(
        self, t: float, lookback: float = DEFAULT_LOOKBACK_S
    ) -> tuple[float, float] | None:
        """The instant (time, value) at t: the newest sample in (t - lookback, t], unless stale."""
        last = self.last_time
        if t - lookback < last <= t:  # the usual case: evaluating at the newest batch
            point = (last, self.last_value)
        else:
            tl = self.timeline
            lo, hi = tl.index_after(t - lookback), tl.index_after(t)
            i = bisect_right(self.runs, hi - 1, key=lambda r: r.start) - 1
            if i < 0:
                return None
            run = self.runs[i]
            index = min(hi, run.end) - 1
            if index < max(lo, tl.first):
                return None
            point = (tl.time(index), run.value(index))
        return None if is_stale_marker(point[1]) else point

    def value_at(self, t: float, lookback: float = DEFAULT_LOOKBACK_S) -> float | None:
        point = self.point_at(t, lookback)
        return None if point is None else point[1]


class RunWindow:
    """A range selector's window over a series' runs (see gpuwatch.store.series.Window)."""

    __slots__ = ("_length", "_parts", "_timeline")

    def __init__(self, timeline: Timeline, parts: list[tuple[_Run, int, int]], length: int) -> None:
        self._timeline = timeline
        self._parts = parts
        self._length = length

    def __len__(self) -> int:
        return self._length

    def first(self) -> tuple[float, float]:
        run, a, _ = self._parts[0]
        return self._timeline.time(a), run.value(a)

    def last(self) -> tuple[float, float]:
        run, _, b = self._parts[-1]
        return self._timeline.time(b - 1), run.value(b - 1)

    def times(self) -> list[float]:
        tl = self._timeline
        out: list[float] = []
        for _, a, b in self._parts:
            out.extend(tl.times[a - tl.first : b - tl.first])
        return out

    def values(self) -> list[float]:
        out: list[float] = []
        for run, a, b in self._parts:
            values = run.array()
            if values is None:
                out.extend([run.const] * (b - a))
            else:
                out.extend(values[a - run.start : b - run.start])
        return out

    def drops(self) -> tuple[int, float]:
        count, total = 0, 0.0
        previous: float | None = None
        for run, a, b in self._parts:
            values = run.array()  # once: a packed run is unpacked for each call
            s = run.start
            first = run.const if values is None else values[a - s]
            if previous is not None and first < previous:
                count, total = count + 1, total + previous
            if run.drops and values is not None:
                n, dropped = count_drops(values[a - s : b - s])
                count, total = count + n, total + dropped
            previous = run.const if values is None else values[b - 1 - s]
        return count, total
