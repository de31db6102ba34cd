"""Memory the daemon freed, given back to the system once a minute.

glibc's malloc keeps what is freed inside its heap for later requests and returns to the
system only a free stretch at the heap's top. The store's arrays grow by reallocation and are
freed as their runs are packed, so free stretches pile up between live blocks: at 64 GPUs an
hour of history left 16 MiB free but resident (bench/memory.py: 72.7 MiB, 56.4 after a trim).
`malloc_trim(0)` returns every free page in the heaps; it takes half a millisecond here.
Elsewhere than glibc (musl) there is no such call, and nothing is done.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

TRIM_EVERY_S = 60.0


def malloc_trim() -> Callable[[], object] | None:
    """glibc's malloc_trim(0), or None where the C library has none."""
    try:
        function = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_size_t]
    function.restype = ctypes.c_int
    return lambda: function(0)


class HeapTrim:
    """A cycle output: after the first cycle a minute (by the daemon's clock), the trim."""

    def __init__(self, trim: Callable[[], object] | None, every: float = TRIM_EVERY_S) -> None:
        self._trim = trim
        self._every = every
        self._next: float | None = None

    def after_cycle(self, now: float, view: object) -> None:
        if self._trim is None:
            return
        if self._next is None:
            self._next = now + self._every  # start-up's garbage is not worth a trim
            return
        if now >= self._next:
            self._next = now + self._every
            self._trim()
