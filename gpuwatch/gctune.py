"""Interpreter settings for gpuwatch's long-running processes: the garbage collector's (the
daemon, the dashboard), and how soon a thread waiting for the interpreter gets it (the daemon).

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
import sys

YOUNG_THRESHOLD = 50_000
# The event loop gives up the interpreter at every wait for a socket and takes it back after;
# while a worker thread runs Python (the rules' evaluation, a /metrics page, NVML's bindings)
# each taking back waits up to Python's default 5 ms, and a request wakes the loop several
# times: a scrape that met the rules waited 20-25 ms before its handler ran. A millisecond
# costs a few more switches between busy threads, and only while two are busy.
SWITCH_INTERVAL_S = 0.001


def tune_gc() -> None:
    """Call once start-up is done: what exists then is frozen (never scanned again)."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, 10, 10)


def tune_switching() -> None:
    """The daemon's: a thread that waits for the interpreter gets it within SWITCH_INTERVAL_S."""
    sys.setswitchinterval(SWITCH_INTERVAL_S)
