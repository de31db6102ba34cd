"""Freed memory handed back once a minute of the daemon's clock, where the C library can."""

from __future__ import annotations

import platform

import pytest

from gpuwatch.heap import HeapTrim, malloc_trim


def test_the_trim_runs_once_a_minute_after_the_first() -> None:
    trims: list[float] = []
    now = [1000.0]
    heap = HeapTrim(lambda: trims.append(now[0]), every=60.0)
    for second in range(200):
        now[0] = 1000.0 + second
        heap.after_cycle(now[0], None)
    assert trims == [1060.0, 1120.0, 1180.0]


def test_glibc_has_it() -> None:
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc")
    trim = malloc_trim()
    assert trim is not None
    assert trim() in (0, 1)  # 1: memory was released
