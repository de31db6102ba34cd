"""What the store and the evaluator both know of a series' samples: the stale marker that
ends a series, and the window of samples a range selector reads (most functions need only
the first and last sample, the count and the counter resets, so a window answers those
without building a list of every sample). Both import it; neither imports the other for it."""

from __future__ import annotations

import math
import struct
from collections.abc import Sequence
from itertools import pairwise
from typing import Protocol

# Prometheus's stale marker: a NaN with these exact bits, written when a series ends.
STALE_NAN = struct.unpack("<d", struct.pack("<Q", 0x7FF0000000000002))[0]
_STALE_BITS = struct.pack("<d", STALE_NAN)


def is_stale_marker(value: float) -> bool:
    return math.isnan(value) and struct.pack("<d", value) == _STALE_BITS


# (samples, first time, first value, last time, last value, sum of the values before each drop)
CounterStats = tuple[int, float, float, float, float, float]
# A window's last two samples, (time, value) of the one before the last and of the last:
# what irate and idelta read.
LastTwo = tuple[float, float, float, float]


def on_ms(t: float) -> float:
    """`t` on the millisecond grid where float arithmetic has just missed it.

    Prometheus counts time in integer milliseconds; `4s - 2003ms` in float seconds is
    1.9969999999999999, and a sample at 1.997 would fall inside a window Prometheus ends just
    before it. A time within a billionth of a millisecond of the grid is put on it; real clock
    times (microseconds) are left as they are."""
    scaled = t * 1000.0
    nearest = round(scaled)
    return nearest / 1000.0 if abs(scaled - nearest) < 1e-6 else t


def counter_stats(window: Window) -> CounterStats | None:
    """What rate/increase/delta need of a window; None with fewer than two samples."""
    if len(window) < 2:
        return None
    (first_t, first_v), (last_t, last_v) = window.first(), window.last()
    return len(window), first_t, first_v, last_t, last_v, window.drops()[1]


def last_two(window: Window) -> LastTwo | None:
    """A window's last two samples; None with fewer than two."""
    if len(window) < 2:
        return None
    times, values = window.times(), window.values()
    return times[-2], values[-2], times[-1], values[-1]


class Window(Protocol):
    def __len__(self) -> int: ...
    def first(self) -> tuple[float, float]: ...
    def last(self) -> tuple[float, float]: ...
    def times(self) -> Sequence[float]: ...
    def values(self) -> Sequence[float]: ...
    def drops(self) -> tuple[int, float]:
        """(number of decreases, sum of the values just before each): counter resets."""
        ...


def count_drops(values: Sequence[float]) -> tuple[int, float]:
    count, total = 0, 0.0
    for a, b in pairwise(values):
        if b < a:
            count += 1
            total += a
    return count, total


class ListWindow:
    """A window over plain lists of times and values (no stale markers in them)."""

    __slots__ = ("_times", "_values")

    def __init__(self, times: Sequence[float], values: Sequence[float]) -> None:
        self._times = times
        self._values = values

    def __len__(self) -> int:
        return len(self._values)

    def first(self) -> tuple[float, float]:
        return self._times[0], self._values[0]

    def last(self) -> tuple[float, float]:
        return self._times[-1], self._values[-1]

    def times(self) -> Sequence[float]:
        return self._times

    def values(self) -> Sequence[float]:
        return self._values

    def drops(self) -> tuple[int, float]:
        return count_drops(self._values)
