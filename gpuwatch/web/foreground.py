"""Work a waiting client needs goes before work that can wait.

The /metrics page is written, and the rules are evaluated, each in a worker thread, and Python
runs one thread at a time: a scrape that met an evaluation shared the interpreter with it and
took two to four times as long (at 64 GPUs, 30-47 ms against 12). The page's writer says it is
serving while it writes; the rules step aside while it does, between two rules and every few
hundred series they read, each evaluation for at most a bound of its own, so a client that
asks without end holds no evaluation (and the cycle that awaits it) back by more than that."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

# Wait while a client is served, for at most the seconds given; the seconds waited.
StepAsideFn = Callable[[float], float]
# Held while a client waits on the work inside (Foreground.serving, or nullcontext).
Serving = Callable[[], AbstractContextManager[None]]


class Foreground:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._serving = 0
        self._idle = threading.Event()
        self._idle.set()

    @property
    def busy(self) -> bool:
        return not self._idle.is_set()

    @contextmanager
    def serving(self) -> Iterator[None]:
        """Held while a client waits on the work inside; nests, and may span an await."""
        with self._lock:
            self._serving += 1
            self._idle.clear()
        try:
            yield
        finally:
            with self._lock:
                self._serving -= 1
                if self._serving == 0:
                    self._idle.set()

    def step_aside(self, at_most: float) -> float:
        """Wait until nothing is served, for at most `at_most` seconds; the seconds waited
        (none when nothing was)."""
        if at_most <= 0 or self._idle.is_set():
            return 0.0
        started = time.perf_counter()
        self._idle.wait(at_most)
        return time.perf_counter() - started


class StepAside:
    """An evaluation's share of stepping aside: `at_most` seconds in all from each `renew`,
    then no more; `waited` counts what it waited since."""

    def __init__(self, step_aside: StepAsideFn, at_most: float) -> None:
        self._step_aside = step_aside
        self._at_most = at_most
        self.left = at_most
        self.waited = 0.0

    def renew(self, at_most: float | None = None) -> None:
        """A new evaluation's share: the one given at construction, unless `at_most` says."""
        self.left = self._at_most if at_most is None else at_most
        self.waited = 0.0

    def __call__(self) -> float:
        if self.left <= 0:
            return 0.0
        waited = self._step_aside(self.left)
        self.left -= waited
        self.waited += waited
        return waited


def never(at_most: float) -> float:
    """A step_aside for what serves no client: it never waits."""
    return 0.0
