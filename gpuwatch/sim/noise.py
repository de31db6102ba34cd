"""Deterministic noise for the simulated signals: the same seed gives the same node, run
after run, so tests can assert exact values."""

from __future__ import annotations

import functools
import math


def hash01(*parts: int) -> float:
    """A well-mixed value in [0, 1) from integers (splitmix64)."""
    x = 0x9E3779B97F4A7C15
    for p in parts:
        x = (x ^ (p & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        x = (x ^ (x >> 27)) * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 31
    return (x >> 11) / float(1 << 53)


def smooth_noise(seed: int, channel: int, t: float, period: float) -> float:
    """Value noise in [0, 1): random at multiples of `period`, smoothly interpolated between."""
    pos = t / period
    k = math.floor(pos)
    frac = pos - k
    w = frac * frac * (3 - 2 * frac)
    return _knot(seed, channel, k) * (1 - w) + _knot(seed, channel, k + 1) * w


@functools.lru_cache(maxsize=4096)
def _knot(seed: int, channel: int, k: int) -> float:
    """A knot of smooth_noise: each is asked for again at every reading until time passes it."""
    return hash01(seed, channel, k)
