"""Injected time: the daemon core never reads the system clock or sleeps on its own."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Awaitable
from pathlib import Path
from typing import Protocol, TypeVar

from gpuwatch.compat import timeout

T = TypeVar("T")


class Clock(Protocol):
    """Wall time in seconds since the epoch, and waits measured in that same time."""

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...

    async def wait_for(self, aw: Awaitable[T], timeout: float) -> T: ...

    def block(self, seconds: float) -> None:
        """Block the calling (worker) thread for `seconds` of this clock's time."""
        ...

    def block_until(self, event: threading.Event, seconds: float) -> bool:
        """Block the calling thread until `event` is set or `seconds` of this clock's time
        pass; whether the event was set."""
        ...


async def within(aw: Awaitable[T], seconds: float) -> T:
    """`aw`, or TimeoutError after `seconds` (real time). asyncio.wait_for as Python 3.12 has
    it: 3.11's loses a cancellation that comes as the awaited finishes (CPython gh-86296), and
    a sampling loop cancelled at a tick ran on after its daemon stopped, until the stop timed
    out."""
    async with timeout(seconds):
        return await aw


async def wait_event(clock: Clock, event: asyncio.Event, seconds: float | None) -> bool:
    """Wait for `event`, at most `seconds` of the clock's time (None: no limit). True when
    the event was set, False when the time ran out."""
    if seconds is None:
        await event.wait()
        return True
    try:
        await clock.wait_for(event.wait(), max(seconds, 0.0))
    except TimeoutError:
        return False
    return True


class SystemClock:
    """Real time."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds))

    async def wait_for(self, aw: Awaitable[T], timeout: float) -> T:
        return await within(aw, timeout)

    def block(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds))

    def block_until(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))


class ScaledClock:
    """Time that runs `speed` times faster than real time, starting at `start` (default: now).

    Simulated scenarios and tests use it to play minutes of a scenario in seconds; every
    duration the daemon waits (intervals, NVML deadlines) shrinks by the same factor.
    """

    def __init__(self, speed: float, start: float | None = None) -> None:
        if speed <= 0:
            raise ValueError("speed must be positive")
        self.speed = speed
        self._origin_real = time.monotonic()
        self._origin = time.time() if start is None else start

    def now(self) -> float:
        return self._origin + (time.monotonic() - self._origin_real) * self.speed

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(max(0.0, seconds) / self.speed)

    async def wait_for(self, aw: Awaitable[T], timeout: float) -> T:
        return await within(aw, timeout / self.speed)

    def block(self, seconds: float) -> None:
        time.sleep(max(0.0, seconds) / self.speed)

    def block_until(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds) / self.speed)


class ManualClock:
    """Time that moves only when a test advances it. Blocking waits return once it has."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._cond = threading.Condition()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        with self._cond:
            self._now += seconds
            self._cond.notify_all()

    async def sleep(self, seconds: float) -> None:
        deadline = self._now + seconds
        while self._now < deadline:  # noqa: ASYNC110 (time moves only when a test advances it)
            await asyncio.sleep(0.001)

    async def wait_for(self, aw: Awaitable[T], timeout: float) -> T:
        task = asyncio.ensure_future(aw)
        deadline = self._now + timeout
        while not task.done():
            if self._now >= deadline:
                task.cancel()
                raise TimeoutError
            await asyncio.sleep(0.001)
        return task.result()

    def block(self, seconds: float) -> None:
        deadline = self._now + seconds
        with self._cond:
            while self._now < deadline:
                self._cond.wait(0.05)

    def block_until(self, event: threading.Event, seconds: float) -> bool:
        deadline = self._now + seconds
        while not event.wait(0.005):  # time moves only when a test advances it
            if self._now >= deadline:
                return False
        return True


SIM_CLOCK_FILE = "sim-clock.json"


def sim_clock(speed: float, state_dir: str | None) -> ScaledClock:
    """Scaled time that carries on across restarts of a simulated daemon on one state directory:
    a restarted daemon finds its journal, alerts and outbox in its own past, as on a real node.
    The epoch (the real time the simulation began) is kept in the state directory."""
    if state_dir is None:
        return ScaledClock(speed)
    path = Path(state_dir) / SIM_CLOCK_FILE
    wall = time.time()
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        epoch = float(saved["epoch"]) if float(saved["speed"]) == speed else wall
    except (OSError, ValueError, KeyError, TypeError):
        epoch = wall
    if epoch == wall:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps({"epoch": wall, "speed": speed}), encoding="utf-8")
    return ScaledClock(speed, start=epoch + (wall - epoch) * speed)
