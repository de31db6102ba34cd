"""Garbage-collector settings for gpuwatch's long-running processes (the daemon, the dashboard).

Both make tens of thousands of short-lived objects a second (a cycle's samples; a fleet
refresh's JSON). At Python's default threshold (a young collection every 700 allocations) those
objects are promoted to the oldest generation before they die, and full collections, which
scan every long-lived object (the store, the rules, the widgets), follow every second or two:
at 64 GPUs and 10 Hz each took 50-100 ms, longer than a cycle. With a young collection every
50,000 allocations the short-lived objects die young, and what is loaded at start is frozen
out of the collections altogether.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000


def tune_gc() -> None:
    """Call once start-up is done: what exists then is frozen (never scanned again)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)
